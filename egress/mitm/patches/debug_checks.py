"""mitmproxy's debug-only type checks of every request and response, left out.

`mitmproxy.http.MessageData` (the data of every Request and Response) defines, under
`if __debug__:`, a `__post_init__` that walks each field's annotation through
`utils.typecheck.check_option_type`: about 130 µs per request and response pair
here, against 14 µs for building them without it, and the largest single function
in the intercepted path's profile (`check_option_type`, 5.8 % of busy samples,
docs/benchmarks.md). mitmproxy runs without it under `python -O`; `-O` would also
strip every `assert`, so the proxy keeps them and replaces only this check. The values
come from mitmproxy's own parsers and from `egress.mitm.refusals` (through
`Response.make`, which builds the right types), so nothing here relied on the check.
"""

from __future__ import annotations

from mitmproxy import http

_installed = False


def skip_message_type_checks() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    # The dataclass __init__ calls `self.__post_init__()`: it must stay defined.
    http.MessageData.__post_init__ = _no_check  # type: ignore[method-assign]


def _no_check(self: http.MessageData) -> None:
    return None
