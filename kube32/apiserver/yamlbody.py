"""A YAML body as the JSON value it stands for, with bounded work: a decoder bomb is
refused before it costs more than a body of the size limit would.

Design: libyaml (PyYAML's C parser, pure-Python PyYAML where it is missing) turns the
text into events; this module builds the value from them in one loop with its own
stack, so nesting never recurses, and counts as it goes:

* the estimated size of the value as JSON, every alias counted as a full copy of what
  it names and every merge key (``<<``) as the mappings it merges.  Over ``max_size``
  raises ``BodyError(too_large=True)``: 9 aliases of 9 aliases of ... ("billion
  laughs") stop after about ``max_size`` bytes of work, not 9^8 copies.
* the nesting depth, an alias adding the depth of what it names.  Over ``max_depth``
  raises ``BodyError``.
* the values (an alias: as many as it names).  Over ``max_values`` raises
  ``BodyError(too_large=True)``.

The value is a tree of dict/list/str/int/float/bool/None, as JSON decoding gives, with
no shared parts (each alias is copied) and no cycles (an alias may name only a
finished node).  YAML that has no JSON form is refused with its reason: a mapping or
sequence as a key, a key given twice, NaN and infinities, ``!!binary``, ``!!set``,
``!!omap``, ``!!pairs`` and application tags.  A timestamp stays the string it was
written as and scalar keys become strings (``1: a`` -> ``{"1": "a"}``), as
sigs.k8s.io/yaml's YAML-to-JSON conversion does; one document only.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml

from .limits import out_of_range

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TAG = "tag:yaml.org,2002:"
_MERGE = _TAG + "merge"
_SEQ_TAGS = (None, "!", _TAG + "seq")
_MAP_TAGS = (None, "!", _TAG + "map")
_SCALARS = {_TAG + t for t in ("null", "bool", "int", "float")}


class BodyError(ValueError):
    """The YAML text is not a bounded JSON value; ``str(err)`` says why."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


@dataclass
class _Frame:
    """A mapping or sequence being built."""
    value: dict | list
    anchor: str | None
    start_size: int
    start_values: int
    depth: int = 1            # levels from this node down, itself included
    key: Any = None           # a mapping's key waiting for its value (_NO_KEY: none)
    merges: list[dict] = field(default_factory=list)


_NO_KEY = object()
_MERGE_KEY = object()


@dataclass(frozen=True)
class _Anchored:
    value: Any
    size: int
    depth: int
    values: int


class _Builder:
    def __init__(self, loader: Any, max_size: int, max_depth: int, max_values: int) -> None:
        self.loader = loader
        self.max_size = max_size
        self.max_depth = max_depth
        self.max_values = max_values
        self.size = 0
        self.values = 0
        self.stack: list[_Frame] = []
        self.anchors: dict[str, _Anchored] = {}
        self.result: Any = None
        self.done = False

    # --- counting -------------------------------------------------------------
    def _charge(self, size: int, depth: int, values: int = 1) -> None:
        self.size += size
        self.values += values
        if self.values > self.max_values:
            raise BodyError(f"the YAML body holds (its aliases and merge keys counted in full) more than "
                            f"{self.max_values} values, the limit", too_large=True)
        if self.size > self.max_size:
            raise BodyError(f"the YAML body expands (its aliases and merge keys counted in full) to "
                            f"more than {self.max_size} bytes as JSON, the limit", too_large=True)
        levels = len(self.stack) + depth
        if levels > self.max_depth:
            raise BodyError(f"the YAML body nests more than {self.max_depth} levels deep (the limit)")

    # --- values ---------------------------------------------------------------
    def _put(self, value: Any, depth: int) -> None:
        """A finished node: into its parent, or the document's value."""
        if not self.stack:
            self.result, self.done = value, True
            return
        parent = self.stack[-1]
        parent.depth = max(parent.depth, depth + 1)
        if isinstance(parent.value, list):
            parent.value.append(value)
        elif parent.key is _NO_KEY:
            parent.key = self._key(value)
        else:
            key, parent.key = parent.key, _NO_KEY
            if key is _MERGE_KEY:
                parent.merges.extend(self._merged(value))
            elif key in parent.value:
                raise BodyError(f'mapping key "{key}" already defined')
            else:
                parent.value[key] = value

    @staticmethod
    def _key(value: Any) -> Any:
        if value is _MERGE_KEY or isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "null"
        if isinstance(value, (int, float)):
            return str(value)
        raise BodyError("a mapping key must be a string or another scalar, not a mapping or a sequence")

    @staticmethod
    def _merged(value: Any) -> list[dict]:
        """The mappings a merge key names, first one first."""
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(s, dict) for s in sources):
            raise BodyError("a merge key (<<) must name a mapping or a sequence of mappings")
        return sources

    def _scalar(self, event: Any) -> Any:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _MERGE and self.stack and self.stack[-1].key is _NO_KEY \
                and isinstance(self.stack[-1].value, dict):
            return _MERGE_KEY
        if tag in (_TAG + "str", _TAG + "timestamp", _MERGE):
            return event.value
        if tag not in _SCALARS:
            raise BodyError(f"the YAML tag {event.tag or tag} has no JSON form")
        node = yaml.ScalarNode(tag, event.value)
        try:
            value = self.loader.yaml_constructors[tag](self.loader, node)
        except (ValueError, yaml.YAMLError) as e:
            reason = str(e).split("; use sys.")[0]   # Python's advice is not the client's
            raise BodyError(f"the scalar {event.value[:40]!r} cannot be read as {tag[len(_TAG):]}: {reason}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and out_of_range(value):
            raise BodyError(f"{event.value[:40]!r} is not a JSON number (JSON has no NaN or infinity, and "
                            "no number out of the range of a 64-bit float)")
        return value

    def _anchor(self, name: str | None, value: Any, size: int, depth: int, values: int) -> None:
        if name is not None:
            self.anchors[name] = _Anchored(value, size, depth, values)

    # --- events ---------------------------------------------------------------
    def feed(self, event: Any) -> None:
        if isinstance(event, yaml.ScalarEvent):
            value = self._scalar(event)
            size = len(event.value) + 3
            self._charge(size, 0)
            self._anchor(event.anchor, value, size, 0, 1)
            self._put(value, 0)
        elif isinstance(event, yaml.AliasEvent):
            anchored = self.anchors.get(event.anchor or "")
            if anchored is None:
                raise BodyError(f'the alias *{event.anchor} names no finished anchor '
                                "(undefined, or its own ancestor)")
            self._charge(anchored.size, anchored.depth, anchored.values)
            value = anchored.value
            self._put(copy.deepcopy(value) if isinstance(value, (dict, list)) else value, anchored.depth)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            is_map = isinstance(event, yaml.MappingStartEvent)
            if event.tag not in (_MAP_TAGS if is_map else _SEQ_TAGS):
                raise BodyError(f"the YAML tag {event.tag} has no JSON form")
            if self.stack and self.stack[-1].key is _NO_KEY and isinstance(self.stack[-1].value, dict):
                raise BodyError("a mapping key must be a string or another scalar, not a mapping or a sequence")
            self._charge(2, 1)
            self.stack.append(_Frame({} if is_map else [], event.anchor, self.size, self.values,
                                     key=_NO_KEY if is_map else None))
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            frame = self.stack.pop()
            value = frame.value
            if frame.merges:
                merged: dict = {}
                for source in reversed(frame.merges):   # the first named wins
                    merged.update(source)
                merged.update(value)                    # the mapping's own keys win
                value = merged
            self._anchor(frame.anchor, value, self.size - frame.start_size + 2, frame.depth,
                         self.values - frame.start_values + 1)
            self._put(value, frame.depth)
        elif isinstance(event, yaml.DocumentStartEvent) and self.done:
            raise BodyError("expected a single document in the stream, found another")


def load(text: bytes | str, max_size: int, max_depth: int, max_values: int) -> Any:
    """The one YAML document in ``text`` as a JSON value (None for an empty stream).

    Raises BodyError (bounds, no JSON form) or yaml.YAMLError (not YAML)."""
    loader = _Loader(text)
    try:
        builder = _Builder(loader, max_size, max_depth, max_values)
        while loader.check_event():
            builder.feed(loader.get_event())
        return builder.result
    finally:
        loader.dispose()
