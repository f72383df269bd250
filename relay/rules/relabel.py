"""Prometheus ``relabel_config``, with the exact semantics of ``prometheus/model/relabel``.

Parse once (``parse_relabel_config``: defaults, strict keys, ``validate``), then ``process`` is a
pure function ``(labels, rules) -> labels | None`` (None: dropped) that never raises: every
failure is caught at load time, as in Prometheus.

Semantics kept from relabel.go (Prometheus 3, UTF-8 name validation):
- regexes are RE2, compiled fully anchored as ``^(?s:<re>)$``; ``Regexp.pattern`` is the original;
- ``$1``, ``${1}``, ``$name``, ``${name}`` expand the Go ``Regexp.Expand`` way: a name is the
  longest run of letters, digits and ``_`` (``$1_x`` is the group "1_x", so ""), ``$$`` is ``$``,
  a malformed ``$`` stays literal, unknown groups expand to "";
- setting a label to "" deletes it; ``replace`` skips a target that expands to an invalid name;
- the label builder keeps Go's ``labels.Builder`` order (unchanged labels first, then the ones set
  in this pass), which decides who wins when ``labelmap`` maps two labels onto one name.

The regex and ``$``-template machinery lives in :mod:`relay.relabel_regexp` and is re-exported here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import re2

from relay.common.labels import Labels
from relay.rules.relabel_regexp import _RE2_OPTIONS, _go_case, _go_quote, _replace_all
from relay.rules.relabel_regexp import DEFAULT_REGEX as DEFAULT_REGEX
from relay.rules.relabel_regexp import Regexp as Regexp
from relay.rules.relabel_regexp import RelabelConfigError as RelabelConfigError
from relay.rules.relabel_regexp import Template as Template
from relay.rules.relabel_regexp import compile_template as compile_template
from relay.rules.relabel_regexp import expand as expand

ACTIONS = frozenset(
    {
        "replace", "keep", "drop", "keepequal", "dropequal", "hashmod",
        "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase",
    }
)  # fmt: skip
FIELDS = ("source_labels", "separator", "regex", "modulus", "target_label", "replacement", "action")
DEFAULT_SEPARATOR = ";"
DEFAULT_REPLACEMENT = "$1"
DEFAULT_ACTION = "replace"
NameValidation = Literal["utf8", "legacy"]

_MAX_UINT64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class RelabelConfig:
    source_labels: tuple[str, ...] = ()
    separator: str = DEFAULT_SEPARATOR
    regex: Regexp = DEFAULT_REGEX
    modulus: int = 0
    target_label: str = ""
    replacement: str = DEFAULT_REPLACEMENT
    action: str = DEFAULT_ACTION
    # Precomputed at construction, so process() does no parsing.
    _target: Template = field(init=False, repr=False, compare=False)
    _replacement: Template = field(init=False, repr=False, compare=False)
    _fast_set: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.action and self.action not in ACTIONS:
            raise RelabelConfigError(f"unknown relabel action {_go_quote(self.action)}", "action")
        if not isinstance(self.source_labels, tuple):
            object.__setattr__(self, "source_labels", tuple(self.source_labels))
        object.__setattr__(self, "_target", compile_template(self.target_label, self.regex))
        object.__setattr__(self, "_replacement", compile_template(self.replacement, self.regex))
        fast = self.regex is DEFAULT_REGEX and "$" not in self.target_label and "$" not in self.replacement
        object.__setattr__(self, "_fast_set", fast)


# ---------------------------------------------------------------------------------------------
# Label names


def is_valid_label_name(name: str) -> bool:
    """UTF-8 scheme (Prometheus 3 default): any non-empty valid UTF-8 string."""
    if not name:
        return False
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


def is_valid_legacy_label_name(name: str) -> bool:
    return (
        bool(name)
        and name.isascii()
        and (name[0].isalpha() or name[0] == "_")
        and (name.replace("_", "a").isalnum())
    )


_LEGACY_TARGET = re2.compile(r"^(?:(?:[a-zA-Z_]|\$(?:\{\w+\}|\w+))+\w*)+$", _RE2_OPTIONS)


def is_valid_legacy_target(template: str) -> bool:
    """Prometheus ``relabelTargetLegacy``: a legacy name that may contain ``$var``/``${var}``."""
    return _LEGACY_TARGET.search(template) is not None


# ---------------------------------------------------------------------------------------------
# Validation and parsing


def validate(cfg: RelabelConfig, *, name_validation: NameValidation = "utf8") -> None:
    """Prometheus ``Config.Validate``, with its messages. Raises RelabelConfigError."""
    action = cfg.action
    valid_name = is_valid_label_name if name_validation == "utf8" else is_valid_legacy_label_name
    valid_with_vars = is_valid_label_name if name_validation == "utf8" else is_valid_legacy_target
    target = cfg.target_label
    if not action:
        raise RelabelConfigError("relabel action cannot be empty", "action")
    if cfg.modulus == 0 and action == "hashmod":
        raise RelabelConfigError("relabel configuration for hashmod requires non-zero modulus", "modulus")
    needs_target = ("replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal")
    if action in needs_target and target == "":
        raise RelabelConfigError(
            f"relabel configuration for {action} action requires 'target_label' value", "target_label"
        )
    invalid_target = f"{_go_quote(target)} is invalid 'target_label' for {action} action"
    if action == "replace" and not (valid_with_vars(target) if "$" in target else valid_name(target)):
        raise RelabelConfigError(invalid_target, "target_label")
    single_valued = ("lowercase", "uppercase", "keepequal", "dropequal")
    if action in single_valued and not valid_name(target):
        raise RelabelConfigError(invalid_target, "target_label")
    if action in single_valued and cfg.replacement != DEFAULT_REPLACEMENT:
        raise RelabelConfigError(f"'replacement' can not be set for {action} action", "replacement")
    if action == "labelmap" and not valid_with_vars(cfg.replacement):
        raise RelabelConfigError(
            f"{_go_quote(cfg.replacement)} is invalid 'replacement' for {action} action", "replacement"
        )
    if action == "hashmod" and not valid_name(target):
        raise RelabelConfigError(invalid_target, "target_label")
    if action in ("keepequal", "dropequal"):
        extra = _first_set(
            ("regex", cfg.regex is not DEFAULT_REGEX),
            ("modulus", cfg.modulus != 0),
            ("separator", cfg.separator != DEFAULT_SEPARATOR),
            ("replacement", cfg.replacement != DEFAULT_REPLACEMENT),
        )
        if extra:
            raise RelabelConfigError(
                f"{action} action requires only 'source_labels' and `target_label`, and no other fields",
                extra,
            )
    if action in ("labeldrop", "labelkeep"):
        extra = _first_set(
            ("source_labels", bool(cfg.source_labels)),
            ("target_label", target != ""),
            ("modulus", cfg.modulus != 0),
            ("separator", cfg.separator != DEFAULT_SEPARATOR),
            ("replacement", cfg.replacement != DEFAULT_REPLACEMENT),
        )
        if extra:
            raise RelabelConfigError(f"{action} action requires only 'regex', and no other fields", extra)


def _first_set(*checks: tuple[str, bool]) -> str | None:
    return next((name for name, is_set in checks if is_set), None)


def _string(raw: Mapping[str, Any], key: str, default: str) -> str:
    """A string field: absent -> default; null -> "" (Go's zero value); ints are written as text."""
    if key not in raw:
        return default
    value = raw[key]
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RelabelConfigError(f"must be a string, got {type(value).__name__} {value!r} (quote it)", key)


def _source_labels(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("source_labels")
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise RelabelConfigError(
            f"must be a list of label names, got {type(value).__name__}", "source_labels"
        )
    names: list[str] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or not is_valid_label_name(item):
            shown = _go_quote(item) if isinstance(item, str) else repr(item)
            raise RelabelConfigError(f"{shown} is not a valid label name", "source_labels")
        names.append(item)
    return tuple(names)


def _modulus(raw: Mapping[str, Any]) -> int:
    value = raw.get("modulus")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_UINT64:
        raise RelabelConfigError(f"must be a non-negative 64-bit integer, got {value!r}", "modulus")
    return value


def _action(raw: Mapping[str, Any]) -> str:
    if "action" not in raw:
        return DEFAULT_ACTION
    value = raw["action"]
    if value is None:
        return ""  # Go's zero value; validate() reports "relabel action cannot be empty"
    if not isinstance(value, str) or value.lower() not in ACTIONS:
        shown = _go_quote(value) if isinstance(value, str) else repr(value)
        raise RelabelConfigError(f"unknown relabel action {shown}", "action")
    return value.lower()


def parse_relabel_config(raw: Mapping[str, Any]) -> RelabelConfig:
    """One ``relabel_config`` mapping (parsed YAML) -> a validated RelabelConfig.

    Absent keys take Prometheus's defaults; an explicit empty value (``separator: ""``,
    ``regex: ""``, ``replacement: ""``, or YAML null) is kept as empty, as Prometheus does.
    """
    if not isinstance(raw, Mapping):
        raise RelabelConfigError(f"a relabel config must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in FIELDS:
            raise RelabelConfigError(
                f"unknown field {key!r} in relabel config (allowed: {', '.join(FIELDS)})", str(key)
            )
    regex = Regexp(_string(raw, "regex", "")) if "regex" in raw else DEFAULT_REGEX
    cfg = RelabelConfig(
        source_labels=_source_labels(raw),
        separator=_string(raw, "separator", DEFAULT_SEPARATOR),
        regex=regex,
        modulus=_modulus(raw),
        target_label=_string(raw, "target_label", ""),
        replacement=_string(raw, "replacement", DEFAULT_REPLACEMENT),
        action=_action(raw),
    )
    validate(cfg)
    return cfg


def parse_relabel_configs(raw: Sequence[Any]) -> tuple[RelabelConfig, ...]:
    """A list of relabel configs; an error's field is prefixed with the index: ``[2].regex``."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise RelabelConfigError(f"relabel configs must be a list, got {type(raw).__name__}")
    configs: list[RelabelConfig] = []
    for i, item in enumerate(raw):
        try:
            configs.append(parse_relabel_config(item))
        except RelabelConfigError as exc:
            where = f"[{i}].{exc.field}" if exc.field else f"[{i}]"
            raise RelabelConfigError(exc.message, where) from None
    return tuple(configs)


def rules_to_yaml_dict(cfg: RelabelConfig) -> dict[str, Any]:
    """The YAML form (keys in Prometheus's order) that parses back to an equal config.

    As Prometheus after #18653: ``separator`` and ``replacement`` are always written (an empty one
    is not the default), ``regex`` only when it was given (its anchors stripped).
    """
    out: dict[str, Any] = {}
    if cfg.source_labels:
        out["source_labels"] = list(cfg.source_labels)
    out["separator"] = cfg.separator
    if cfg.regex is not DEFAULT_REGEX:
        out["regex"] = cfg.regex.pattern
    if cfg.modulus:
        out["modulus"] = cfg.modulus
    if cfg.target_label:
        out["target_label"] = cfg.target_label
    out["replacement"] = cfg.replacement
    out["action"] = cfg.action
    return out


# ---------------------------------------------------------------------------------------------
# Processing


class _Builder:
    """Go ``labels.Builder``: base labels, plus labels set and deleted in this pass."""

    __slots__ = ("add", "base", "deleted", "labels")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.base = dict(labels)
        self.add: dict[str, str] = {}
        self.deleted: set[str] = set()

    def get(self, name: str) -> str:
        value = self.add.get(name)
        if value is not None:
            return value
        if name in self.deleted:
            return ""
        return self.base.get(name, "")

    def set(self, name: str, value: str) -> None:
        if value == "":
            self.delete(name)
        else:
            self.add[name] = value  # an existing entry keeps its place, as in Go

    def delete(self, name: str) -> None:
        self.add.pop(name, None)
        self.deleted.add(name)

    def snapshot(self) -> Iterator[tuple[str, str]]:
        """Go ``Builder.Range``: unchanged base labels in order, then the set ones."""
        add, deleted = self.add, self.deleted
        kept = [(n, v) for n, v in self.base.items() if n not in add and n not in deleted]
        return iter(kept + list(add.items()))

    def result(self) -> Labels:
        if not self.add and not self.deleted:
            return self.labels
        add, deleted = self.add, self.deleted
        merged = {n: v for n, v in self.base.items() if n not in deleted and n not in add}
        merged.update(add)
        return tuple(sorted(merged.items()))


def process(labels: Labels, rules: Sequence[RelabelConfig]) -> Labels | None:
    """Apply ``rules`` in order; the relabeled, sorted labels, or None when a rule drops them.

    Pure: ``labels`` is not changed, and when no rule changes anything the same tuple comes back.
    """
    builder = _Builder(labels)
    for cfg in rules:
        if not _relabel(cfg, builder):
            return None
    return builder.result()


def process_traced(labels: Labels, rules: Sequence[RelabelConfig]) -> tuple[Labels | None, int]:
    """``process``, also telling which rule dropped the series: ``(None, index)``, else ``(labels, -1)``.

    For explaining (``gpu-relay test-rules``); the relay's hot path calls ``process``."""
    builder = _Builder(labels)
    for index, cfg in enumerate(rules):
        if not _relabel(cfg, builder):
            return None, index
    return builder.result(), -1


def _relabel(cfg: RelabelConfig, b: _Builder) -> bool:
    sources = cfg.source_labels
    if len(sources) == 1:
        val = b.get(sources[0])
    elif not sources:
        val = ""
    else:
        val = cfg.separator.join([b.get(name) for name in sources])
    action = cfg.action
    if action == "replace":
        if cfg._fast_set and val == "":
            b.set(cfg.target_label, cfg.replacement)
            return True
        index = cfg.regex.submatch_index(val)
        if index is None:
            return True
        target = expand(cfg._target, val, index)
        if is_valid_label_name(target):
            b.set(target, expand(cfg._replacement, val, index))
    elif action == "keep":
        return cfg.regex.matches(val)
    elif action == "drop":
        return not cfg.regex.matches(val)
    elif action == "keepequal":
        return b.get(cfg.target_label) == val
    elif action == "dropequal":
        return b.get(cfg.target_label) != val
    elif action == "hashmod":
        digest = hashlib.md5(val.encode("utf-8"), usedforsecurity=False).digest()
        b.set(cfg.target_label, str(int.from_bytes(digest[8:], "big") % cfg.modulus))
    elif action == "labelmap":
        for name, value in b.snapshot():
            if cfg.regex.matches(name):
                new_name = _replace_all(cfg.regex, name, cfg._replacement)
                if is_valid_label_name(new_name):  # Go would set an empty name; we skip it
                    b.set(new_name, value)
    elif action == "labeldrop":
        for name, _ in b.snapshot():
            if cfg.regex.matches(name):
                b.delete(name)
    elif action == "labelkeep":
        for name, _ in b.snapshot():
            if not cfg.regex.matches(name):
                b.delete(name)
    elif action == "lowercase":
        b.set(cfg.target_label, _go_case(val, upper=False))
    elif action == "uppercase":
        b.set(cfg.target_label, _go_case(val, upper=True))
    return True
