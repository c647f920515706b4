"""Plain YAML documents built straight from the parser's events.

`yaml.load` with libyaml's `CSafeLoader` still composes a tree of Python node
objects (with start and end marks) and then walks it again to construct the
values: at 100,000 allowlist entries that is about 3 s of a 3.5 s load. A spec
uses a small part of YAML (mappings, sequences, and scalars that are strings,
null, booleans or numbers); for a document within that part, `load` makes the
same values from the parser's event stream in one pass, with an explicit stack.

Anything else (an anchor or alias, an explicit tag, a merge key, a mapping or
sequence as a key, a scalar that YAML 1.1 reads as a timestamp or another type,
a second document, a syntax error) returns `FALLBACK`, and the caller runs
`yaml.load` as before: its result, its error message and its guards apply
unchanged. Tag resolution and the conversion of null/bool/int/float scalars are
the loader's own (`resolve` and the SafeConstructor's constructors), so `yes`,
`0x1F`, `1:30`, `.inf` or `~` read exactly as `yaml.load` reads them.
"""

from __future__ import annotations

from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    DocumentEndEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode

FALLBACK: Final = object()  # "not a document this module builds: use yaml.load"

_STR = "tag:yaml.org,2002:str"
# Scalars converted by the loader's own constructor for their resolved tag. Not
# timestamps (dates) or binary, which a spec never needs; not the merge (`<<`) and
# value (`=`) tags, which change how the enclosing mapping is built.
_CONVERTED = frozenset({"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                        "tag:yaml.org,2002:float"})  # fmt: skip
# What this module builds itself rather than through the loader's constructors: only
# while the loader uses SafeConstructor's (nobody registered others for these tags).
_BUILT_HERE = (_STR, "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
_NO_KEY: Final = object()  # a mapping waiting for its next key, not for a value


class _Unsupported(Exception):
    """The document leaves the subset this module builds."""


def load(text: str, loader_class: Any) -> Any:
    """The value `yaml.load(text, Loader=loader_class)` gives, or FALLBACK."""
    if loader_class.yaml_path_resolvers or any(
        loader_class.yaml_constructors.get(tag) is not SafeConstructor.yaml_constructors[tag] for tag in _BUILT_HERE
    ):
        return FALLBACK  # path resolvers need the node tree; other constructors, their own nodes
    # On a syntax error too (the pure-Python loader reads the text when it is created,
    # libyaml's encodes it, which fails on a lone surrogate): the full loader raises its
    # own error, with its marks.
    try:
        loader = loader_class(text)
    except (yaml.YAMLError, UnicodeError):
        return FALLBACK
    try:
        return _document(loader)
    except (_Unsupported, yaml.YAMLError):
        return FALLBACK
    finally:
        loader.dispose()


def _document(loader: Any) -> Any:
    get_event = loader.get_event
    resolve = loader.resolve
    constructors = loader.yaml_constructors
    # `resolve` looks up implicit resolvers by a plain scalar's first character; with
    # none for that character (nor any for every character) it returns str, as it does
    # for a quoted or block scalar. Most scalars of a spec are host names: skip the call.
    resolved_first = loader.yaml_implicit_resolvers
    resolve_all = None in resolved_first
    get_event()  # StreamStartEvent
    if type(get_event()) is StreamEndEvent:  # else DocumentStartEvent
        return None  # an empty stream
    # Open mappings and sequences, innermost last; for each, the key read and waiting
    # for its value (_NO_KEY if none, and always for a sequence).
    containers: list[Any] = []
    keys: list[Any] = []
    root: Any = None
    while True:
        event = get_event()
        kind = type(event)
        if kind is ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Unsupported  # a tag, even the non-specific `!`, is the full loader's
            value = event.value
            implicit = event.implicit
            if not implicit[0] or not (resolve_all or not value or value[0] in resolved_first):
                tag = _STR
            else:
                tag = resolve(ScalarNode, value, implicit)
            if tag != _STR:
                if tag not in _CONVERTED:
                    raise _Unsupported
                try:
                    value = constructors[tag](loader, ScalarNode(tag, value))
                except Exception:  # e.g. `0x_` (ValueError): the full loader raises it
                    raise _Unsupported from None
            opened = False
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Unsupported
            value = {} if kind is MappingStartEvent else []
            opened = True
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            containers.pop()
            keys.pop()
            if not containers:
                break
            continue
        else:  # AliasEvent: the only other event inside a document
            raise _Unsupported
        if containers:
            container = containers[-1]
            if type(container) is list:
                container.append(value)
            elif keys[-1] is _NO_KEY:
                if opened:
                    raise _Unsupported  # a mapping or sequence as a key
                keys[-1] = value
            else:
                container[keys[-1]] = value
                keys[-1] = _NO_KEY
        else:
            root = value
        if opened:
            containers.append(value)
            keys.append(_NO_KEY)
        elif not containers:
            break  # the document is one scalar
    if type(get_event()) is not DocumentEndEvent or type(get_event()) is not StreamEndEvent:
        raise _Unsupported  # a second document: the full loader's error names it
    return root
