"""egress: an egress proxy and hook dispatcher for AI-agent sandboxes."""

__version__ = "0.1.0"
