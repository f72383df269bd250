"""One destination's report as a JSON-able dict: what ``/api/v1/cardinality``, ``gpu-relay report``
and the status page show (cardinality, sending state, queue, AMP estimate), from one place.

``sending.state`` is one word of :data:`STATES` (``state_text`` says it for people: "retrying
(queueing)", "blocked by auth (holding)", "rejecting (dropping 4xx)"); ``sending.samples_per_second``
is what was sent (``samples_per_second.out`` stays what the rules kept, the AMP estimate's input);
``sending.dropped_last_hour`` the samples lost in the last hour by reason.

The cardinality snapshot is taken under the pipeline's lock when one is given, so it is consistent
with concurrent ingest (no "dictionary changed size during iteration" under load).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client import Counter

from relay.common.metrics import RelayMetrics
from relay.control.delivery_watch import DeliveryWatch
from relay.control.destinations import Destination, amp_region
from relay.state.cost import ESTIMATE_LEAVES_OUT, prices_for_region


def counter_total(metric: Counter, destination: str) -> float:
    """Sum of a counter's ``_total`` samples for one destination, whatever its other labels."""
    total = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("destination") == destination:
                total += sample.value
    return total


STATES = ("sending", "retrying", "auth_blocked", "rejecting", "dry_run")  # relay.delivery.health's words
STATE_TEXT = {
    "sending": "sending",
    "retrying": "retrying (queueing)",
    "auth_blocked": "blocked by auth (holding)",
    "rejecting": "rejecting (dropping 4xx)",
    "dry_run": "dry run",
}
_STATUS = re.compile(r"HTTP (\d{3})\b")


def delivery_state(dry_run: bool, sender: object) -> str:
    """One of :data:`STATES`: the sender's own ``state()`` where it has one, else derived from the
    last result it records (the latest of ``last_success`` and ``last_error``): a 401/403 is
    ``auth_blocked`` when the sender holds on auth errors (``on_auth_error: hold``), else
    ``rejecting``, as is any other final 4xx; a 5xx, 408, 429 or network error ``retrying``."""
    if dry_run or sender is None:
        return "dry_run"
    own = getattr(sender, "state", None)
    if callable(own):
        state = own()
        if state in STATES:
            return str(state)
    last_success, last_error = _last_success(sender), _last_error(sender)
    if last_error is None or (last_success is not None and last_error[0] < last_success):
        return "sending"
    m = _STATUS.match(last_error[1])
    status = int(m.group(1)) if m else 0
    if status in (401, 403):
        settings = getattr(sender, "settings", None)
        return "auth_blocked" if getattr(settings, "on_auth_error", "drop") == "hold" else "rejecting"
    if 400 <= status < 500 and status not in (408, 429):
        return "rejecting"
    return "retrying"


def _last_error(sender: object) -> tuple[float, str] | None:
    value = getattr(sender, "last_error", None)
    if isinstance(value, tuple) and len(value) == 2:
        return float(value[0]), str(value[1])
    return None


def _last_success(sender: object) -> float | None:
    value = getattr(sender, "last_success", None)
    return float(value) if isinstance(value, int | float) else None


def destination_overview(d: Destination, rm: RelayMetrics, now: float, limit: int = 10,
                         lock: AbstractContextManager[Any] | None = None,
                         snapshot_prices: Callable[[str | None], Any] = prices_for_region,
                         watch: DeliveryWatch | None = None) -> dict[str, Any]:
    """The report of one destination; ``watch`` supplies samples/s sent and the last hour's drops."""
    name = d.config.name
    region = amp_region(d.config.url)
    prices = snapshot_prices(region) if region is not None else None
    with lock if lock is not None else contextlib.nullcontext():
        snap: dict[str, Any] = d.stats.snapshot(limit=limit, price_table=prices)
    if region is None:  # not an AMP workspace: no AMP bill
        snap["estimated_cost"] = None
        snap["estimated_cost_without_rules"] = None
    else:
        for key in ("estimated_cost", "estimated_cost_without_rules"):
            if isinstance(snap.get(key), dict):
                snap[key]["leaves_out"] = ESTIMATE_LEAVES_OUT
    last_success = _last_success(d.sender)
    last_error = _last_error(d.sender)
    state = delivery_state(d.config.dry_run, d.sender)
    queue: dict[str, Any] = {"samples": 0, "bytes": 0, "oldest_age_seconds": None, "max_bytes": None}
    if d.queue is not None:
        samples, nbytes = d.queue.depth()
        oldest = d.queue.oldest_enqueued_at()
        queue = {
            "samples": samples,
            "bytes": nbytes,
            "oldest_age_seconds": None if oldest is None else max(0.0, now - oldest),
            "max_bytes": d.config.queue.max_disk,
        }
    snap["dry_run"] = d.config.dry_run
    snap["url"] = d.config.url
    snap["amp_region"] = region
    snap["credentials"] = d.credentials
    snap["sending"] = {
        "state": state,
        "state_text": STATE_TEXT[state],
        "samples_per_second": 0.0 if watch is None else watch.sent_rate(name),
        "dropped_last_hour": {} if watch is None else watch.drops_last_hour(name),
        "samples_kept": counter_total(rm.samples_kept_total, name),
        "samples_sent": counter_total(rm.samples_sent_total, name),
        "samples_failed": counter_total(rm.samples_failed_total, name),
        "samples_retried": counter_total(rm.samples_retried_total, name),
        "last_success": last_success,
        "last_error": None if last_error is None else {"time": last_error[0], "reason": last_error[1]},
    }
    snap["queue"] = queue
    return snap
