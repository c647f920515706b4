"""What a tunnel's first bytes are: TLS, HTTP, a TLS handshake the proxy cannot read, or other TCP.

Pure function, no I/O. The guard asks this before anything else is stacked on a
tunnel (a CONNECT tunnel, or a redirected connection in transparent mode), because
the answer decides which checks apply: the ClientHello's server_name (TLS), each
request's Host (HTTP), or nothing but the already checked address (other TCP).
mitmproxy's own guess (`addons/next_layer.py`) is built for debugging, not for a
policy boundary, and it can be got past three ways, each making
the upstream read TLS or HTTP that the proxy had relayed as unchecked raw TCP:

- a handshake record with version bytes 3.4-3.255: OpenSSL, BoringSSL and Go accept
  any minor version on the first record, mitmproxy's check (3.0-3.3) does not, so
  a ClientHello naming another host was relayed, and an entry with a `transform`
  was reached with the client's own TLS, around interception;
- an SSLv2-compatible ClientHello, which OpenSSL servers still accept (and which
  carries no server_name at all);
- a warning alert before the ClientHello: Go's crypto/tls (Caddy, Traefik, many
  CDN front ends) and BoringSSL drop it and read the ClientHello behind it;
- an HTTP request whose first segment is shorter than three bytes (`G`, then
  `ET / HTTP/1.1 ... Host: other.test`), or that starts with a blank line
  (RFC 9112 §2.2 lets servers skip it), so the Host header was never checked.

The rules here are therefore "when in doubt, the checked path": any handshake
record that is not exactly what mitmproxy's TLS layer reads, and any other TLS
record type first, is `UNCHECKABLE` (refused), so is a PROXY protocol v2 header (servers that take one read TLS after
it), and a first line that could still become a request line is waited for. A
text line of the PROXY protocol v1 goes to the HTTP layer, which refuses it.
"""

from __future__ import annotations

import enum
import re

# One definition with mitmproxy's `net.tls.starts_like_tls_record`: a record it would
# not stack its TLS layers on must never be called TLS here (tested to agree).
_TLS_VERSION_MINORS = range(0x00, 0x04)
_HANDSHAKE = 0x16
# TLS content types (change_cipher_spec, alert, handshake, application_data, heartbeat).
_TLS_CONTENT_TYPES = range(0x14, 0x19)
_SSL2_CLIENT_HELLO = 0x01
_PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"  # haproxy's PROXY protocol, version 2
# A request line could still be arriving: optional blank lines, a method token, and
# the rest of a line of visible text. Such a start waits for its line feed.
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
_PARTIAL_REQUEST_LINE = re.compile(rb"[\r\n]*" + _TOKEN + rb"*(?:[ \t][\t\x20-\x7e\x80-\xff]*)?\r?")
_REQUEST_LINE = re.compile(rb"[\r\n]*" + _TOKEN + rb"+[ \t]+[^\s]")
_HTTP_VERSION = re.compile(rb"[ \t]HTTP/", re.IGNORECASE)
# RFC 4253 §4.2: "SSH-protoversion-softwareversion"; digits and a dot, which no
# HTTP server takes for a method.
_SSH_BANNER = re.compile(rb"SSH-[0-9]+\.[0-9]+-")
# A first line longer than this without its line feed is handed to the HTTP layer,
# whose own head limits refuse it.
MAX_FIRST_LINE = 8192


class Start(enum.Enum):
    WAIT = "wait"  # too short to tell
    TLS = "tls"  # a TLS handshake record, as mitmproxy's TLS layer reads it
    UNCHECKABLE = "uncheckable"  # TLS (or a preamble before it) a server accepts but the proxy cannot check
    HTTP = "http"  # an HTTP/1 request (or something only the HTTP layer may answer)
    OTHER = "other"  # anything else: raw TCP, to the checked address at most


def classify(data: bytes) -> Start:
    """Classify the first bytes a client sent into a tunnel."""
    if not data:
        return Start.WAIT
    if data[0] == _HANDSHAKE:
        if len(data) < 3:
            return Start.WAIT if data[1:2] in (b"", b"\x03") else Start.UNCHECKABLE
        return Start.TLS if data[1] == 0x03 and data[2] in _TLS_VERSION_MINORS else Start.UNCHECKABLE
    if data[0] in _TLS_CONTENT_TYPES:
        # Another record type first. Go's crypto/tls (and BoringSSL) drop warning alerts
        # before the handshake, and Go reads any record whose version is below 0x1000:
        # a ClientHello behind such a record would reach the server unread.
        if len(data) < 2:
            return Start.WAIT
        return Start.UNCHECKABLE if data[1] < 0x10 else Start.OTHER
    if data[0] & 0x80:
        # SSLv2 record header (two length bytes, high bit set) + msg_type CLIENT-HELLO,
        # the shape OpenSSL's record layer accepts as a first record.
        if len(data) < 3:
            return Start.WAIT
        return Start.UNCHECKABLE if data[2] == _SSL2_CLIENT_HELLO else Start.OTHER
    if data[:12] == _PROXY_V2_SIGNATURE[: len(data)]:
        return Start.WAIT if len(data) < 12 else Start.UNCHECKABLE
    line, newline, _ = data.lstrip(b"\r\n").partition(b"\n")
    if not newline and len(data) < MAX_FIRST_LINE and _PARTIAL_REQUEST_LINE.fullmatch(data):
        return Start.WAIT
    if not newline and len(data) >= MAX_FIRST_LINE:
        return Start.HTTP
    if _HTTP_VERSION.search(line):
        return Start.HTTP
    if _REQUEST_LINE.match(line) and not _SSH_BANNER.match(line):
        return Start.HTTP
    return Start.OTHER
