"""Timeouts and connection caps: their defaults, in one place (the addons' options and
`egress-proxy run`'s flags both read them; no mitmproxy import, so `check` starts fast)."""

DEFAULTS = {
    "egress_connect_timeout": 10,
    "egress_read_timeout": 120,
    "egress_header_timeout": 30,
    "egress_max_connections": 4096,
    "egress_max_connections_per_client": 256,
    "egress_max_header_bytes": 65536,
    "egress_max_connections_per_environment": 1024,
    # Applied as mitmproxy's own `tcp_timeout` (0: ten years, as mitmproxy would close every
    # connection at once on 0).
    "egress_idle_timeout": 180,
}
NO_IDLE_TIMEOUT = 10 * 365 * 86400
