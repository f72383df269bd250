"""The status page HTML (issue 10): self-refreshing, no scripts or external assets, everything
escaped, each destination's state and numbers under data-key/data-value."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from relay.control.overview import STATE_TEXT, delivery_state
from relay.control.statuspage import REFRESH_S, render_status_page


def overview(name: str = "amp", **over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "destination": name, "window_seconds": 3600, "url": "https://aps-workspaces.us-east-1.amazonaws.com/w",
        "credentials": "sigv4 region us-east-1, default chain", "dry_run": False,
        "active_series": {"in": 12, "out": 4}, "samples_per_second": {"in": 40.0, "out": 13.5},
        "top_metrics": {"in": [{"metric": "DCGM_FI_DEV_GPU_UTIL", "series": 12}],
                        "out": [{"metric": "DCGM_FI_DEV_GPU_UTIL:30s_avg", "series": 4}]},
        "sending": {"state": "sending", "samples_kept": 1200, "samples_sent": 1100, "samples_failed": 3,
                    "samples_retried": 7, "last_success": 1_000_000.0, "last_error": None},
        "queue": {"samples": 100, "bytes": 4096, "oldest_age_seconds": 3.0, "max_bytes": 1 << 30},
        "estimated_cost": {"total_usd": 12.5, "samples_per_month": 3.5e10, "leaves_out": "queries, HA",
                           "price_table": {"region_note": "us-east-1 list prices"}},
        "estimated_cost_without_rules": {"total_usd": 40.0},
    }
    snap.update(over)
    return snap


class Values(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        key = a.get("data-key")
        if key:
            if a.get("data-value") is not None:
                self.values[key] = str(a["data-value"])
            self._open = key
            self.texts[key] = ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.texts[self._open] += data

    def handle_endtag(self, tag: str) -> None:
        self._open = None


def parse(html: str) -> Values:
    p = Values()
    p.feed(html)
    return p


def test_page_refreshes_itself_and_loads_nothing_from_elsewhere() -> None:
    html = render_status_page([overview()], samples_in=1500, now=1_000_010.0)
    assert html.startswith("<!DOCTYPE html>")
    assert f'<meta http-equiv="refresh" content="{REFRESH_S}">' in html
    tags = parse(html).tags
    assert not [t for t, _ in tags if t in ("script", "img", "link", "iframe")]
    assert all(not (a.get("href") or "").startswith(("http:", "https:", "//")) for _, a in tags)
    assert "/api/v1/write" in html


@pytest.mark.parametrize(("listen", "shown"), [("127.0.0.1:9201", "127.0.0.1:9201"), (":9201", ":9201"),
                                                ("[::1]:9201", "[::1]:9201")])
def test_page_says_where_remote_write_is_received_which_is_not_the_telemetry_port(listen: str, shown: str) -> None:
    """In the sidecar the page is on :9202 and the writes on 127.0.0.1:9201: a bare path reads as "here"."""
    html = render_status_page([overview()], samples_in=1, now=1_000_010.0, write_listen=listen)
    assert f"remote-write in: <code>POST /api/v1/write</code> on <code>{shown}</code>" in html


def test_page_shows_each_destinations_numbers_exactly() -> None:
    p = parse(render_status_page([overview(), overview("vm", estimated_cost=None)], samples_in=1500,
                                 now=1_000_010.0))
    v = p.values
    assert v["amp.samples_in"] == "1500.0" and p.texts["amp.samples_in"] == "1,500"
    assert (v["amp.samples_kept"], v["amp.samples_sent"], v["amp.samples_failed"], v["amp.samples_retried"]) == (
        "1200.0", "1100.0", "3.0", "7.0")
    assert v["amp.queue_samples"] == "100.0" and p.texts["amp.queue_oldest"] == "3 s"
    assert p.texts["amp.queue_bytes"] == "4.0 KiB of 1.0 GiB"
    assert v["amp.active_in"] == "12.0" and v["amp.active_out"] == "4.0"
    assert v["amp.top_in.DCGM_FI_DEV_GPU_UTIL"] == "12.0"
    assert v["amp.top_out.DCGM_FI_DEV_GPU_UTIL:30s_avg"] == "4.0"
    assert v["amp.cost_usd"] == "12.5" and p.texts["amp.cost_usd"] == "$12.50"
    assert v["amp.cost_before_usd"] == "40.0"
    assert p.texts["amp.last_success"] == "1970-01-12 13:46:40 UTC (10 s ago)"
    assert p.texts["amp.last_error"] == "none"
    assert p.texts["amp.state"] == "sending"
    assert "vm.cost_usd" not in v  # not an AMP destination: no estimate


def test_page_escapes_everything_it_shows() -> None:
    evil = "<script>alert(1)</script>"
    html = render_status_page([overview(
        url=f"http://x/?a={evil}",
        top_metrics={"in": [{"metric": f'm"{evil}', "series": 1}], "out": []},
        sending={"state": "rejecting", "state_text": "rejecting (dropping 4xx)", "last_success": None,
                 "last_error": {"time": 1.0, "reason": f"HTTP 400: {evil}"}, "dropped_last_hour": {evil: 3}},
    )], samples_in=0, now=2.0)
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    p = parse(html)
    assert p.texts["amp.state"] == "rejecting (dropping 4xx)"
    assert p.values[f"amp.dropped.{evil}"] == "3.0"
    assert p.texts["amp.last_error"].endswith(f"HTTP 400: {evil}")
    assert p.texts["amp.last_success"] == "never"
    assert re.search(r'class="state rejecting"', html)


def test_page_says_when_the_last_reload_was_refused_and_when_nothing_is_configured() -> None:
    html = render_status_page([], samples_in=0, now=0.0, config_ok=False)
    assert "last reload REFUSED" in html and "No destinations configured." in html


class FakeSender:
    """What a Sender records of its last results (relay.delivery.batch), and its settings."""

    def __init__(self, last_success: float | None, last_error: tuple[float, str] | None,
                 on_auth_error: str | None = None) -> None:
        self.last_success, self.last_error = last_success, last_error
        if on_auth_error is not None:
            self.settings = type("S", (), {"on_auth_error": on_auth_error})()


class StatefulSender(FakeSender):
    def __init__(self, state: str) -> None:
        super().__init__(10.0, None)
        self._state = state

    def state(self) -> str:
        return self._state


@pytest.mark.parametrize(
    ("dry_run", "sender", "state"),
    [
        (True, FakeSender(None, (5.0, "HTTP 503: x")), "dry_run"),
        (False, None, "dry_run"),
        (False, FakeSender(None, None), "sending"),
        (False, FakeSender(10.0, (5.0, "HTTP 503: busy")), "sending"),
        (False, FakeSender(10.0, (12.0, "HTTP 503: busy")), "retrying"),
        (False, FakeSender(10.0, (12.0, "HTTP 429: slow down")), "retrying"),
        (False, FakeSender(None, (1.0, "network error: connection refused")), "retrying"),
        (False, FakeSender(None, (1.0, "HTTP 400: out of order sample")), "rejecting"),
        (False, FakeSender(None, (1.0, "HTTP 403: access denied")), "rejecting"),  # on_auth_error: drop
        (False, FakeSender(None, (1.0, "HTTP 403: access denied"), "hold"), "auth_blocked"),
        (False, FakeSender(None, (1.0, "HTTP 401: no"), "hold"), "auth_blocked"),
        (False, StatefulSender("auth_blocked"), "auth_blocked"),  # the sender's own word wins
        (False, StatefulSender("retrying"), "retrying"),
    ],
)
def test_one_state_a_destination_from_its_latest_outcome(dry_run: bool, sender: object, state: str) -> None:
    assert delivery_state(dry_run, sender) == state


@pytest.mark.parametrize("state", sorted(STATE_TEXT))
def test_the_page_says_each_state_in_words(state: str) -> None:
    sending = {**overview()["sending"], "state": state, "state_text": STATE_TEXT[state]}
    p = parse(render_status_page([overview(sending=sending)], samples_in=0, now=2.0))
    assert p.texts["amp.state"] == STATE_TEXT[state]
    assert p.values["amp.state"] == state


def test_samples_out_is_what_was_sent_and_drops_of_the_last_hour_are_shown_by_reason() -> None:
    sending = {**overview()["sending"], "samples_per_second": 0.0,
               "dropped_last_hour": {"http_403": 1200, "queue_full": 40}}
    p = parse(render_status_page([overview(sending=sending)], samples_in=0, now=2.0))
    assert p.values["amp.rate_out"] == "0.0"  # nothing sent, although the rules keep 13.5/s
    assert p.values["amp.rate_kept"] == "13.5"
    assert (p.values["amp.dropped.http_403"], p.values["amp.dropped.queue_full"]) == ("1200.0", "40.0")
    assert parse(render_status_page([overview()], samples_in=0, now=2.0)).texts["amp.dropped"] == "none"
