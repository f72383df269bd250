"""Reading a composed PyYAML node tree with the file's line numbers, for :mod:`relay.config`.

:class:`Reader` gives typed access to nodes (mapping with strict keys, list, string, integer,
boolean, duration, size) and records a :class:`ConfigIssue` naming the 1-based line and field path
for every problem instead of raising, so that a config reports all its problems at once; warnings
(a key accepted but not honoured) are recorded apart. YAML merge
keys (``<<: *anchor``) are honoured; duplicate keys are reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from relay.common.units import UnitError, parse_duration, parse_size
from relay.config.operator import camel_to_snake, is_camel


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    line: int  # 1-based; 0 when the file could not be read at all
    path: str  # "destinations[0].queue.max_backoff"; "" for the whole document
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


def node_at(node: Node, field_path: str) -> Node:
    """The node a relabel field path like ``[2].regex`` names, or the deepest one that exists."""
    for index, key in re.findall(r"\[(\d+)\]|\.?([^.\[\]]+)", field_path):
        if index and isinstance(node, SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
        elif key and isinstance(node, MappingNode):
            found = [v for k, v in node.value if isinstance(k, ScalarNode) and k.value == key]
            if not found:
                break
            node = found[0]
        else:
            break
    return node


def check_unique(r: Reader, names: list[tuple[str, Node]], path: str, key: str) -> None:
    """Record an issue for each repeated non-empty name, citing the line of its first use."""
    first: dict[str, int] = {}
    for i, (name, node) in enumerate(names):
        if name and name in first:
            line = names[first[name]][1].start_mark.line + 1
            r.error(node, f"{path}[{i}].{key}", f'duplicate {key} "{name}" (first at line {line})')
        first.setdefault(name, i)


_TAG = "tag:yaml.org,2002:"
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean", "null": "null"}


def kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return _KINDS.get(node.tag.removeprefix(_TAG), f"a {node.tag.removeprefix(_TAG)}")


class Reader:
    """Typed access to YAML nodes that records an issue (and returns a default) for every problem.

    An absent key and an explicit null both mean "use the default"."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.issues: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []  # keys accepted but not honoured, doubtful values
        self._constructor = yaml.constructor.SafeConstructor()
        self._flattened: set[int] = set()

    def error(self, node: Node, path: str, message: str) -> None:
        issue = ConfigIssue(self.filename, node.start_mark.line + 1, path, message)
        if issue not in self.issues:  # the same node may be read twice
            self.issues.append(issue)

    def warn(self, node: Node, path: str, message: str) -> None:
        issue = ConfigIssue(self.filename, node.start_mark.line + 1, path, message)
        if issue not in self.warnings:
            self.warnings.append(issue)

    def type_error(self, node: Node, path: str, expected: str) -> None:
        self.error(node, path, f"expected {expected}, got {kind(node)}")

    @staticmethod
    def is_absent(node: Node | None) -> bool:
        return node is None or (isinstance(node, ScalarNode) and node.tag == _TAG + "null")

    def require(self, m: dict[str, Node], parent: Node, path: str, key: str) -> Node | None:
        if key not in m:
            self.error(parent, f"{path}.{key}" if path else key, "missing required key")
        return m.get(key)

    def mapping(self, node: Node | None, path: str, keys: tuple[str, ...] | None) -> dict[str, Node] | None:
        if node is None or self.is_absent(node):
            return None
        if not isinstance(node, MappingNode):
            self.type_error(node, path, "a mapping")
            return None
        if id(node) not in self._flattened:
            self._check_duplicate_keys(node, path)
            self._constructor.flatten_mapping(node)  # YAML merge keys: <<: *anchor, explicit keys win
            self._flattened.add(id(node))
        out: dict[str, Node] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                self.error(knode, path, f"keys must be strings, got {kind(knode)}")
                continue
            key = knode.value
            if keys is not None and key not in keys:
                self.error(knode, f"{path}.{key}" if path else key, unknown_key(key, keys))
            else:
                out[key] = vnode
        return out

    def _check_duplicate_keys(self, node: MappingNode, path: str) -> None:
        first: dict[str, int] = {}
        for knode, _ in node.value:
            if isinstance(knode, ScalarNode) and knode.tag != _TAG + "merge":
                line = knode.start_mark.line + 1
                if knode.value in first:
                    kpath = f"{path}.{knode.value}" if path else knode.value
                    self.error(knode, kpath, f"duplicate key (first at line {first[knode.value]})")
                first.setdefault(knode.value, line)

    def sequence(self, node: Node | None, path: str) -> list[tuple[Node, str]]:
        if node is None or self.is_absent(node):
            return []
        if not isinstance(node, SequenceNode):
            self.type_error(node, path, "a list")
            return []
        return [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]

    def _scalar(self, node: Node, path: str, expected: str, tags: tuple[str, ...]) -> str | None:
        if isinstance(node, ScalarNode) and node.tag.removeprefix(_TAG) in tags:
            return str(node.value)
        self.type_error(node, path, expected)
        return None

    def required_string(self, m: dict[str, Node], parent: Node, path: str, key: str) -> str | None:
        """The string at ``m[key]``; None (and an issue) when it is missing, null or not a string."""
        node, kpath = self.require(m, parent, path, key), f"{path}.{key}" if path else key
        if node is not None and self.is_absent(node):
            self.type_error(node, kpath, "a string")
        return self.optional_string(node, kpath)

    def string(self, node: Node | None, path: str, default: str) -> str:
        value = self.optional_string(node, path)
        return default if value is None else value

    def optional_string(self, node: Node | None, path: str) -> str | None:
        if node is None or self.is_absent(node):
            return None
        return self._scalar(node, path, "a string", ("str", "int", "float"))

    def string_items(self, node: Node | None, path: str) -> list[tuple[str, Node, str]]:
        """(value, node, path) for each valid string in a list."""
        items = [(self.optional_string(n, p), n, p) for n, p in self.sequence(node, path)]
        for value, n, p in items:
            if value is None and self.is_absent(n):
                self.type_error(n, p, "a string")
        return [(v, n, p) for v, n, p in items if v is not None]

    def string_entries(self, node: Node | None, path: str) -> list[tuple[str, str, Node, Node]]:
        """(key, value, key node, value node) for a mapping of strings to strings."""
        m = self.mapping(node, path, None)
        if m is None or node is None:
            return []
        out: list[tuple[str, str, Node, Node]] = []
        keys = {k.value: k for k, _ in node.value if isinstance(k, ScalarNode)}
        for key, vnode in m.items():
            kpath = f"{path}.{key}"
            if self.is_absent(vnode):
                self.type_error(vnode, kpath, "a string")
            elif (value := self.optional_string(vnode, kpath)) is not None:
                out.append((key, value, keys[key], vnode))
        return out

    def integer(self, node: Node | None, path: str, default: int) -> int:
        value = self.optional_int(node, path)
        return default if value is None else value

    def optional_int(self, node: Node | None, path: str) -> int | None:
        if node is None or self.is_absent(node) or self._scalar(node, path, "an integer", ("int",)) is None:
            return None
        value = int(self._constructor.construct_object(node))
        if value <= 0:
            self.error(node, path, f"must be a positive integer, got {value}")
            return None
        return value

    def boolean(self, node: Node | None, path: str, default: bool) -> bool:
        if (
            node is None
            or self.is_absent(node)
            or self._scalar(node, path, "true or false", ("bool",)) is None
        ):
            return default
        return bool(self._constructor.construct_object(node))

    def duration(self, node: Node | None, path: str, default: float, *, positive: bool = False) -> float:
        if node is None or self.is_absent(node):
            return default
        if (text := self._scalar(node, path, 'a duration like "30s"', ("str", "int", "float"))) is None:
            return default
        try:
            value = parse_duration(text)
        except UnitError as e:
            self.error(node, path, str(e))
            return default
        if positive and value <= 0:
            self.error(node, path, "must be greater than 0")
            return default
        return value

    def size(self, node: Node | None, path: str, default: int) -> int:
        if node is None or self.is_absent(node):
            return default
        if (text := self._scalar(node, path, 'a size like "512MiB"', ("str", "int"))) is None:
            return default
        try:
            value = parse_size(text)
        except UnitError as e:
            self.error(node, path, str(e))
            return default
        if value <= 0:
            self.error(node, path, "must be greater than 0")
            return default
        return value

    def to_python(self, node: Node) -> Any:
        return self._constructor.construct_object(node, deep=True)


def unknown_key(key: str, keys: tuple[str, ...]) -> str:
    """The message for an unknown key; a camelCase one whose snake_case is valid is named for what it means."""
    snake = camel_to_snake(key) if is_camel(key) else None
    if snake is not None and snake in keys:
        return (f"unknown key {key}: did you mean {snake}? (camelCase is the prometheus-operator's; the relay "
                "reads prometheus.yml's snake_case, and gpu-relay import-prometheus converts a whole file)")
    return f"unknown key (valid: {', '.join(keys)})"
