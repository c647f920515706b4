"""The `egress-proxy` command line."""
