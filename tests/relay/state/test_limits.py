from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.common.labels import Labels, make
from relay.state.limits import AmpLimits, CollisionDetector, SeriesLimiter, amp_violation
from relay.state.series_tracker import SeriesTracker


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lbl(metric: str, **kw: str) -> Labels:
    return make([("__name__", metric), *kw.items()])


class Harness:
    def __init__(self, max_series: int | None, per_metric: int | None, window: float = 60.0) -> None:
        self.clock = Clock()
        self.tracker = SeriesTracker(window, self.clock)
        self.drops: list[tuple[str, str]] = []
        self.log = logging.getLogger("test_limits")
        self.limiter = SeriesLimiter("amp", max_series, per_metric, self.tracker,
                                     lambda m, limit: self.drops.append((m, limit)),
                                     log=self.log, clock=self.clock)

    def admit(self, sid: int, metric: str = "m", pod: str = "p") -> bool:
        return self.limiter.admit(sid, metric, lambda: lbl(metric, pod=pod))


@pytest.mark.parametrize(("labels", "reason"), [
    (lbl("ok", a="b"), None),
    (make([("__name__", "m"), *((f"l{i:02d}", "v") for i in range(69))]), None),  # 70 labels incl. name
    (make([("__name__", "m"), *((f"l{i:02d}", "v") for i in range(70))]), "max_label_names_per_series"),
    (lbl("m", a="x" * 2048), None),
    (lbl("m", a="x" * 2049), "label_value_too_long"),
    (lbl("m", a="\u00e9" * 1025), "label_value_too_long"),  # 2050 UTF-8 bytes, 1025 characters
    (make([("__name__", "m"), ("n" * 128, "v")]), None),
    (make([("__name__", "m"), ("n" * 129, "v")]), "label_name_too_long"),
    (make([("__name__", "m"), ("1bad", "v")]), "label_invalid"),
    (make([("__name__", "m"), ("a-b", "v")]), "label_invalid"),
    ((("a", "1"),), "missing_metric_name"),
    (lbl("bad-name"), "metric_name_invalid"),
    (lbl("ns:rule:ok"), None),
    ((("__name__", "m"), ("a", "1"), ("a", "2")), "duplicate_label_names"),
])
def test_amp_violation_table(labels: Labels, reason: str | None) -> None:
    assert amp_violation(labels) == reason


def test_amp_limits_are_configurable() -> None:
    assert amp_violation(lbl("m", a="xyz"), AmpLimits(max_value_len=2)) == "label_value_too_long"
    assert amp_violation(lbl("m", a="b", c="d"), AmpLimits(max_labels=2)) == "max_label_names_per_series"


def test_limiter_admits_until_max_series_then_refuses_new() -> None:
    h = Harness(max_series=2, per_metric=None)
    assert h.admit(1) and h.admit(2)
    assert h.admit(3) is False
    assert h.drops == [("m", "max_series")]
    assert h.tracker.active() == 2 and not h.tracker.contains(3)


def test_already_admitted_series_keep_flowing_at_the_limit() -> None:
    h = Harness(max_series=2, per_metric=None)
    h.admit(1)
    h.admit(2)
    assert [h.admit(1), h.admit(2), h.admit(1)] == [True, True, True]
    assert h.drops == []


def test_window_expiry_makes_room_for_a_refused_series() -> None:
    h = Harness(max_series=2, per_metric=None)
    h.admit(1)
    h.admit(2)
    assert h.admit(3) is False
    h.clock.t += 30
    assert h.admit(1)  # keeps 1 alive
    h.clock.t += 31  # series 2 unseen for 61 s
    assert h.tracker.expire() == 1
    assert h.admit(3) is True
    assert h.admit(2) is False  # now 2 is the newcomer
    assert h.drops == [("m", "max_series"), ("m", "max_series")]


def test_per_metric_limit_refuses_only_that_metric() -> None:
    h = Harness(max_series=None, per_metric=1)
    assert h.admit(1, "gpu_util")
    assert h.admit(2, "gpu_util") is False
    assert h.admit(3, "fb_used")
    assert h.drops == [("gpu_util", "max_series_per_metric")]


def test_labels_are_built_only_for_admitted_new_series() -> None:
    h = Harness(max_series=1, per_metric=None)
    calls: list[int] = []

    def labels() -> Labels:
        calls.append(1)
        return lbl("m", pod="x")

    assert h.limiter.admit(1, "m", labels)
    assert h.limiter.admit(1, "m", labels)
    assert h.limiter.admit(2, "m", labels) is False
    assert len(calls) == 1
    assert h.tracker.top_labels(5, "m") == [("pod", 1)]


def test_refusals_logged_once_a_minute_per_metric_with_top_labels(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(max_series=None, per_metric=2)
    h.admit(1, "gpu_util", pod="a")
    h.admit(2, "gpu_util", pod="b")
    with caplog.at_level(logging.WARNING, logger="test_limits"):
        for sid in range(3, 10):
            h.admit(sid, "gpu_util")
        h.clock.t += 59
        h.admit(20, "gpu_util")
        assert len(caplog.records) == 1
        h.clock.t += 2
        h.admit(21, "gpu_util")
    assert len(caplog.records) == 2
    message = caplog.records[0].getMessage()
    assert "max_series_per_metric=2" in message and "gpu_util" in message and "pod=2" in message
    assert len(h.drops) == 9


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_series must be >= 0"):
        SeriesLimiter("amp", -1, None, SeriesTracker(), lambda m, limit: None)


def test_collision_keeps_first_input_and_drops_second(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str]] = []
    det = CollisionDetector(on_collision=lambda d, r: seen.append((d, r)), log=logging.getLogger("coll"))
    out = lbl("gpu_util", gpu="0")
    with caplog.at_level(logging.WARNING, logger="coll"):
        assert det.check("amp", 42, b"pod=a", out, "prune_labels [pod]")
        assert det.check("amp", 42, b"pod=a", out, "prune_labels [pod]")  # same input: fine
        assert det.check("amp", 42, b"pod=b", out, "prune_labels [pod]") is False
        assert det.check("amp", 42, b"pod=c", out, "prune_labels [pod]") is False
    assert seen == [("amp", "prune_labels [pod]")] * 2
    assert det.collisions == {"amp": 2}
    assert len(caplog.records) == 1  # rate-limited
    message = caplog.records[0].getMessage()
    assert "amp" in message and "prune_labels [pod]" in message and 'gpu_util{gpu="0"}' in message
    assert "aggregate" in message


def test_collision_is_per_destination() -> None:
    det = CollisionDetector()
    assert det.check("amp", 1, b"a", lbl("m"), "r")
    assert det.check("other", 1, b"b", lbl("m"), "r")


def test_collision_owner_is_replaced_when_its_output_went_inactive() -> None:
    active = {42}
    det = CollisionDetector(active=lambda d, sid: sid in active)
    assert det.check("amp", 42, b"a", lbl("m"), "r")
    assert det.check("amp", 42, b"b", lbl("m"), "r") is False
    active.clear()
    assert det.check("amp", 42, b"b", lbl("m"), "r")
    active.add(42)
    assert det.check("amp", 42, b"a", lbl("m"), "r") is False


def test_release_and_forget_clear_claims() -> None:
    det = CollisionDetector()
    det.check("amp", 1, b"a", lbl("m"), "r")
    det.release("amp", 1)
    assert det.check("amp", 1, b"b", lbl("m"), "r")
    det.forget("amp")
    assert det.check("amp", 1, b"c", lbl("m"), "r")


_names = st.sampled_from(["__name__", "a", "b_1", "1bad", "a-b", "n" * 129, "", "\u00e9"])
_values = st.sampled_from(["m", "ok:name", "bad-name", "", "x" * 2049, "\u00e9" * 1025, "\u00e9" * 500, "v"])


@settings(max_examples=400)
@given(st.lists(st.tuples(_names, _values), max_size=6))
def test_amp_violation_fast_path_agrees_with_the_label_by_label_check(pairs: list[tuple[str, str]]) -> None:
    from relay.state.limits import _violation

    labels = tuple(sorted(pairs))
    limits = AmpLimits(max_labels=5)
    expected = "max_label_names_per_series" if len(labels) > 5 else _violation(labels, limits)
    assert amp_violation(labels, limits) == expected


def test_collision_owners_first_claim_wins_until_its_owner_leaves() -> None:
    from relay.state.limits import CollisionOwners

    owners = CollisionOwners()
    active = {10, 11}
    assert owners.claim(1, 10, active.__contains__, lambda out: False)
    assert owners.claim(1, 10, active.__contains__, lambda out: False)
    assert owners.claim(1, 11, active.__contains__, lambda out: False) is False
    active.discard(10)
    assert owners.claim(1, 11, active.__contains__, lambda out: False)  # the owner left: taken over
    assert owners.owners == {1: 11}


def test_collision_owners_an_unchanged_series_owns_its_output_implicitly() -> None:
    from relay.state.limits import CollisionOwners

    owners = CollisionOwners()
    out_active = {5}
    # input 5 passes unchanged (output id 5, no entry); a pruned input mapping onto 5 collides
    assert owners.unchanged(5, 5, lambda i: True)
    assert len(owners) == 0
    assert owners.claim(5, 77, lambda i: True, out_active.__contains__) is False
    # the other way round: the pruned input claimed first, the unchanged one collides
    assert owners.claim(6, 77, lambda i: True, lambda out: False)
    assert owners.unchanged(6, 6, lambda i: True) is False
    assert owners.unchanged(6, 6, lambda i: False)  # once the claimant left
    assert len(owners) == 0


def test_collision_owners_expire_with_their_owner() -> None:
    from relay.state.limits import CollisionOwners

    owners = CollisionOwners()
    for out in range(1000):
        owners.claim(out, out + 10_000, lambda i: True, lambda o: False)
    alive = {10_000, 10_001}
    assert owners.expire(alive.__contains__) == 998
    assert owners.owners == {0: 10_000, 1: 10_001}


def test_limiter_log_table_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    from relay.state.limits import MAX_LOGGED_NAMES

    h = Harness(max_series=0, per_metric=None)
    with caplog.at_level(logging.WARNING, logger="test_limits"):
        for i in range(MAX_LOGGED_NAMES + 50):
            h.admit(i, metric=f"m{i}")
    assert len(h.limiter._logged) <= MAX_LOGGED_NAMES
    assert len(caplog.records) == MAX_LOGGED_NAMES
