"""One JSON object per line on stderr: the dispatcher's only log channel.

stdout belongs to the decision the runtime reads, so nothing else may go
there. Callers pass only fields that are safe to show: never header values
or URLs' paths and queries (webhook URLs often embed their secret in the path).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

LogSink = Callable[[dict[str, Any]], None]


def log_to_stderr(record: dict[str, Any]) -> None:
    try:
        # ASCII-only JSON: the line survives any stderr encoding and any
        # log shipper; non-ASCII text stays readable once parsed.
        sys.stderr.write(json.dumps(record, default=str) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        # A closed stderr must not turn a hook failure into a dispatcher crash.
        pass
