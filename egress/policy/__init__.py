"""The policy core: the spec, its YAML and secret references, domain and address
classification, and the decisions made from them. Plain data in, decisions out: no
mitmproxy and no I/O here."""
