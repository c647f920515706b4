"""Credentials the proxy holds and puts on the wire: token sources (OAuth2, Google
service accounts, GitHub Apps, AWS keys), their fetch/refresh lifecycle, placement
(`${credential:}`, query, placeholder replacement), SigV4 re-signing and echo scrubbing.
The core is free of mitmproxy; `egress.addons.credentials` wires it in."""
