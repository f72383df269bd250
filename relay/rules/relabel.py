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

Parsing and validation live in :mod:`relay.rules.relabel_config`, the regex and ``$``-template
machinery in :mod:`relay.rules.relabel_regexp`; both are re-exported here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

from relay.common.labels import Labels
from relay.rules.relabel_config import ACTIONS as ACTIONS
from relay.rules.relabel_config import DEFAULT_ACTION as DEFAULT_ACTION
from relay.rules.relabel_config import DEFAULT_REPLACEMENT as DEFAULT_REPLACEMENT
from relay.rules.relabel_config import DEFAULT_SEPARATOR as DEFAULT_SEPARATOR
from relay.rules.relabel_config import FIELDS as FIELDS
from relay.rules.relabel_config import NameValidation as NameValidation
from relay.rules.relabel_config import RelabelConfig as RelabelConfig
from relay.rules.relabel_config import is_valid_label_name as is_valid_label_name
from relay.rules.relabel_config import is_valid_legacy_label_name as is_valid_legacy_label_name
from relay.rules.relabel_config import is_valid_legacy_target as is_valid_legacy_target
from relay.rules.relabel_config import parse_relabel_config as parse_relabel_config
from relay.rules.relabel_config import parse_relabel_configs as parse_relabel_configs
from relay.rules.relabel_config import rules_to_yaml_dict as rules_to_yaml_dict
from relay.rules.relabel_config import validate as validate
from relay.rules.relabel_regexp import DEFAULT_REGEX as DEFAULT_REGEX
from relay.rules.relabel_regexp import Regexp as Regexp
from relay.rules.relabel_regexp import RelabelConfigError as RelabelConfigError
from relay.rules.relabel_regexp import Template as Template
from relay.rules.relabel_regexp import _go_case, _replace_all
from relay.rules.relabel_regexp import compile_template as compile_template
from relay.rules.relabel_regexp import expand as expand


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
