"""What a tunnel's first bytes are (egress.wire.tunnel_start), table-driven: real first flights
(OpenSSL ClientHellos, HTTP request lines, an SSH banner) and the shapes of the second
red-team pass that mitmproxy's own guess relayed as unchecked raw TCP."""

from __future__ import annotations

import ssl

import pytest
from mitmproxy.net.tls import starts_like_tls_record

from egress.wire.tunnel_start import MAX_FIRST_LINE, Start, classify


def openssl_hello() -> bytes:
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname="allowed.test")
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


HELLO = openssl_hello()
# An SSLv2-compatible ClientHello (RFC 5246 appendix E.2) offering TLS 1.2: no extensions, so no SNI.
SSL2_HELLO = b"\x80\x2e\x01\x03\x03\x00\x15\x00\x00\x00\x10" + b"\x00\xc0\x2f" * 7 + b"\x11" * 16
PROXY_V2 = b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + b"\x00" * 12

ROWS = [
    # TLS as mitmproxy's TLS layer reads it
    (HELLO, Start.TLS),
    (HELLO[:3], Start.TLS),
    (b"\x16\x03\x00\x00\x05", Start.TLS),
    # could still become one
    (b"", Start.WAIT),
    (b"\x16", Start.WAIT),
    (b"\x16\x03", Start.WAIT),
    # handshake records servers accept but mitmproxy's TLS layer does not: refused
    (b"\x16\x03\x04" + HELLO[3:], Start.UNCHECKABLE),
    (b"\x16\x03\x05" + HELLO[3:], Start.UNCHECKABLE),
    (b"\x16\x03\xff" + HELLO[3:], Start.UNCHECKABLE),
    (b"\x16\x02\x00", Start.UNCHECKABLE),
    (b"\x16\x00", Start.UNCHECKABLE),
    (b"\x15\x03\x01\x00\x02\x01\x70" + HELLO, Start.UNCHECKABLE),  # warning alert first: Go drops it
    (b"\x15\x00\x00\x00\x02\x01\x70" + HELLO, Start.UNCHECKABLE),  # Go: any record version below 0x1000
    (b"\x14\x03\x03\x00\x01\x01", Start.UNCHECKABLE),  # change_cipher_spec
    (b"\x17\x03\x03\x00\x00", Start.UNCHECKABLE),  # application_data
    (b"\x18\x03\x01\x00\x03\x01\x00\x00", Start.UNCHECKABLE),  # heartbeat
    (b"\x15", Start.WAIT),
    (b"\x15\x10\x00", Start.OTHER),
    (b"\x13\x03\x01", Start.OTHER),
    (b"\x19\x03\x01", Start.OTHER),
    (SSL2_HELLO, Start.UNCHECKABLE),
    (SSL2_HELLO[:2], Start.WAIT),
    (PROXY_V2, Start.UNCHECKABLE),
    (PROXY_V2[:7], Start.WAIT),
    # HTTP: whole request lines, and starts that are waited for until their line feed
    (b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n", Start.HTTP),
    (b"get /x HTTP/1.1\r\n", Start.HTTP),
    (b"\r\nGET /x HTTP/1.1\r\n", Start.HTTP),  # RFC 9112 §2.2: servers skip a leading blank line
    (b"\n\n\nGET /x HTTP/1.1\n", Start.HTTP),
    (b"_X /x HTTP/1.1\r\n", Start.HTTP),  # nginx takes `_` and `-` in methods
    (b"M-SEARCH * HTTP/1.1\r\n", Start.HTTP),
    (b"GET\t/x\tHTTP/1.1\r\n", Start.HTTP),
    (b"GET /x\r\n", Start.HTTP),  # HTTP/0.9 shape: the HTTP layer answers it
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Start.HTTP),
    (b"PROXY TCP4 198.18.0.1 198.18.0.2 1 443\r\n", Start.HTTP),  # PROXY v1: refused by the HTTP layer
    (b"SSH-2.0-x /x HTTP/1.1\r\n", Start.HTTP),
    (b"G", Start.WAIT),
    (b"GE", Start.WAIT),
    (b"GET", Start.WAIT),
    (b"GET /x HTTP/1.1", Start.WAIT),
    (b"GET /x HTTP/1.1\r", Start.WAIT),
    (b"\r", Start.WAIT),
    (b"\r\n", Start.WAIT),
    (b"\r\n\r\nG", Start.WAIT),
    (b"G" * (MAX_FIRST_LINE - 1), Start.WAIT),
    (b"G" * MAX_FIRST_LINE, Start.HTTP),  # the HTTP layer's head limit refuses it
    # other TCP: relayed to the checked address only
    (b"SSH-2.0-OpenSSH_9.6\r\n", Start.OTHER),
    (b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n", Start.OTHER),
    (b"SSH-2.0-OpenSSH_9.2p1 Debian", Start.WAIT),
    (b"PING\r\n", Start.OTHER),
    (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", Start.OTHER),  # PostgreSQL SSLRequest
    (b"\x03\x00\x00\x13\x0e\xe0", Start.OTHER),  # RDP
    (b"\x05\x01\x00", Start.OTHER),  # SOCKS5
    (b"\x80\x01\x02", Start.OTHER),
    (b"G\x00", Start.OTHER),
    ("ÄÖ".encode(), Start.OTHER),
]


@pytest.mark.parametrize("data, expected", ROWS, ids=[repr(d[:24]) for d, _ in ROWS])
def test_classify(data, expected):
    assert classify(data) is expected


@pytest.mark.parametrize("second", range(256))
def test_tls_is_exactly_what_mitmproxy_reads_as_tls(second):
    """Every 3-byte start of a handshake record: TLS here iff mitmproxy's TLS layer takes it,
    otherwise refused, never relayed raw."""
    for third in range(256):
        data = bytes([0x16, second, third])
        expected = Start.TLS if starts_like_tls_record(data) else Start.UNCHECKABLE
        assert classify(data) is expected, data


def test_every_prefix_of_a_request_waits_never_relays():
    request = b"\r\nGET /x HTTP/1.1\r\nHost: other.test\r\n\r\n"
    line_end = request.index(b"\n", 2)
    for cut in range(1, line_end + 1):
        assert classify(request[:cut]) is Start.WAIT, request[:cut]
    for cut in range(line_end + 1, len(request) + 1):
        assert classify(request[:cut]) is Start.HTTP, request[:cut]


@pytest.mark.parametrize("content_type", range(0x14, 0x19))
def test_every_tls_record_type_first_is_never_relayed_raw(content_type):
    """Whatever version bytes follow (Go reads versions below 0x1000 as TLS), a TLS record first is
    either the handshake mitmproxy reads or refused."""
    for second in range(0x10):
        for third in range(256):
            assert classify(bytes([content_type, second, third])) in (Start.TLS, Start.UNCHECKABLE)
