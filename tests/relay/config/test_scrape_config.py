"""The ``scrape:`` section: Prometheus's keys and defaults, errors naming line and field."""

from __future__ import annotations

import pytest

from relay.config import scrape as config_scrape
from relay.config.config import ConfigError, parse_config

BASE = "destinations: [{name: d, url: 'http://127.0.0.1:9/api/v1/write'}]\nscrape:\n  - job_name: gpu\n"


def test_scrape_keys_default_as_prometheus_and_reach_the_targets() -> None:
    config = parse_config(BASE + "    static_configs: [{targets: ['h:9400']}]\n")
    (job,) = config.scrape
    assert parse_config(BASE + "    sample_limit: 0\n").scrape[0].sample_limit == 0  # Prometheus's "none"
    assert (job.honor_labels, job.honor_timestamps, job.sample_limit, job.label_limit) == (False, True, 0, 0)
    config = parse_config(BASE + "    honor_labels: true\n    honor_timestamps: false\n    sample_limit: 5\n"
                          "    label_limit: 9\n    label_name_length_limit: 7\n    label_value_length_limit: 6\n"
                          "    static_configs: [{targets: ['h:9400']}]\n")
    (target,) = config_scrape.scrape_targets(config.scrape)
    assert (target.url, target.honor_labels, target.honor_timestamps) == ("http://h:9400/metrics", True, False)
    assert (target.sample_limit, target.label_limit, target.label_name_length_limit,
            target.label_value_length_limit) == (5, 9, 7, 6)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("    sample_limit: -1\n", "relay.yaml:4: scrape[0].sample_limit: must be a positive integer"),
        ("    label_limit: many\n", "relay.yaml:4: scrape[0].label_limit:"),
        ("    honor_labels: maybe\n", "relay.yaml:4: scrape[0].honor_labels:"),
        ("    metric_relabel_configs: []\n", "relay.yaml:4: scrape[0].metric_relabel_configs: unknown key"),
    ],
)
def test_bad_scrape_keys_name_line_and_field(extra: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + extra)
    assert any(line.startswith(error) for line in str(info.value).splitlines()), str(info.value)
