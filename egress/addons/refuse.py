"""How an addon refuses a setting it cannot apply.

`egress-proxy run` sets every option before anything runs and turns an OptionsError
into one line and exit status 2. Loaded as a mitmproxy script (addons/egress.py),
an OptionsError raised while the script starts up would end in a traceback and a
proxy running without the setting, so there the problem is logged as an error, which
mitmproxy's start-up error check turns into exit status 1 (and, should it not, the
script's `running` hook exits). Once running (an option changed in mitmweb or the
console), OptionsError makes mitmproxy keep the old value.
"""

from __future__ import annotations

import logging

from mitmproxy import exceptions

logger = logging.getLogger("egress")


class _Mode:
    script = False  # loaded by addons/egress.py
    running = False
    refused = False  # a setting was refused while the script started: it must not run


mode = _Mode()


def refuse(message: str) -> None:
    """Refuse the setting being configured; returns only where the caller must fail closed."""
    if mode.script and not mode.running:
        logger.error("egress: %s", message)
        mode.refused = True
        return
    raise exceptions.OptionsError(message)
