"""UpstreamTrust: extra trust anchors for verifying upstream servers (`egress_upstream_ca`).

mitmproxy's `ssl_verify_upstream_trusted_ca` replaces the trust store; adding a private
CA must not drop the public ones, so the option points it at certifi's roots plus the
operator's PEM, written into the confdir.
"""

from __future__ import annotations

import os
from pathlib import Path

from mitmproxy import ctx

from egress.addons.refuse import refuse


class BundleError(ValueError):
    pass


def write_bundle(confdir: Path, extra: str, name: str = "--upstream-ca") -> str:
    """certifi's roots plus `extra` (a PEM file), as one file in `confdir`; BundleError naming `name`."""
    import certifi

    try:
        extra_pem = Path(extra).read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise BundleError(f"{name} {extra}: not a PEM file (not ASCII text)") from None
    except OSError as exc:
        raise BundleError(f"{name} {extra}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if "-----BEGIN CERTIFICATE-----" not in extra_pem:
        raise BundleError(f"{name} {extra}: no PEM certificate in file")
    bundle = confdir / "egress-upstream-ca.pem"
    # Written aside and renamed: with --workers, a worker starting later rewrites the
    # file while another may be reading it.
    partial = confdir / f".egress-upstream-ca.pem.{os.getpid()}"
    partial.write_text(Path(certifi.where()).read_text(encoding="ascii") + "\n" + extra_pem, encoding="ascii")
    os.replace(partial, bundle)
    return str(bundle)


class UpstreamTrust:
    def load(self, loader) -> None:
        loader.add_option(
            "egress_upstream_ca", str | None, None,
            "Extra trust anchors (PEM) for verifying upstream servers, beside the public ones.",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if "egress_upstream_ca" not in updated or not ctx.options.egress_upstream_ca:
            return
        confdir = Path(os.path.expanduser(ctx.options.confdir))
        try:
            bundle = write_bundle(confdir, ctx.options.egress_upstream_ca, "egress_upstream_ca")
        except BundleError as exc:
            return refuse(str(exc))
        if ctx.options.ssl_verify_upstream_trusted_ca != bundle:
            ctx.options.update(ssl_verify_upstream_trusted_ca=bundle)
