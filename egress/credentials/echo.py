"""Echo scrubbing: secrets the proxy injected, found in what comes back, replaced.

An echo endpoint, an error page quoting the Authorization header, a debug
response: whatever carries an injected secret back to the sandbox reaches it with
each occurrence masked (the secret as sent, and percent-encoded). The mask has the secret's length (`*` repeated), so a
streamed body keeps its declared Content-Length. Streamed bodies are scanned
across chunk boundaries: the last `longest - 1` bytes of each chunk are held back
until the next one (or the end) shows whether they start a secret.
Secrets shorter than MIN_SECRET are not scanned for: so short a string would
match ordinary text (and is no credential anyone issues).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

MIN_SECRET = 8


class Scrubber:
    def __init__(self, secrets: Iterable[str]):
        forms: set[bytes] = set()
        for secret in secrets:
            # A header value `Bearer <token>` / `Basic <base64>`: its credential alone is a
            # secret too (an echo may quote it without the scheme).
            candidates = {secret, secret.partition(" ")[2]}
            for candidate in candidates:
                if len(candidate) >= MIN_SECRET:
                    forms.add(candidate.encode())
                    forms.add(quote(candidate, safe="").encode())  # as a query or form value
        # A form that contains another is found (and masked, in its part that is secret)
        # through the shorter one: one substring search fewer per chunk.
        forms = {f for f in forms if not any(g != f and g in f for g in forms)}
        self._forms = sorted(forms, key=len, reverse=True)
        self._masks = [b"*" * len(f) for f in self._forms]
        self.longest = max((len(f) for f in self._forms), default=0)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def scrub(self, data: bytes) -> tuple[bytes, int]:
        # One substring search per form (C speed, no copy when nothing is found: the usual
        # case); a regex alternation of the forms scanned 1 MiB bodies at a quarter the speed.
        count = 0
        for form, mask in zip(self._forms, self._masks, strict=True):
            if form in data:
                count += data.count(form)
                data = data.replace(form, mask)
        return data, count

    def scrub_text(self, text: str) -> tuple[str, int]:
        data, count = self.scrub(text.encode("utf-8", "surrogateescape"))
        return (data.decode("utf-8", "surrogateescape") if count else text), count

    def stream(self, counted) -> StreamScrub:
        return StreamScrub(self, counted)


class StreamScrub:
    """mitmproxy's `response.stream` callable: chunks in, scrubbed chunks out; b"" ends."""

    def __init__(self, scrubber: Scrubber, counted):
        self._scrubber = scrubber
        self._held = b""
        self._counted = counted  # called with the occurrences found in each piece

    def __call__(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        if not chunk:  # end of the body
            self._held = b""
            return self._emit(data)
        keep = self._scrubber.longest - 1
        data, count = self._scrubber.scrub(data)
        if count:
            self._counted(count)
        # A secret that starts in the last `keep` bytes may end in the next chunk. A mask
        # there cannot match again (no secret is all `*`), so re-scanning it is harmless.
        if keep <= 0 or len(data) <= keep:
            self._held = data
            return b""
        self._held = data[-keep:]
        return data[:-keep]

    def _emit(self, data: bytes) -> bytes:
        data, count = self._scrubber.scrub(data)
        if count:
            self._counted(count)
        return data
