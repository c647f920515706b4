"""Operations: every Prometheus metric, the metrics/health listener, and the audit log."""
