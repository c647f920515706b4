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
}
# `--idle-timeout`: mitmproxy's own `tcp_timeout` (whose default, 600, mitmdump keeps).
IDLE_TIMEOUT = 180
