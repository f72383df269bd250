"""Prometheus ``relabel_config`` as data: the parsed rule, its defaults, label-name checks and
``validate`` with Prometheus's messages (``prometheus/model/relabel``'s ``Config.Validate``).

``parse_relabel_config(s)`` turn parsed YAML into validated, frozen ``RelabelConfig`` values (strict
keys, Prometheus's defaults, an explicit empty value kept as empty); ``rules_to_yaml_dict`` writes
one back. Applying rules to labels is :mod:`relay.rules.relabel`, which re-exports these names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import re2

from relay.rules.relabel_regexp import _RE2_OPTIONS, _go_quote
from relay.rules.relabel_regexp import DEFAULT_REGEX as DEFAULT_REGEX
from relay.rules.relabel_regexp import Regexp as Regexp
from relay.rules.relabel_regexp import RelabelConfigError as RelabelConfigError
from relay.rules.relabel_regexp import Template as Template
from relay.rules.relabel_regexp import compile_template as compile_template

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
            snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", str(key)).lower()
            hint = (f"did you mean {snake}? (camelCase is the prometheus-operator's) "
                    if snake in FIELDS and snake != key else "")
            raise RelabelConfigError(
                f"unknown field {key!r} in relabel config: {hint}(allowed: {', '.join(FIELDS)})", str(key)
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
