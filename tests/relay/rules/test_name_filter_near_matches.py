"""The literal metric-name filter answers as its regex does for names that nearly match.

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("regex", "literal"), [
    ("up|up", True), ("up|", False), ("|up", False), ("", False), ("u.", False), ("^up$", False),
    (r"u\_p", False), ("(?i)up", False), ("up$", False), ("u+p", False), ("[u]p", False), ("up\n", False),
])
@pytest.mark.parametrize("action", ["keep", "drop"])
def test_a_name_filter_answers_as_the_regex_for_names_that_nearly_match(regex: str, literal: bool, action: str) -> None:
    from relay.rules.relabel import parse_relabel_config, process
    from relay.rules.rule_plan import RulePlan, name_filter, names_of

    rules = [parse_relabel_config({"source_labels": ["__name__"], "regex": regex, "action": action})]
    assert (name_filter(rules[0]) is not None) is literal
    plan = RulePlan(rules)
    for name in ["up", "UP", "Up", "up\n", "\nup", "up ", "u", "upp", "", "ub", "u\np", "up|up", "úp"]:
        labels = (("__name__", name), ("job", "j"))
        want = process(labels, rules)
        assert plan.apply(labels, names_of(labels)) == (None if want is None else (want, names_of(want))), name
