"""What ``gpu-relay test-rules`` says about one series: sent as what, dropped by which rule, or
aggregated into which output series.

The stateless stages come from :meth:`relay.rules.Rules.trace`; aggregation from the destination's
``aggregate`` rules, matched on the series after ``prune_labels`` as in the pipeline. A series is
taken for a counter when its name ends in ``_total`` (the running relay also reads the metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.common.labels import METRIC_NAME, Labels
from relay.config.config import Config
from relay.rules.selector import parse_selector
from relay.state.aggregate import AggregateRule, output_name
from relay.state.ruleset import Rules


@dataclass(frozen=True)
class Outcome:
    sent: Labels | None  # what the destination is sent, when it is sent as it is
    dropped_by: str | None = None  # "global.relabel_configs[1] (drop)", "no metric name", ...
    aggregated_by: str | None = None  # "destinations[amp].aggregate[0]"
    aggregated_into: tuple[Labels, ...] = ()  # the output series it feeds


class Explainer:
    """The rules of one destination of ``config`` (by name or index; raises UnknownDestinationError)."""

    def __init__(self, config: Config, destination: str | int) -> None:
        self.rules = Rules(config)
        self.index = self.rules.index(destination)
        dest = config.destinations[self.index]
        self.name = dest.name
        self._aggregates = tuple(
            AggregateRule(parse_selector(a.match), a.interval, tuple(a.outputs), tuple(a.without), tuple(a.by))
            for a in dest.aggregate
        )

    def explain(self, labels: Labels) -> Outcome:
        out, reason = self.rules.trace(self.index, labels)
        if out is None:
            return Outcome(None, dropped_by=reason)
        for i, rule in enumerate(self._aggregates):
            if rule.match.matches(out):
                group = rule.group(out)
                metric = next((v for n, v in group if n == METRIC_NAME), "")
                outputs = rule.effective_outputs(metric.endswith("_total"))
                into = tuple(
                    tuple((n, output_name(metric, rule, o)) if n == METRIC_NAME else (n, v) for n, v in group)
                    for o in outputs
                )
                return Outcome(None, aggregated_by=f"destinations[{self.name}].aggregate[{i}]", aggregated_into=into)
        return Outcome(out)
