"""The ``scrape:`` section (agent mode): each job parsed into a :class:`ScrapeConfig`, and the
scrape targets the scraper runs.

Contract: the keys are a subset of Prometheus's ``scrape_config`` with its defaults
(``honor_labels`` false, ``honor_timestamps`` true, limits 0 = none); an unknown key, a timeout
above the interval, a bad path, scheme or ``host:port`` is an error naming its line and field.
"""

from __future__ import annotations

from yaml.nodes import Node, ScalarNode

from relay.config import parts
from relay.config.model import ScrapeConfig
from relay.config.yamlnodes import Reader
from relay.ingest.scrape import ScrapeTarget

SCRAPE_KEYS = ("job_name", "scrape_interval", "scrape_timeout", "metrics_path", "scheme", "static_configs",
               "honor_labels", "honor_timestamps", "sample_limit", "label_limit", "label_name_length_limit",
               "label_value_length_limit")  # fmt: skip
LIMIT_KEYS = ("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit")


def parse_scrape(r: Reader, node: Node, path: str) -> ScrapeConfig:
    m = r.mapping(node, path, SCRAPE_KEYS)
    if m is None:
        return ScrapeConfig("")
    job = r.required_string(m, node, path, "job_name")
    if job == "":
        r.error(m["job_name"], f"{path}.job_name", "must not be empty")
    interval = r.duration(m.get("scrape_interval"), f"{path}.scrape_interval", 15.0, positive=True)
    timeout = r.duration(
        m.get("scrape_timeout"), f"{path}.scrape_timeout", min(10.0, interval), positive=True
    )
    if "scrape_timeout" in m and timeout > interval:
        r.error(m["scrape_timeout"], f"{path}.scrape_timeout", "must not be greater than scrape_interval")
    metrics_path = r.string(m.get("metrics_path"), f"{path}.metrics_path", "/metrics")
    if not metrics_path.startswith("/"):
        r.error(m["metrics_path"], f"{path}.metrics_path", 'must start with "/"')
    scheme = r.string(m.get("scheme"), f"{path}.scheme", "http")
    if scheme not in ("http", "https"):
        r.error(m["scheme"], f"{path}.scheme", f'must be "http" or "https", got "{scheme}"')
    targets: list[str] = []
    for sc, sp in r.sequence(m.get("static_configs"), f"{path}.static_configs"):
        if (scm := r.mapping(sc, sp, ("targets",))) is not None:
            for target, tn, tp in r.string_items(r.require(scm, sc, sp, "targets"), f"{sp}.targets"):
                if parts.check_host_port(r, tn, tp, target):
                    targets.append(target)
    limits = {}
    for key in LIMIT_KEYS:  # 0 is Prometheus's "no limit"; below it the reader's error
        n = m.get(key)
        limits[key] = 0 if isinstance(n, ScalarNode) and n.value == "0" else r.integer(n, f"{path}.{key}", 0)
    return ScrapeConfig(
        job or "", interval, timeout, tuple(targets), metrics_path, scheme,
        honor_labels=r.boolean(m.get("honor_labels"), f"{path}.honor_labels", False),
        honor_timestamps=r.boolean(m.get("honor_timestamps"), f"{path}.honor_timestamps", True),
        **limits,
    )


def scrape_targets(jobs: tuple[ScrapeConfig, ...]) -> list[ScrapeTarget]:
    """One :class:`ScrapeTarget` a ``static_configs`` address of each job."""
    return [
        ScrapeTarget(job=s.job_name, url=f"{s.scheme}://{t}{s.metrics_path}", interval_s=s.scrape_interval,
                     timeout_s=s.scrape_timeout, honor_labels=s.honor_labels,
                     honor_timestamps=s.honor_timestamps, sample_limit=s.sample_limit,
                     label_limit=s.label_limit, label_name_length_limit=s.label_name_length_limit,
                     label_value_length_limit=s.label_value_length_limit)
        for s in jobs
        for t in s.targets
    ]
