"""Bounded-time fuzzing of the spec parser: only SpecError may escape `parse_spec`.

Not part of CI. Run for N seconds:

    .venv/bin/pip install --isolated atheris        # optional; not a project dependency
    PYTHONPATH=. .venv/bin/python bench/fuzz_parsers.py 60

With atheris (libFuzzer, coverage-guided) the run uses `-max_total_time=N`; extra
arguments after N go to libFuzzer (e.g. a corpus directory). Without atheris, or
with `--random`, inputs come from hypothesis strategies until N seconds pass.
Exit status 0: nothing but SpecError escaped. A crash prints the input and the
traceback and exits non-zero.

Inputs are both raw text (parser robustness: YAML/JSON syntax, nesting, odd
characters) and structured documents (validation: patterns, headers, secret
references, CIDRs), each fed to the JSON and the YAML path. `${file:...}`
references are confined to a scratch directory so that a generated
`${file:/dev/zero}` cannot read forever.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback

try:
    import atheris
except ImportError:
    atheris = None

if atheris is not None and "--random" not in sys.argv:
    # Coverage feedback from the parser and everything it calls.
    with atheris.instrument_imports(
        include=["egress", "yaml", "json", "publicsuffixlist"]
    ):
        import yaml

        from egress.policy.spec import SpecError, parse_spec
else:
    import yaml

    from egress.policy.spec import SpecError, parse_spec

SCRATCH = tempfile.mkdtemp(prefix="egress-fuzz-")
for _name, _content in {
    "token": "file-token\n",
    "crlf": "a\r\nb",
    "binary": "\udcff",
}.items():
    with open(
        os.path.join(SCRATCH, _name), "w", encoding="utf-8", errors="surrogateescape"
    ) as _f:
        _f.write(_content)
ENVIRON = {"TOKEN": "env-token", "CRLF": "a\r\nX-Evil: 1", "EMPTY": "", "NUL": "a\0b"}

DOMAINS = [
    "a.example.com",
    "*.example.com",
    "*",
    "*.com",
    "*.co.uk",
    "*host",
    "a*.b",
    "*.*.a.b",
    "127.0.0.1",
    "[::1]",
    "0x7f.1",
    "*.10.0.0.1",
    "bücher.example",
    "*.bücher.example",
    "localhost",
    "",
    "a..b",
    "x" * 70 + ".example",
    "*.github.io",
    "1.2.3.",
    "0x7f\u30021",
]
HEADERS = [
    "Authorization",
    "X-Api-Key",
    "Host",
    "Bad Header",
    "X:Y",
    "",
    "content-length",
    "x-a",
    "X-A",
    "ü",
]
VALUES = [
    "Bearer t",
    "${env:TOKEN}",
    "${env:MISSING}",
    "${env:CRLF}",
    "${env:EMPTY}",
    "${env:NUL}",
    "${file:token}",
    "${file:/token}",
    "${file:crlf}",
    "${file:binary}",
    "${file:nope}",
    "${vault:x}",
    "$${x}",
    "${",
    "a\r\nb",
    "a\0b",
    " x",
    "tök",
    "${env:}",
    "${file:}",
    "$$${env:TOKEN}",
]
CIDRS = [
    "10.0.0.0/8",
    "127.0.0.0/8",
    "0.0.0.0/0",
    "::/0",
    "8.8.8.0/24",
    "10.0.0.1/8",
    "fd00::/8",
    "::ffff:0:0/96",
    "nope",
    "198.18.0.0/15",
    "2001::/32",
]


def _confine(text: str) -> str:
    # Real paths stay reachable only inside SCRATCH; `..` cannot climb out of it.
    return text.replace("..", "__").replace("${file:", "${file:" + SCRATCH + "/")


def check(text: str, sources: tuple[str, ...] = ("fuzz.json", "fuzz.yaml")) -> None:
    text = _confine(text)
    for source in sources:
        try:
            parse_spec(text, source=source, environ=ENVIRON)
        except SpecError as exc:
            if not all(
                isinstance(p, str) and p.startswith(f"{source}: ") for p in exc.problems
            ):
                raise AssertionError(
                    f"malformed problem list: {exc.problems!r}"
                ) from None


FREE = object()  # placeholder: "a free-form string from the engine here"
KINDS = ["env", "file", "vault", ""]


def _document(pick, free) -> object:
    """A structured spec from `pick(options)` and `free()` (one source of randomness for both engines)."""

    def choose(options):
        value = pick(options + [FREE])
        return free() if value is FREE else value

    def value():
        # A known value, a free string, or a reference with a free-form argument.
        if pick([True, False]):
            return choose(VALUES + [5, None])
        return f"{free()}${{{pick(KINDS)}:{free()}}}{free()}"

    entries = []
    for _ in range(pick(range(5))):
        entry: dict = {"domain": choose(DOMAINS + [5, None, ["a"]])}
        if pick([True, False]):
            entry["transform"] = {
                choose(HEADERS): value() for _ in range(pick(range(3)))
            }
        if pick([False, False, True]):
            entry[choose(["bogus", "Domain", 1])] = 1
        entries.append(entry)
    network: dict = {"allowlist": pick([entries, entries, "*", None, {}])}
    if pick([True, False]):
        network["mode"] = choose(["enforce", "report", "block", 1, None])
    if pick([True, False]):
        network["allowCidrs"] = pick(
            [[choose(CIDRS) for _ in range(pick(range(3)))], "10.0.0.0/8", None, [None]]
        )
    return pick(
        [
            {"type": "remote", "sources": [], "network": network},
            network,
            {"network": pick([network, [], "x"])},
        ]
    )


def _dump(document: object, as_yaml: bool) -> str:
    return (
        yaml.safe_dump(document, allow_unicode=True)
        if as_yaml
        else json.dumps(document)
    )


def _report(text: str) -> None:
    print(f"\nnon-SpecError escaped for input {text!r}:", file=sys.stderr)
    traceback.print_exc()


def run_atheris(seconds: int, extra: list[str]) -> None:
    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        if fdp.ConsumeBool():
            # Nesting depth is a separate, rarely turned knob: libFuzzer seldom grows an
            # input to 1000 `[`, and PyYAML scans deep nesting in quadratic time.
            deep = fdp.ConsumeIntInRange(0, 255) == 255  # exhausted data reads as 0
            depth = fdp.ConsumeIntInRange(0, 1100) if deep else 0
            text = "[" * depth + fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
            # PyYAML overflows the stack near depth 500 and scans nesting in quadratic
            # time; past 600 only the JSON parser (limit near 1000) learns anything new.
            sources = ("fuzz.json",) if depth > 600 else ("fuzz.json", "fuzz.yaml")
        else:

            def pick(options):
                options = list(options)
                return options[fdp.ConsumeIntInRange(0, len(options) - 1)]

            def free():
                # May hold NUL and lone surrogates.
                return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 12))

            text = _dump(_document(pick, free), fdp.ConsumeBool())
            sources = ("fuzz.json", "fuzz.yaml")
        try:
            check(text, sources)
        except Exception:
            _report(text)
            raise

    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", *extra], one_input)
    atheris.Fuzz()


def run_random(seconds: int) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    raw = st.one_of(
        st.text(max_size=200),
        st.text(alphabet="{}[]:,\"'-*.\n \t#&!|>$0123456789abcxyz:\\", max_size=200),
        st.sampled_from([2, 40, 1100]).map(
            lambda n: "[" * n
        ),  # PyYAML scans deep nesting in O(n²)
    )
    alphabet = "aZ09.-_*:/$\\{}[] \t\r\n\0ü\u3002\ud800"

    def structured_text(rnd, as_yaml):
        def free():
            return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(12)))

        return _dump(_document(rnd.choice, free), as_yaml)

    structured = st.builds(
        structured_text, st.randoms(use_true_random=True), st.booleans()
    )
    count = 0

    # Batches of generated examples, no shrinking or database: a crash is reported as found.
    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(text=st.one_of(raw, structured))
    def batch(text: str) -> None:
        nonlocal count
        count += 1
        try:
            check(text)
        except Exception:
            _report(text)
            raise

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch()  # a crash propagates: traceback, exit status 1
    print(f"fuzz_parsers: {count} inputs in {seconds}s, only SpecError escaped")


def main(argv: list[str]) -> None:
    args = [a for a in argv if a != "--random"]
    if not args or not args[0].isdigit():
        sys.exit(f"usage: {sys.argv[0]} SECONDS [--random] [libFuzzer args...]")
    seconds, extra = int(args[0]), args[1:]
    if "--random" not in argv:
        if atheris is not None:
            run_atheris(seconds, extra)
            return
        print(
            "fuzz_parsers: atheris not installed, using hypothesis random generation",
            file=sys.stderr,
        )
    run_random(seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
