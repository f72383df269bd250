"""jobwatch.tracker: advances, resets, redone steps and the learned stall threshold, on simulated jobs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobwatch.progress import Report
from jobwatch.tracker import CAP_SECONDS, FLOOR_SECONDS, STARTUP_SECONDS, JobTracker
from tests.jobwatch.objects import T0

MIN = 60.0


class Sim:
    """A training job reporting like the HF KubeflowCallback (a post on a step end, at most one per 5 s).

    ``stalled`` records every 30 s sample at which the job's time since its last advance was
    over its threshold: what GPUJobStalled's progress half would see.
    """

    def __init__(self, source: str = "trainjob_status", latency: float = 2.0) -> None:
        self.tr = JobTracker()
        self.source, self.latency = source, latency
        self.t, self.step = T0, 0
        self.last_post = -math.inf
        self.stalled: list[float] = []
        self.events: list[str] = []

    def post(self, step: int | None = None, ratio: float | None = None, reported: float | None = None) -> list[str]:
        self.last_post = self.t
        r = Report(
            step=self.step if step is None and ratio is None else step,
            ratio=ratio,
            reported_at=self.t if reported is None else reported,
            source=self.source,
        )
        ev = self.tr.observe(r, self.t + self.latency)
        self.events += ev
        return ev

    def wait(self, seconds: float) -> None:
        end = self.t + seconds
        s = math.floor(self.t / 30) * 30 + 30
        while s <= end:
            la = self.tr.last_advance
            if la is not None and s - la > self.tr.threshold_seconds(s):
                self.stalled.append(s)
            s += 30
        self.t = end

    def train(self, steps: int, step_s: float) -> None:
        for _ in range(steps):
            self.wait(step_s)
            self.step += 1
            if self.t - self.last_post >= 5:
                self.post()
        if self.last_post != self.t:
            self.post()

    def start(self) -> None:
        self.post()


def test_steady_training_learns_step_time_and_floor() -> None:
    sim = Sim()
    sim.start()
    assert sim.tr.threshold_seconds(sim.t) == STARTUP_SECONDS
    sim.train(3600, 1.0)
    tr = sim.tr
    assert (tr.step, tr.highest_step, tr.resets_total, tr.redone_steps_total) == (3600, 3600, 0, 0)
    assert tr.step_duration_seconds == pytest.approx(1.0)
    assert tr.last_advance == sim.t
    assert tr.threshold_seconds(sim.t) == FLOOR_SECONDS
    assert sim.stalled == []
    assert sim.events[0] == "first" and set(sim.events[1:]) == {"advance"}


@pytest.mark.parametrize(
    ("step_s", "want"),
    [(1.0, FLOOR_SECONDS), (90.0, FLOOR_SECONDS), (120.0, 1200.0), (600.0, 6000.0), (20 * MIN, CAP_SECONDS)],
    ids=["1s-floor", "90s-floor", "2min-10x", "10min-10x", "20min-capped"],
)
def test_ten_times_the_median_step_time(step_s: float, want: float) -> None:
    sim = Sim()
    sim.start()
    sim.train(int(max(40, 4 * 3600 / step_s)), step_s)
    assert sim.tr.step_duration_seconds == pytest.approx(step_s)
    assert sim.tr.threshold_seconds(sim.t) == pytest.approx(want)
    assert sim.stalled == []


def test_nine_minute_checkpoint_every_1000_steps_never_stalls() -> None:
    sim = Sim()
    sim.start()
    for _ in range(6):
        sim.train(1000, 1.0)
        sim.wait(9 * MIN)  # the save: no post while it runs
    sim.train(10, 1.0)
    tr = sim.tr
    assert sim.stalled == []
    assert tr.longest_recovered_pause_seconds == pytest.approx(9 * MIN + 1)
    assert tr.step_duration_seconds == pytest.approx(1.0)
    threshold = tr.threshold_seconds(sim.t)
    assert threshold >= 1.5 * 9 * MIN and threshold == FLOOR_SECONDS


def test_25_minute_eval_survived_once_is_learned() -> None:
    sim = Sim()
    sim.start()
    sim.train(1200, 1.0)  # 20 minutes, inside the 30-minute start-up floor
    sim.wait(25 * MIN)  # the first eval starts at minute 20 and ends at 45: start-up floor, then 15 min
    assert sim.stalled, "a first 25-minute eval after the start-up window is not known yet"
    first_flag, last_advance = sim.stalled[0], sim.tr.last_advance
    assert last_advance is not None
    assert first_flag - last_advance == pytest.approx(FLOOR_SECONDS, abs=31)  # at minute 35
    sim.stalled.clear()
    sim.train(2000, 1.0)
    assert sim.tr.longest_recovered_pause_seconds == pytest.approx(25 * MIN + 1)
    assert sim.tr.threshold_seconds(sim.t) == pytest.approx(1.5 * (25 * MIN + 1))
    sim.wait(25 * MIN)  # the second eval: survived before, never flagged
    sim.train(100, 1.0)
    assert sim.stalled == []


def test_eval_during_startup_window_is_covered_by_the_floor() -> None:
    sim = Sim()
    sim.start()
    sim.train(300, 1.0)
    sim.wait(20 * MIN)  # ends at minute 25, inside the 30-minute floor
    sim.train(300, 1.0)
    assert sim.stalled == []


def test_weekend_stall_flagged_after_threshold() -> None:
    sim = Sim()
    sim.start()
    sim.train(7200, 1.0)
    frozen_at = sim.tr.last_advance
    assert frozen_at is not None
    sim.wait(48 * 3600)
    assert sim.stalled and sim.stalled[0] - frozen_at == pytest.approx(FLOOR_SECONDS, abs=30)
    assert sim.tr.last_advance == frozen_at


def test_rhoai_moving_last_updated_with_frozen_step_is_a_stall() -> None:
    sim = Sim(source="rhoai_annotation")
    sim.start()
    for _ in range(120):  # one hour of polls every 30 s, 30 steps per poll
        sim.wait(30)
        sim.step += 30
        sim.post()
    assert sim.tr.step_duration_seconds == pytest.approx(1.0)
    frozen_at = sim.tr.last_advance
    assert frozen_at is not None
    for _ in range(60):  # the loop hangs; the controller keeps polling and rewriting lastUpdatedTime
        sim.wait(30)
        assert sim.post() == []
    assert sim.tr.last_advance == frozen_at
    assert sim.tr.last_report == sim.t
    assert sim.stalled and sim.stalled[0] - frozen_at == pytest.approx(FLOOR_SECONDS, abs=31)


def test_oom_restart_resuming_from_checkpoint() -> None:
    sim = Sim()
    sim.start()
    sim.train(5400, 1.0)  # checkpoint at 5000, OOM at 5400
    sim.wait(4 * MIN)  # the pod restarts and loads the checkpoint
    sim.step = 5000
    crash_t = sim.t
    assert sim.post() == ["reset"]
    tr = sim.tr
    assert (tr.resets_total, tr.resets_without_progress, tr.step, tr.highest_step) == (1, 1, 5000, 5400)
    assert tr.last_advance == crash_t and tr.started_at == crash_t + sim.latency
    assert tr.threshold_seconds(sim.t) == STARTUP_SECONDS
    sim.train(200, 1.0)
    assert tr.redone_steps_total == 200
    sim.train(400, 1.0)
    assert (tr.redone_steps_total, tr.highest_step, tr.resets_without_progress) == (400, 5600, 0)
    sim.wait(STARTUP_SECONDS)
    assert tr.threshold_seconds(sim.t) == FLOOR_SECONDS


def test_crash_loop_three_resets_without_the_highest_step_moving() -> None:
    sim = Sim()
    sim.start()
    sim.train(5400, 1.0)
    for n in range(1, 4):
        sim.wait(2 * MIN)
        sim.step = 5000
        ev = sim.post()
        assert ev == (["reset", "crash_loop"] if n == 3 else ["reset"])
        sim.train(100, 1.0)  # crashes again at 5100, below the highest step 5400
    tr = sim.tr
    assert (tr.resets_total, tr.resets_without_progress, tr.highest_step) == (3, 3, 5400)
    assert tr.redone_steps_total == 300  # steps 5000-5100 computed three more times


def test_restart_from_scratch_without_checkpoint() -> None:
    sim = Sim()
    sim.start()
    sim.train(500, 1.0)
    sim.step = 0
    assert sim.post() == ["reset"]
    sim.train(600, 1.0)
    assert (sim.tr.redone_steps_total, sim.tr.highest_step, sim.tr.resets_without_progress) == (500, 600, 0)


def test_stale_report_older_than_the_last_is_ignored() -> None:
    tr = JobTracker()
    tr.observe(Report(step=100, reported_at=T0 + 60, source="trainjob_status"), T0 + 61)
    assert tr.observe(Report(step=90, reported_at=T0 + 30, source="trainjob_status"), T0 + 62) == ["stale"]
    assert (tr.step, tr.resets_total, tr.last_report) == (100, 0, T0 + 60)


def test_trainer_clock_is_clamped_to_now() -> None:
    tr = JobTracker()
    tr.observe(Report(step=1, reported_at=T0 + 3600, source="push"), T0)  # the trainer's clock runs an hour ahead
    assert tr.last_advance == T0 and tr.last_report == T0 + 3600


def test_watcher_restart_upstream_keeps_trainer_time_rhoai_uses_now() -> None:
    hours_ago = T0 - 5 * 3600
    up = JobTracker()
    up.observe(Report(step=700, reported_at=hours_ago, source="trainjob_status"), T0)
    assert up.last_advance == hours_ago
    rh = JobTracker()
    rh.observe(Report(step=700, reported_at=hours_ago, source="rhoai_annotation"), T0)
    assert rh.last_advance == T0


def test_moving_last_updated_time_with_frozen_step_never_advances() -> None:
    tr = JobTracker()
    tr.observe(Report(step=10, reported_at=T0, source="push"), T0)
    for i in range(1, 50):
        assert tr.observe(Report(step=10, reported_at=T0 + 10 * i, source="push"), T0 + 10 * i) == []
    assert tr.last_advance == T0 and tr.last_report == T0 + 490


def test_ratio_only_job() -> None:
    tr = JobTracker()
    t = T0
    assert tr.observe(Report(ratio=0.0, reported_at=t, source="push"), t) == ["first"]
    for pct in range(1, 60):
        t += 120
        assert tr.observe(Report(ratio=pct / 100, reported_at=t, source="push"), t) == ["advance"]
    assert tr.step is None and tr.step_duration_seconds is None
    assert tr.advance_interval_seconds == pytest.approx(120)
    assert tr.threshold_seconds(t) == 1200.0
    t += 60
    assert tr.observe(Report(ratio=0.1, reported_at=t, source="push"), t) == ["reset"]
    assert tr.resets_total == 1 and tr.redone_steps_total == 0
    assert tr.observe(Report(ratio=0.2, reported_at=t + 60, source="push"), t + 60) == ["advance"]
    assert tr.resets_without_progress == 1


def test_steps_decide_once_seen_and_a_stepless_report_changes_nothing() -> None:
    tr = JobTracker()
    tr.observe(Report(step=5, ratio=0.05, reported_at=T0, source="push"), T0)
    assert tr.observe(Report(ratio=0.5, reported_at=T0 + 10, source="push"), T0 + 10) == ["no_step"]
    assert tr.step == 5 and tr.ratio == 0.5 and tr.last_advance == T0
    assert tr.observe(Report(step=5, ratio=0.9, reported_at=T0 + 20, source="push"), T0 + 20) == []
    assert tr.observe(Report(reported_at=T0 + 30, source="push"), T0 + 30) == ["no_step"]
    fresh = JobTracker()
    assert fresh.observe(Report(reported_at=T0, source="push"), T0) == ["empty"]
    assert fresh.last_advance is None and fresh.last_report == T0


def test_reported_fields_follow_the_latest_report() -> None:
    tr = JobTracker()
    tr.observe(Report(step=5, total_steps=100, eta_seconds=300.0, epoch=0.1, reported_at=T0, source="push"), T0)
    assert (tr.total_steps, tr.eta_seconds, tr.epoch, tr.source) == (100, 300.0, 0.1, "push")
    tr.observe(Report(step=6, reported_at=None, source="rhoai_annotation"), T0 + 5)
    assert (tr.total_steps, tr.eta_seconds, tr.epoch, tr.source, tr.last_report) == (
        None,
        None,
        None,
        "rhoai_annotation",
        T0 + 5,
    )


THRESHOLD_OVERRIDE = [
    ("override-below-floor", 300.0, 300.0),
    ("override-above-cap", 6 * 3600.0, 6 * 3600.0),
    ("no-override", None, STARTUP_SECONDS),
]


@pytest.mark.parametrize(
    ("override", "want"), [r[1:] for r in THRESHOLD_OVERRIDE], ids=[r[0] for r in THRESHOLD_OVERRIDE]
)
def test_override_replaces_the_rule(override: float | None, want: float) -> None:
    tr = JobTracker()
    tr.observe(Report(step=1, reported_at=T0, source="push"), T0)
    assert tr.threshold_seconds(T0 + 60, override) == want


def test_startup_floor_from_given_start() -> None:
    tr = JobTracker(started_at=T0 - 3600)
    assert tr.threshold_seconds(T0) == FLOOR_SECONDS
    tr.observe(Report(step=1, reported_at=T0, source="push"), T0)
    assert tr.started_at == T0 - 3600 and tr.threshold_seconds(T0) == FLOOR_SECONDS
    assert JobTracker().threshold_seconds(T0) == STARTUP_SECONDS


def test_memory_is_bounded_and_the_median_follows_recent_steps() -> None:
    sim = Sim()
    sim.start()
    sim.train(2000, 1.0)
    sim.train(700, 10.0)  # the job slowed down: 70 posts at 10 s a step
    assert sim.tr.step_duration_seconds == pytest.approx(10.0)
    assert len(sim.tr._durations) == 64 and len(sim.tr._gaps) == 64


def test_a_backwards_clock_is_read_as_the_latest_now() -> None:
    tr = JobTracker()
    tr.observe(Report(step=1, source="rhoai_annotation"), T0 + 100)
    tr.observe(Report(step=2, source="rhoai_annotation"), T0)  # now went back 100 s
    assert tr.last_advance == T0 + 100


def test_bad_reports_counted_logged_once() -> None:
    tr = JobTracker()
    assert tr.note_bad("currentStep: -3 is outside 0..9007199254740992") is True
    assert tr.note_bad("not JSON") is False
    assert (tr.bad_reports_total, tr.last_bad_reason) == (2, "not JSON")


STEPS = st.one_of(st.none(), st.integers(min_value=0, max_value=10_000))
OBS = st.tuples(
    st.floats(min_value=0, max_value=4000),  # seconds since the previous observation
    STEPS,
    st.one_of(st.none(), st.integers(0, 100).map(lambda p: p / 100)),
    st.one_of(st.none(), st.floats(min_value=-7200, max_value=7200)),  # the source clock's offset from now
    st.sampled_from(["trainjob_status", "rhoai_annotation", "push"]),
)


@settings(deadline=None, max_examples=400)
@given(st.lists(OBS, max_size=60), st.floats(min_value=0, max_value=10 * 3600))
def test_invariants(
    observations: list[tuple[float, int | None, float | None, float | None, str]], later: float
) -> None:
    tr = JobTracker()
    now = T0
    for dt, step, ratio, offset, source in observations:
        now += dt
        tr.observe(
            Report(step=step, ratio=ratio, reported_at=None if offset is None else now + offset, source=source), now
        )
        assert tr.last_advance is None or tr.last_advance <= now
        if tr.step is not None:
            assert tr.highest_step is not None and tr.highest_step >= tr.step
        assert tr.redone_steps_total >= 0 and tr.resets_without_progress <= tr.resets_total
        th = tr.threshold_seconds(now)
        assert FLOOR_SECONDS <= th <= CAP_SECONDS
        assert tr.started_at is not None
        if now - tr.started_at < STARTUP_SECONDS:
            assert th >= STARTUP_SECONDS
    assert FLOOR_SECONDS <= tr.threshold_seconds(now + later) <= CAP_SECONDS
