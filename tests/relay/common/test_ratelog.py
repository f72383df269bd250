"""RateLimitedLog: one line per key per interval, with the count of what it did not log."""

from __future__ import annotations

import logging

import pytest

from relay.common.ratelog import RateLimitedLog


def test_each_key_logs_at_once_then_once_per_interval_with_the_suppressed_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("t.ratelog"), interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.ratelog"):
        assert rl.warning(("amp", "http_500"), "amp: HTTP %d", 500, extra={"destination": "amp"})
        assert not rl.warning(("amp", "http_500"), "amp: HTTP %d", 500)
        assert rl.warning(("amp", "network"), "amp: network")  # another reason: its own line
        now[0] = 59.9
        assert not rl.warning(("amp", "http_500"), "amp: HTTP %d", 500)
        now[0] = 60.0
        assert rl.warning(("amp", "http_500"), "amp: HTTP %d", 503)
        now[0] = 200.0
        assert rl.warning(("amp", "http_500"), "amp: HTTP %d", 500)
    msgs = [(r.getMessage(), getattr(r, "suppressed", None)) for r in caplog.records]
    assert msgs == [
        ("amp: HTTP 500", 0),
        ("amp: network", 0),
        ("amp: HTTP 503 (2 more like this in the last 60s not logged)", 2),
        ("amp: HTTP 500", 0),
    ]
    assert getattr(caplog.records[0], "destination", None) == "amp"
