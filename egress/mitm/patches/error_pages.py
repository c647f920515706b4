"""The answers mitmproxy writes itself, in the proxy's own shape and without its version.

mitmproxy answers what it refuses on its own (an unparsable request line, both
Transfer-Encoding and Content-Length, an upstream it could not connect to for a
plain-HTTP or intercepted request) with an HTML page and `Server: mitmproxy 12.3.1`.
Found trying the proxy as a sandbox would: the exact version is a gift to whoever
probes the proxy for known bugs, a connect failure's page showed the checked address
(`Connect call failed ('198.18.0.16', 9)`), and none of these answers had the JSON
body or the `X-Egress-Error` header the README promises for failed upstreams.

Deliberate patches of mitmproxy 12.3.1, installed once:
- HTTP/1 (`_http1.make_error_response`): `refusals.mitmproxy_error`, JSON. A failed
  connect reported by `egress.addons.tunnel` (`refusals.connect_failure_message`)
  becomes exactly the answer a CONNECT gets (`502`/`504`, `X-Egress-Error`, body
  `upstream_failed`).
- HTTP/2: mitmproxy writes that answer's headers inline; only its `server` value is
  replaced (the body stays mitmproxy's HTML page, which says what failed).
"""

from __future__ import annotations

from types import SimpleNamespace

from mitmproxy.proxy.layers.http import _http1, _http2

from egress.mitm import refusals

SERVER = "egress"
_installed = False


def install_error_pages() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _http1.make_error_response = refusals.mitmproxy_error  # type: ignore[assignment]
    _http2.version = SimpleNamespace(MITMPROXY=SERVER)  # type: ignore[assignment]
