"""The whole egress policy chain as a mitmproxy script.

    mitmdump -s addons/egress.py --set egress_spec=examples/spec.yaml
    mitmweb  -s addons/egress.py --set egress_spec=examples/spec.yaml

Every `egress-proxy run` flag is an `egress_*` option (`--spec-dir` is
`egress_spec_dir`, `--metrics-listen` is `egress_metrics_listen`, ...); `--listen-*`
and `--mode` stay mitmproxy's own. Options that would weaken a guarantee
(`ssl_insecure`, `ignore_hosts`, `allow_hosts`, ...) are refused while this script
is loaded. `egress-proxy run` remains the supported way to run the proxy: it adds
worker processes and a leaner mitmproxy. Reloading this script (mitmproxy watches
it) re-runs only the script: the `egress` package stays imported as it was.
"""

from __future__ import annotations

import logging
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _import_egress():
    # mitmproxy puts this script's folder first on sys.path, where `import egress`
    # would find this very file instead of the package.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        import egress
    except ImportError:  # a source checkout, not installed: the package is beside addons/
        sys.path.append(os.path.dirname(_HERE))
        import egress
    return egress


_import_egress()

from egress.addons import chain, refuse  # noqa: E402  (after the path fix above)
from egress.mitm import patches  # noqa: E402


class ScriptMode:
    """While the script starts, a refused setting stops mitmproxy; once it runs, the old value stays."""

    def load(self, loader) -> None:
        refuse.mode.script = True

    def running(self) -> None:
        if refuse.mode.refused:  # logged already; mitmproxy's error check normally exits first
            raise SystemExit(1)
        refuse.mode.running = True


def _addons() -> list:
    try:
        patches.install_all()
    except patches.PatchError as exc:
        logging.getLogger("egress").error("egress: %s", exc)  # mitmproxy's error check exits 1
        refuse.mode.refused = True
        return [ScriptMode()]
    return [ScriptMode(), *chain()]


addons = _addons()
