"""What the end-to-end tests run on: the lab (network namespaces, test hosts, the real
proxy), real clients, and the upstream and token servers they talk to."""
