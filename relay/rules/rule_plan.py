"""A relabel rule list with a bounded memo of its effect, for the relay's uncached path.

Without ``labelmap``, what ``relabel.process`` does to a label set depends only on the set's label
NAMES and the values of the labels the rules READ (every ``source_labels``, and the
``target_label`` of ``keepequal``/``dropequal``): each rule reads values through the builder's
``get`` of those names, ``labeldrop``/``labelkeep`` look at names only, and every value a rule sets
is computed from what it read. So the effect (dropped, or: which labels are deleted, which are set
to what) is memoised per (names, read labels): a series whose pair is known costs a dict probe and
a C-level ``itemgetter`` instead of one regex call per rule and per label. ``labelmap`` (which
copies values it does not read) and label sets with unsorted or duplicate names go through
``process`` itself. The first series of each key is decided by ``process``'s own builder, so the
memo can only repeat what the reference did for the same names and read values: it never changes
a result. Bounded: at most ``MAX_EFFECTS`` effects per rule list (then the memo starts over).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence

from relay.common.labels import METRIC_NAME, Labels
from relay.rules.relabel import RelabelConfig, _Builder, _relabel, process

Names = tuple[str, ...]
MAX_EFFECTS = 4_096  # memoised effects per rule list
MAX_NAMES = 100  # label sets with more names are not memoised (their names tuple would be large)
MAX_KEY_CHARS = 512  # effects whose read values are longer in all are not memoised
EFFECT_BYTES = 700  # measured (tracemalloc) per memoised effect: key pairs, getter, output names
PLAN_BYTES = 300  # per memoised names tuple (its dict, the getter)

Getter = Callable[[Labels], Labels]
Reader = Getter  # the labels the rules read, as the effect memo's key
# an effect: None (dropped), _SAME (unchanged: the input tuple itself), or a _Change


class _Same:
    __slots__ = ()


_SAME = _Same()


class _Change:
    """The output: ``kept`` picks it, in order, from the input labels followed by ``added`` (the
    labels set); ``names`` are its names."""

    __slots__ = ("added", "kept", "names")

    def __init__(self, kept: Getter, added: Labels, names: Names) -> None:
        self.kept = kept
        self.added = added
        self.names = names


Effect = _Change | _Same | None


class _NamesPlan:
    """For one tuple of names: how to read the rules' inputs, and the effects seen so far."""

    __slots__ = ("effects", "read")

    def __init__(self, read: Reader | None) -> None:
        self.read = read
        self.effects: dict[Labels, Effect] = {}


_NO_PLAN = _NamesPlan(None)  # names unsorted or duplicated: the reference decides


def _getter(index: Sequence[int]) -> Getter:
    """A function returning the tuple of ``labels[i]`` for ``i`` in ``index``."""
    if not index:
        return lambda labels: ()
    if len(index) == 1:
        i = index[0]
        return lambda labels: (labels[i],)
    return operator.itemgetter(*index)


def names_of(labels: Labels) -> Names:
    return tuple([p[0] for p in labels])


_LITERAL = re.compile(r"[A-Za-z0-9_:]+")  # characters RE2 only ever matches as themselves


def name_filter(rule: RelabelConfig) -> tuple[bool, frozenset[str]] | None:
    """For a ``keep``/``drop`` on ``[__name__]`` alone whose regex is an alternation of literal metric
    names: (keep, the names). Its anchored regex then matches exactly those strings, so the rule
    drops a series iff ``(metric name in names) != keep`` (an absent name reads as "", which is not
    among them). None for any other rule."""
    if rule.action not in ("keep", "drop") or rule.source_labels != (METRIC_NAME,):
        return None
    alternatives = rule.regex.pattern.split("|")
    if not all(_LITERAL.fullmatch(a) for a in alternatives):
        return None
    return rule.action == "keep", frozenset(alternatives)


class RulePlan:
    """``process(labels, rules)`` for sorted label sets whose names are given, memoised."""

    __slots__ = ("_count", "_filter", "_plans", "memoised", "reads", "rules")

    def __init__(self, rules: Sequence[RelabelConfig]) -> None:
        self.rules = tuple(rules)
        self.memoised = all(r.action != "labelmap" for r in self.rules)
        reads: list[str] = []
        for r in self.rules:
            reads.extend(r.source_labels)
            if r.action in ("keepequal", "dropequal"):
                reads.append(r.target_label)
        self.reads: Names = tuple(dict.fromkeys(reads))
        self._plans: dict[Names, _NamesPlan] = {}
        self._count = 0  # effects memoised over all plans
        # the first rule, where it keeps or drops by literal metric names: answered by a set probe
        self._filter = name_filter(self.rules[0]) if self.rules else None

    def memo_bytes(self) -> int:
        return self._count * EFFECT_BYTES + len(self._plans) * PLAN_BYTES

    def apply(self, labels: Labels, names: Names) -> tuple[Labels, Names] | None:
        """``process(labels, self.rules)`` and the result's names (``names`` are ``labels``'s)."""
        if not self.rules:
            return labels, names
        f = self._filter
        if f is not None and names.count(METRIC_NAME) <= 1:  # (one value to read, as the rule reads it)
            try:
                metric = labels[names.index(METRIC_NAME)][1]
            except ValueError:
                metric = ""
            if (metric in f[1]) != f[0]:
                return None  # the first rule drops it
        plan = self._plans.get(names) if self.memoised and len(names) <= MAX_NAMES else _NO_PLAN
        if plan is None:
            plan = self._plan(names)
        if plan is _NO_PLAN:
            out = process(labels, self.rules)
            return None if out is None else (out, names if out is labels else names_of(out))
        key = () if plan.read is None else plan.read(labels)
        try:
            effect = plan.effects[key]
        except KeyError:
            effect = self._learn(labels, names, plan, key)
        if effect is None:
            return None
        if effect is _SAME:
            return labels, names
        assert isinstance(effect, _Change)
        return effect.kept(labels + effect.added if effect.added else labels), effect.names

    def _plan(self, names: Names) -> _NamesPlan:
        if not all(names[i - 1] < names[i] for i in range(1, len(names))):
            plan = _NO_PLAN
        else:
            index = [names.index(r) for r in self.reads if r in names]
            plan = _NamesPlan(None if not index else _getter(index))
        if len(self._plans) >= MAX_EFFECTS:
            self._reset()
        self._plans[names] = plan
        return plan

    def _reset(self) -> None:
        self._plans.clear()
        self._count = 0

    def _learn(self, labels: Labels, names: Names, plan: _NamesPlan, key: Labels) -> Effect:
        """The reference's own builder decides; its end state (what it deleted and set) is the effect."""
        builder = _Builder(labels)
        effect: Effect
        for cfg in self.rules:
            if not _relabel(cfg, builder):
                effect = None
                break
        else:
            if not builder.add and not builder.deleted:
                effect = _SAME
            else:
                gone = builder.deleted | builder.add.keys()
                added = tuple(sorted(builder.add.items()))
                # (name, index in labels + added) of the output, sorted by name
                order = sorted([(n, i) for i, n in enumerate(names) if n not in gone]
                               + [(n, len(names) + j) for j, (n, _) in enumerate(added)])
                effect = _Change(_getter([i for _, i in order]), added, tuple([n for n, _ in order]))
        if sum([len(p[1]) for p in key]) > MAX_KEY_CHARS:
            return effect  # long values: decided, not memoised
        if self._count >= MAX_EFFECTS:  # start over (keeping this plan)
            self._reset()
            plan.effects.clear()
            self._plans[names] = plan
        self._count += 1
        plan.effects[key] = effect
        return effect
