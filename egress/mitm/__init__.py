"""mitmproxy itself: the master that runs the addon chain, the event cache, worker
processes, the answers given in place of a destination's, and `patches/` (every change
made to mitmproxy internals)."""
