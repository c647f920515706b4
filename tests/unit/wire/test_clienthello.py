"""The raw server_name parser (egress.wire.clienthello), table-driven: real ClientHellos from
OpenSSL, handcrafted ones with odd server names (SSRF-corpus style), and malformed bytes."""

from __future__ import annotations

import ssl
import struct

import pytest
from tls_hello import hello_body, records, sni_extension
from tls_hello import vec as _vec

from egress.wire.clienthello import (
    INVALID,
    Hello,
    HelloError,
    parse_client_hello,
    parse_records,
)


def openssl_hello(server_hostname: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


# -- real clients ----------------------------------------------------------------------


def test_openssl_hello_with_sni():
    assert parse_records(openssl_hello("Allowed.Test")) == Hello("allowed.test")


def test_openssl_hello_for_an_ip_has_no_sni():
    assert parse_records(openssl_hello("198.18.0.10")) == Hello(None)


def test_incomplete_hello_waits_for_more():
    data = openssl_hello("allowed.test")
    for cut in (0, 3, 5, 9, len(data) - 1):
        assert parse_records(data[:cut]) is None


def test_hello_split_over_records():
    body = hello_body(sni_extension(b"allowed.test"))
    for split in (1, 4, 40, len(body)):
        assert parse_records(records(body, split)) == Hello("allowed.test")


# -- server names ----------------------------------------------------------------------------

NAMES = [
    (b"allowed.test", "allowed.test"),
    (b"ALLOWED.test", "allowed.test"),
    (b"allowed.test.", "allowed.test"),  # trailing dot: the same host
    (b"xn--bcher-kva.example", "xn--bcher-kva.example"),  # punycode is how IDNs travel
    (b"_svc.allowed.test", "_svc.allowed.test"),
    (b"198.18.0.10", "198.18.0.10"),  # not allowed by RFC 6066, but names that address only
    (b"a" * 63 + b".test", "a" * 63 + ".test"),
    # SSRF corpus: whatever a URL parser might read as another host is no host name.
    (b"allowed.test@127.0.0.1", INVALID),
    (b"127.0.0.1:80;allowed.test:80", INVALID),
    (b"allowed.test:443", INVALID),
    (b"allowed%2Etest", INVALID),
    (b"%61llowed.test", INVALID),
    (b"allowed.test%00.evil.test", INVALID),
    (b"allowed.test\x00.evil.test", INVALID),
    (b"allowed.test\x00", INVALID),
    (b" allowed.test", INVALID),
    (b"allowed.test ", INVALID),
    (b"allowed.test\r\nHost: evil", INVALID),
    (b"allowed.test/evil", INVALID),
    (b"allowed.test\\@evil", INVALID),
    (b"allowed.test#@evil.test", INVALID),
    (b"[::1]", INVALID),
    (b"::1", INVALID),
    ("bücher.example".encode(), INVALID),  # raw UTF-8: IDNs must be sent as A-labels
    (b"\xff\xfe", INVALID),
    (b"allowed..test", INVALID),
    (b".allowed.test", INVALID),
    (b"allowed.test..", INVALID),
    (b"-allowed.test", INVALID),
    (b"a" * 64 + b".test", INVALID),  # label over 63
    ((b"a" * 60 + b".") * 5, INVALID),  # name over 253
    (b"x" * 16000, INVALID),
    (b"*.allowed.test", INVALID),
    (b"", INVALID),  # empty name
]


@pytest.mark.parametrize("raw, expected", NAMES)
def test_server_name(raw, expected):
    assert parse_records(records(hello_body(sni_extension(raw)))) == Hello(expected)


@pytest.mark.parametrize(
    "extension",
    [
        sni_extension(b"allowed.test", b"allowed.test"),  # two names
        sni_extension(b"allowed.test", b"evil.test"),
        sni_extension(b"allowed.test", name_type=1),  # not host_name
        sni_extension(b"allowed.test", name_type=255),
        struct.pack("!H", 0) + _vec(b"", 2),  # empty extension data (what servers send)
        struct.pack("!H", 0) + _vec(_vec(b"", 2), 2),  # empty name list
        struct.pack("!H", 0) + _vec(_vec(b"\x00\x00\x20allowed.test", 2), 2),  # name length too long
        struct.pack("!H", 0) + _vec(_vec(b"\x00\x00\x05allowed.test", 2), 2),  # ...too short
        struct.pack("!H", 0) + _vec(b"\x00\x10\x00\x00\x0callowed.test", 2),  # list length wrong
        struct.pack("!H", 0) + _vec(sni_extension(b"allowed.test")[4:] + b"\x00", 2),  # trailing byte
        struct.pack("!H", 0) + _vec(b"\x00", 2),  # one byte
    ],
)
def test_malformed_server_name_extension_is_invalid(extension):
    assert parse_records(records(hello_body(extension))) == Hello(INVALID)


def test_no_extension_means_no_sni():
    assert parse_records(records(hello_body())) == Hello(None)
    assert parse_records(records(hello_body(with_extensions=False))) == Hello(None)


# -- structure -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        records(hello_body(sni_extension(b"allowed.test"), sni_extension(b"allowed.test"))),  # duplicate ext
        records(hello_body(sni_extension(b"a.test"), sni_extension(b"b.test"))),
        records(hello_body(sni_extension(b"allowed.test")) + b"\x00"),  # data after the extensions
        records(hello_body(sni_extension(b"allowed.test"))[:-1]),  # extension block truncated
        b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",  # ServerHello, not ClientHello
        b"\x17\x03\x03\x00\x05hello",  # application data record
        b"\x16\x03\x01\x00\x00",  # empty record
        b"\x16\x03\x04" + records(hello_body(sni_extension(b"allowed.test")))[3:],  # record version mitmproxy does not read
        (lambda d: d[:15] + b"\x16\x03\x05" + d[18:])(records(hello_body(sni_extension(b"a.test")), 10)),  # ...in any record
        b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",  # ClientHello of 16 MiB announced
        b"\x16\x03\x01\x00\x08\x01\x00\x00\x02\x03\x03\x00\x00",  # data after the message in the record
        records(b"\x03\x03" + b"\x00" * 10),  # truncated body
        records(b"\x03\x03" + b"\x00" * 32 + b"\x21" + b"\x00" * 33 + b"\x00\x02\x13\x01\x01\x00"),  # session id > 32
        records(b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x00" + b"\x01\x00"),  # no cipher suites
        records(b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x03\x13\x01\x01" + b"\x01\x00"),  # odd suites
        records(b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x00"),  # no compression
    ],
)
def test_malformed_hello_raises(data):
    with pytest.raises(HelloError):
        parse_records(data)


def test_second_record_of_another_type_raises():
    body = hello_body(sni_extension(b"allowed.test"))
    data = records(body, 10)
    broken = data[: 5 + 10] + b"\x17" + data[5 + 10 + 1 :]
    with pytest.raises(HelloError):
        parse_records(broken)


def test_parse_body_directly():
    assert parse_client_hello(hello_body(sni_extension(b"allowed.test"))) == Hello("allowed.test")
