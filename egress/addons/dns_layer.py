"""The DNS listener's protocol layer: mitmproxy's `DNSLayer`, made to answer every query itself.

mitmproxy 12.3.1's `DNSLayer` (proxy/layers/dns.py) is built to forward: with no
`dns_request` hook answering it opens a connection to `flow.server_conn.address`,
and a packet it cannot parse either closes the "connection" (struct.error) or, for
other errors such as an invalid punycode label (`xn--zz` raises UnicodeError),
escapes the layer. This subclass changes three things, and nothing else:

- every datagram / TCP message is first offered to `answer_now` (see `install`),
  which answers what needs no I/O synchronously; the rest is handed to the
  `dns_request` hook, on one flow
  per client socket (no table of flows by message id, no uuid per query); one whose
  header is readable but the rest is not arrives as a question-less message marked
  unparsed (the policy answers FORMERR); one without a header is dropped. The
  listener keeps answering whatever arrives;
- it never opens an upstream connection: the hook answers, or marks the query to
  be dropped, or the client gets SERVFAIL. Forwarding (report mode) is done by the
  addon, which decides where to;
- the hook's answer is sent as the wire bytes it left in `flow.metadata`
  (egress/dns/wire.py builds them from the query's own bytes); otherwise
  `flow.response` is packed here, and one that cannot be packed (a name that does
  not survive mitmproxy's re-encoding) becomes SERVFAIL without a question instead
  of an exception. No `dns_response` hook: nothing of ours reads one.

`install()` makes mitmproxy's DNS server instances use this layer (they build their
top layer in `DnsInstance.make_top_layer`) and serve their UDP socket from the event
loop (egress/dns/udp.py). tests/e2e/test_dns.py sends the packets
that broke the stock layer and fails without it.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import dns
from mitmproxy.proxy import commands, events, layer, mode_servers
from mitmproxy.proxy.layers import dns as dns_layer
from mitmproxy.proxy.utils import expect

from egress.dns import udp as dns_udp

UNPARSED = "_egress_unparsed"  # attribute set on a message built from the header only
RAW = "_egress_raw"  # attribute: the message's bytes as received
DROP_KEY = "egress.dns.drop"  # flow.metadata: the hook decided not to answer
WIRE_KEY = "egress.dns.wire"  # flow.metadata: the answer, already in wire format
_HEADER = struct.Struct("!HHHHHH")
_LENGTH = struct.Struct("!H")
AnswerNow = Callable[[dns.DNSFlow], "bool | None"]
_answer_now: AnswerNow | None = None
_answer_datagram: dns_udp.AnswerDatagram | None = None


def header_only(data: bytes) -> dns.DNSMessage:
    """A question-less message carrying the header fields of `data`.

    Under 12 bytes there is no header: the message is marked a response (QR=1),
    which the policy drops (counted) instead of answering.
    """
    if len(data) < _HEADER.size:
        ident, flags = 0, 0x8000
    else:
        ident, flags, *_ = _HEADER.unpack_from(data)
    msg = dns.DNSMessage(
        id=ident,
        query=not flags & 0x8000,
        op_code=(flags >> 11) & 0xF,
        authoritative_answer=False,
        truncation=False,
        recursion_desired=bool(flags & 0x0100),
        recursion_available=False,
        reserved=0,
        response_code=0,
        questions=[],
        answers=[],
        authorities=[],
        additionals=[],
        timestamp=time.time(),
    )
    setattr(msg, UNPARSED, True)
    return msg


def parse(data: bytes) -> dns.DNSMessage:
    """mitmproxy's parser, but any failure gives the header-only message."""
    try:
        msg = dns.DNSMessage.unpack(data, timestamp=time.time())
    except Exception:  # struct.error, UnicodeError (punycode), ValueError, ...
        msg = header_only(data)
    setattr(msg, RAW, data)
    return msg


def servfail_without_question(request: dns.DNSMessage) -> bytes:
    flags = 0x8000 | (request.op_code & 0xF) << 11 | (0x0100 if request.recursion_desired else 0) | 2
    return _HEADER.pack(request.id, flags, 0, 0, 0, 0)


class FilteringDNSLayer(dns_layer.DNSLayer):
    @functools.cached_property
    def _flow(self) -> dns.DNSFlow:
        return dns.DNSFlow(self.context.client, self.context.server, live=True)

    def unpack_message(self, data: bytes, from_client: bool) -> list[dns.DNSMessage]:
        if not from_client:  # never happens: this layer opens no upstream connection
            return []
        if self.context.client.transport_protocol == "udp":
            return [parse(data)]
        # TCP: two-byte length prefix per message (RFC 1035 4.2.2). A zero length
        # cannot be resynchronised from: struct.error makes the base layer close.
        buf = self.req_buf
        buf.extend(data)
        msgs: list[dns.DNSMessage] = []
        offset = 0
        while len(buf) - offset >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buf, offset)
            if size == 0:
                raise struct.error("message length field cannot be zero")
            if len(buf) - offset - _LENGTH.size < size:
                break
            chunk = bytes(buf[offset + _LENGTH.size : offset + _LENGTH.size + size])
            offset += _LENGTH.size + size
            msgs.append(parse(chunk))
        del buf[:offset]
        return msgs

    @expect(events.DataReceived, events.ConnectionClosed)
    def state_query(self, event: events.Event) -> layer.CommandGenerator[None]:
        """The base layer's, without its per-message-id flow table (see handle_request)."""
        assert isinstance(event, events.ConnectionEvent)
        if isinstance(event, events.DataReceived):
            try:
                msgs = self.unpack_message(event.data, event.connection is self.context.client)
            except struct.error as exc:  # TCP framing that cannot be resynchronised
                yield commands.Log(f"{event.connection} sent an invalid DNS message: {exc}")
                yield commands.CloseConnection(event.connection)
                self._handle_event = self.state_done
                return
            for msg in msgs:
                yield from self.handle_request(self._flow, msg)
        else:
            self._handle_event = self.state_done
            self._flow.live = False

    def handle_request(self, flow: dns.DNSFlow, msg: dns.DNSMessage) -> layer.CommandGenerator[None]:
        # One flow per client socket, reset for each message: the base layer keys flows
        # by message id to match upstream answers, which never come here, and would keep
        # up to 65536 of them; and a new flow per query costs a uuid4 (10 % of the time
        # of a blocked query). The hook is blocking, so messages are handled one at a time.
        flow.request, flow.response, flow.error = msg, None, None
        flow.metadata.clear()
        # Queries decided without I/O are answered right here, in this datagram's own
        # event: the hook (an asyncio task, a HookCompleted event) only for the rest.
        # None: `answer_now` raised and failed closed (counted; SERVFAIL below).
        done = _answer_now(flow) if _answer_now is not None else False
        if done is False:
            yield dns_layer.DnsRequestHook(flow)
        if flow.metadata.get(DROP_KEY):
            return
        wire = flow.metadata.get(WIRE_KEY)
        if isinstance(wire, bytes):
            if flow.client_conn.transport_protocol == "tcp":
                wire = _LENGTH.pack(len(wire)) + wire
            yield commands.SendData(self.context.client, wire)
            return
        if flow.response is None:
            flow.response = msg.fail(dns.response_codes.SERVFAIL)
        try:
            packed = flow.response.packed
        except Exception:  # a name mitmproxy cannot re-encode
            packed = servfail_without_question(msg)
        if flow.client_conn.transport_protocol == "tcp":
            packed = _LENGTH.pack(len(packed)) + packed
        yield commands.SendData(self.context.client, packed)


def install(answer_now: AnswerNow | None = None, answer_datagram: dns_udp.AnswerDatagram | None = None) -> None:
    """Make every `dns@...` listener of this process use `FilteringDNSLayer`.

    `answer_now(flow)`: called for each query before the `dns_request` hook; True when
    it answered (or dropped) the query, False to let the hook finish it, None when it
    failed (closed: SERVFAIL). egress/addons/dns_filter.py `DnsFilter.answer_now`,
    wrapped by `failsafe.fail_closed_call`. `answer_datagram`: the UDP socket's fast
    path (egress/dns/udp.py), `DnsFilter.answer_datagram`.
    """
    global _answer_now, _answer_datagram
    _answer_now = answer_now
    _answer_datagram = answer_datagram
    mode_servers.DnsInstance.make_top_layer = lambda self, context: FilteringDNSLayer(context)  # type: ignore[method-assign]
    # The UDP socket on the event loop instead of mitmproxy_rs's thread (egress/dns/udp.py);
    # mitmproxy only closes it and lists its `sockets`, which UdpListener provides.
    mode_servers.DnsInstance.start_udp_based_server = _start_udp_listener  # type: ignore[method-assign,assignment]


def _start_udp_listener(self: mode_servers.DnsInstance, host: str, port: int) -> Any:
    return dns_udp.start_udp_listener(host, port, self.handle_stream, _answer_datagram)
