"""Every patch of mitmproxy internals, in one place."""
