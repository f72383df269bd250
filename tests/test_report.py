from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay.cardinality import DestinationStats
from relay.labels import make
from relay.report import fetch_and_render, render_report


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def snapshot() -> dict[str, Any]:
    clock = Clock()
    stats = DestinationStats("amp", clock=clock)
    util = "DCGM_FI_DEV_GPU_UTIL"
    for i in range(12):
        stats.tracker_in.observe(i, util, make([("__name__", util), ("gpu", str(i % 4)), ("pod", f"p{i}")]))
    out = "DCGM_FI_DEV_GPU_UTIL:30s_without_pod_avg"
    for g in range(4):
        stats.tracker_out.observe(100 + g, out, make([("__name__", out), ("gpu", str(g))]))
    stats.record_samples(1200, 400)
    clock.t += 30  # 1200 in / 30 s = 40/s, 400 out / 30 s = 13.33/s
    stats.record_drop("collision", 3)
    return stats.snapshot(limit=5)


def test_render_report_shows_series_tops_drops_and_cost() -> None:
    text = render_report(snapshot())
    lines = text.splitlines()
    assert lines[0] == "destination amp  (window 3600s)"
    assert lines[4].split() == ["active", "series", "12", "4"]
    assert lines[5].split() == ["samples/s", "40", "13.33"]
    assert any(ln.split() == ["DCGM_FI_DEV_GPU_UTIL", "12", "DCGM_FI_DEV_GPU_UTIL:30s_without_pod_avg", "4"]
               for ln in lines)
    assert any(ln.split() == ["pod", "12", "gpu", "4"] for ln in lines)
    assert any(ln.split() == ["collision", "3", "0"] for ln in lines)
    assert "ingest tier $0.90/10M" in text
    assert "total per month" in text
    assert "free tier not deducted" in text
    assert all(ln == ln.rstrip() for ln in lines)


def test_render_report_handles_empty_destination() -> None:
    text = render_report(DestinationStats("empty", clock=Clock()).snapshot())
    assert "destination empty" in text
    assert text.count("(none)") == 3  # top metrics, top labels, drops


def test_render_report_renders_several_destinations() -> None:
    snap = snapshot()
    other = dict(snap, destination="backup")
    text = render_report({"destinations": [snap, other]})
    assert "destination amp" in text and "destination backup" in text


def test_fetch_and_render_builds_the_cardinality_url() -> None:
    urls: list[str] = []

    def fetch(url: str) -> Mapping[str, Any]:
        urls.append(url)
        return snapshot()

    text = fetch_and_render("http://127.0.0.1:9201/", "amp", 5, fetch=fetch)
    assert urls == ["http://127.0.0.1:9201/api/v1/cardinality?limit=5&destination=amp"]
    assert text.startswith("destination amp")
    fetch_and_render("http://127.0.0.1:9201", None, 10, fetch=fetch)
    assert urls[-1] == "http://127.0.0.1:9201/api/v1/cardinality?limit=10"
