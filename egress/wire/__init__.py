"""Pure checks on the bytes a client sends: the TLS ClientHello, a tunnel's first bytes,
header fields, request targets, protocol switches and proxy credentials."""
