"""The DNS listener: wire format, policy verdicts, the address cache and answer memo,
forwarding, and the UDP socket on the event loop."""
