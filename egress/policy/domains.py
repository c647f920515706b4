"""Host names and allowlist patterns: normalisation and most-specific matching.

Pure functions over strings; no I/O. A host is compared in one canonical form:
lower case, no trailing dot, IDN labels in punycode, IP literals in their
canonical text form (so `0x7f000001`, `127.1` and `2130706433` all become
`127.0.0.1`, exactly as a resolver would read them).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

# Matched with `fullmatch`: `$` would also match before a final newline, and let
# `a\n.example.test` (a DNS label holding a newline) pass as a host name.
_LABEL_TAIL = r"(?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_LABEL = re.compile(rf"[a-z0-9_]{_LABEL_TAIL}")
# A name already in canonical form whose last label starts with a letter: never an IPv4
# literal (inet_aton reads every part as a number), so `normalize_host` returns it as it
# is. Most names are (allowlist entries, Host headers): one match instead of the whole
# walk, about a quarter of a 100,000-entry spec's load time. Built from the same label
# pattern, so the shortcut cannot accept a label the full walk refuses.
_CANONICAL_NAME = re.compile(rf"(?:{_LABEL.pattern}\.)*[a-z]{_LABEL_TAIL}")
# UTS #46 deviation characters: IDNA2003 maps them (ß -> ss, ς -> σ) or drops them (ZWJ,
# ZWNJ); IDNA2008 keeps them, so one written name would denote two domains.
_IDNA_DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")
# Loopback names that must never reach a resolver (RFC 6761 §6.3).
_LOOPBACK_NAMES = ("localhost",)


class HostError(ValueError):
    """A host or pattern that cannot be used; the message says why."""


def parse_ipv4_literal(text: str) -> ipaddress.IPv4Address | None:
    """Read `text` the way inet_aton(3) does, or return None if it is not an IPv4 literal.

    glibc's resolver accepts `127.1`, `2130706433`, `0x7f.1` and `0177.0.0.1`;
    a proxy that only recognised dotted quads would pass them to the resolver
    and be surprised by the answer.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        # int() also reads a sign, spaces and underscores (`0x-9`, `0x_7`): inet_aton reads
        # none of them, and a negative part would make IPv4Address raise.
        if not part.isalnum():
            return None
        try:
            if part[:2].lower() == "0x":
                values.append(int(part[2:], 16) if len(part) > 2 else 0)
            elif len(part) > 1 and part[0] == "0":
                values.append(int(part, 8))
            elif part.isdigit():
                values.append(int(part, 10))
            else:
                return None
        except ValueError:
            return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for v in head:
        number = number << 8 | v
    number = number << 8 * (4 - len(head)) | last
    return ipaddress.IPv4Address(number)


def parse_ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a host string denotes, or None when it is a name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            address = ipaddress.IPv6Address(text.split("%", 1)[0])
        except ValueError:
            return None
        return address
    return parse_ipv4_literal(text.rstrip(".") if text.count(".") == 4 else text)


def ip_text(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Canonical text of an address, the same on every Python version.

    (3.13 started writing IPv4-mapped addresses as `::ffff:127.0.0.1`; 3.12 wrote
    `::ffff:7f00:1`. Logs, deny bodies and allowlist keys must not depend on that.)
    """
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def normalize_host(raw: str) -> str:
    """Canonical form of a requested host name or IP literal; raises HostError."""
    if isinstance(raw, str) and len(raw) <= 253 and _CANONICAL_NAME.fullmatch(raw):
        return raw
    return _normalize_in_full(raw)


def _normalize_in_full(raw: str) -> str:
    """`normalize_host` without the shortcut for already-canonical names (tests compare them)."""
    if not isinstance(raw, str) or not raw.strip():
        raise HostError("empty host")
    ip = parse_ip_literal(raw)
    if ip is not None:
        return ip_text(ip)
    # One trailing dot marks a fully qualified name; `a.b..` has an empty label.
    host = raw.strip().removesuffix(".")
    if host.startswith("[") or ":" in host:
        raise HostError("malformed IP literal")
    if not host.isascii():
        if deviations := sorted(set(host) & _IDNA_DEVIATIONS):
            # Python's codec is IDNA2003: `straße.de` becomes `strasse.de`, another domain
            # than the `xn--strae-oqa.de` clients (IDNA2008 / UTS #46) look up and send.
            shown = ", ".join(f"U+{ord(c):04X}" for c in deviations)
            raise HostError(
                f"invalid internationalised name ({shown} is read differently by IDNA2003 and IDNA2008;"
                " write the name's xn-- form)"
            )
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            # The idna codec raises plain UnicodeError (no `.reason`) for empty labels.
            raise HostError(f"invalid internationalised name ({getattr(exc, 'reason', exc)})") from None
    host = host.lower()
    if len(host) > 253:
        raise HostError("name longer than 253 characters")
    for label in host.split("."):
        if not _LABEL.fullmatch(label):
            raise HostError(f"invalid label {label!r}" if label else "empty label")
    # `1.2.3.` or `0x7f\u30021` only read as an address once the dot is dropped or
    # IDNA has mapped the separator; the canonical form must not depend on a second pass.
    if (ip := parse_ipv4_literal(host)) is not None:
        return str(ip)
    return host


def is_loopback_name(host: str) -> bool:
    """`localhost` and anything under it, for a normalised host."""
    return any(host == n or host.endswith("." + n) for n in _LOOPBACK_NAMES)


@functools.cache
def _public_suffixes():
    # Only the ICANN section: `*.github.io` is a deliberate choice an operator may
    # make, `*.co.uk` is always a mistake. Unknown TLDs count as public.
    from publicsuffixlist import PublicSuffixList

    return PublicSuffixList(only_icann=True)


PatternKind = Literal["exact", "wildcard", "any"]


@dataclass(frozen=True)
class DomainPattern:
    """A parsed allowlist pattern: `host`, `*.host` or `*`."""

    text: str  # as written in the spec, used as the metrics `rule` label
    kind: PatternKind
    domain: str  # canonical host (exact) or suffix (wildcard); "" for any


def parse_pattern(text: object) -> DomainPattern:
    """Parse one allowlist `domain`; raises HostError naming what is wrong."""
    if not isinstance(text, str):
        raise HostError(f"must be a string, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise HostError("empty pattern")
    if stripped == "*":
        return DomainPattern(stripped, "any", "")
    if (hint := _url_or_port_hint(stripped)) is not None:
        raise HostError(f"{text!r}: {hint}")
    if stripped.startswith("*."):
        rest = stripped[2:]
        if "*" in rest:
            raise HostError(f"{text!r}: '*' is only allowed as the whole first label")
        suffix = normalize_host(rest)
        # Checked on the canonical form: `*.1.2.3.` and `*.0x7f\u30021` are addresses too.
        if parse_ip_literal(suffix) is not None:
            raise HostError(f"{text!r}: a wildcard cannot cover an IP address")
        if _public_suffixes().is_public(suffix):
            raise HostError(
                f"{text!r}: wildcard over the public suffix {suffix!r} would allow every domain under it"
            )
        return DomainPattern(stripped, "wildcard", suffix)
    if "*" in stripped:
        raise HostError(f"{text!r}: use 'host', '*.host' or '*' ('*' must be a whole label)")
    return DomainPattern(stripped, "exact", normalize_host(stripped))


def _url_or_port_hint(text: str) -> str | None:
    """What to write instead of a URL or a host:port, the two mistakes copied from elsewhere."""
    if "/" in text:
        host = text.split("://", 1)[-1].split("/", 1)[0]
        return f"a host name, not a URL: write {host!r}" if host else "a host name, not a URL or a path"
    name, colon, port = text.rpartition(":")
    if colon and port.isdigit() and name and ":" not in name and not name.startswith("["):
        return f"a host name without a port: write {name!r} (an entry allows every port of its host)"
    return None


@dataclass
class Allowlist[Entry]:
    """Most-specific-wins lookup: exact > longest `*.` suffix > `*`.

    Lookups are dictionary probes, one per label of the host, so the cost does not
    grow with the number of entries.
    """

    exact: dict[str, Entry] = field(default_factory=dict)
    wildcard: dict[str, Entry] = field(default_factory=dict)
    any: Entry | None = None

    def add(self, pattern: DomainPattern, entry: Entry) -> None:
        if pattern.kind == "exact":
            self.exact[pattern.domain] = entry
        elif pattern.kind == "wildcard":
            self.wildcard[pattern.domain] = entry
        else:
            self.any = entry

    def __len__(self) -> int:
        return len(self.exact) + len(self.wildcard) + (self.any is not None)

    def match(self, host: str) -> Entry | None:
        """Entry for a normalised host, or None."""
        if (entry := self.exact.get(host)) is not None:
            return entry
        if self.wildcard and parse_ip_literal(host) is None:
            labels = host.split(".")
            # Start at the longest proper suffix: `*.a.b` never matches `a.b` itself.
            for i in range(1, len(labels)):
                if (entry := self.wildcard.get(".".join(labels[i:]))) is not None:
                    return entry
        return self.any
