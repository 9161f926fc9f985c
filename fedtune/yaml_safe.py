"""The one way fedtune reads YAML a user wrote: bounded before anything is built.

Config files (``--config``), ``--set key=value`` values and search-space files all go through
:func:`load` (text) or :func:`load_file` (a path). Besides ``yaml.safe_load``'s own safety (no
Python objects), a document is refused, with one :class:`~fedtune.errors.ConfigError` line naming
the source and the limit, when

* the file holds more than :data:`MAX_BYTES` bytes (checked before it is read), or is not UTF-8;
* it nests deeper than :data:`MAX_DEPTH` levels, counted through aliases; or
* its aliases expand it past :data:`MAX_NODES` nodes ("billion laughs": nine anchors of nine
  aliases each are 9**9 values once expanded); or
* a mapping gives a key twice (``yaml.safe_load`` keeps the later value without a word): the
  message names the key and both lines. A merge (``<<: *base``) is not a duplicate: a key written
  beside it overrides the merged one, as YAML says.

Both are measured while the document is *composed*, node by node (an alias adds the measure of
the node it names, kept per node: constant time), and the document is refused before it is
constructed, so nothing ever holds, prints or copies the expansion. A recursive alias (a node
that contains itself) is refused too. A value YAML cannot build (``2001-02-30``, an integer of
more digits than Python converts) is a ``yaml.YAMLError`` like any malformed document, with
its line.

Malformed YAML stays a ``yaml.YAMLError`` (callers word it: ``--set`` keeps the raw text):

>>> load("rounds: 3", "inline")
{'rounds': 3}
>>> load("rounds: 3\\nseed: 1\\nrounds: 5", "config file 'a.yaml'")
Traceback (most recent call last):
...
fedtune.errors.ConfigError: config file 'a.yaml': key 'rounds' is given twice (lines 1 and 3); allowed: each key once
>>> load("a: &a [x, x]\\nb: [*a, *a]", "inline")
{'a': ['x', 'x'], 'b': [['x', 'x'], ['x', 'x']]}
>>> load("[" * 500 + "]" * 500, "--set 'mlp_hidden'")
Traceback (most recent call last):
...
fedtune.errors.ConfigError: --set 'mlp_hidden': YAML nested deeper than 100 levels; allowed: at most 100
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError, shown

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "load", "load_file"]

MAX_BYTES = 1 << 20
"""Largest YAML document read (1 MiB): a run's config or a search space is a few kB."""
MAX_DEPTH = 100
"""Deepest nesting of lists and mappings, aliases expanded."""
MAX_NODES = 100_000
"""Most values (scalars, lists, mappings) of a document, aliases expanded."""


class _Refused(Exception):
    """A document past a limit or with a key given twice (raised while composing or constructing;
    :func:`load` words it)."""


_MERGE = "tag:yaml.org,2002:merge"


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that measures every node while composing: ``(nodes, depth)`` with
    aliases expanded, kept per node so an alias costs one look-up; and refuses a mapping that
    gives a key twice (:meth:`construct_mapping`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._measure: dict[int, tuple[int, int]] = {}
        self._open = 0  # nesting of the node being composed (the composer recurses per level)
        # each mapping's own keys as written (the constructor's merge step rewrites node.value in place)
        self._written: dict[int, list[Any]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        self._open += 1
        try:
            if self._open > MAX_DEPTH:
                raise _Refused(f"YAML nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}")
            node = super().compose_node(parent, index)
        finally:
            self._open -= 1
        known = self._measure.get(id(node))
        if alias:
            if known is None:  # the alias names a node still being composed: it contains itself
                raise _Refused("a recursive YAML alias (a value that contains itself); allowed: none")
            return node
        if isinstance(node, yaml.SequenceNode):
            children = [self._measure[id(c)] for c in node.value]
        elif isinstance(node, yaml.MappingNode):
            children = [self._measure[id(c)] for pair in node.value for c in pair]
        else:
            children = []
        nodes = 1 + sum(n for n, _ in children)
        depth = 1 + max((d for _, d in children), default=0)
        if nodes > MAX_NODES:
            raise _Refused(f"YAML aliases expand to more than {MAX_NODES} values; allowed: at most {MAX_NODES}")
        if depth > MAX_DEPTH:
            raise _Refused(f"YAML aliases nest deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}")
        self._measure[id(node)] = (nodes, depth)
        if isinstance(node, yaml.MappingNode):
            self._written[id(node)] = [key for key, _ in node.value if key.tag != _MERGE]
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """SafeLoader's mapping, once no key is written twice in it (compared as the values YAML
        builds: ``1`` and ``0x1`` are one key); keys merged in (``<<``) are not counted."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node in self._written.get(id(node), [k for k, _ in node.value if k.tag != _MERGE]):
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if first is not None:
                    lines = f"both on line {line}" if first == line else f"lines {first} and {line}"
                    raise _Refused(f"key {shown(key, 80)} is given twice ({lines}); allowed: each key once")
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # 2001-02-30, an integer of 5000 digits, ...
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value {shown(getattr(node, 'value', ''), 60)}: {exc}",
                node.start_mark) from None


def load(text: str, source: str) -> Any:
    """One YAML document from ``text``, within the limits, or a ConfigError ``<source>: <problem>``;
    malformed YAML raises ``yaml.YAMLError`` (the caller words it)."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ConfigError(f"{source}: more than {MAX_BYTES} bytes of YAML; allowed: at most {MAX_BYTES} (1 MiB)")
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise ConfigError(f"{source}: {exc}") from None
    finally:
        loader.dispose()


def load_file(path: str | os.PathLike[str], source: str | None = None) -> Any:
    """:func:`load` of the file at ``path``: its size is checked before it is read, and a file
    that cannot be read or is not UTF-8 is a ConfigError. ``source`` names it in messages
    (default ``'<path>'``)."""
    path = Path(path)
    source = source or f"'{path}'"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{source}: more than {MAX_BYTES} bytes of YAML; allowed: at most {MAX_BYTES} (1 MiB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start}); allowed: a UTF-8 YAML file") from None
    return load(text, source)
