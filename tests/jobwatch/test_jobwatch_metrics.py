"""What /metrics shows: the series and their labels, every progress source, conditions, malformed
progress counted and logged once, exempt jobs, the metric allowlist, and a job's series going
away 15 minutes after it ends (with a clock the test moves)."""

from __future__ import annotations

import json
import logging
import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwatch.health import Health
from jobwatch.metrics import FAMILIES, render
from jobwatch.state import State
from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod, trainer_status, trainjob, trainjob_pod
from tests.jobwatch.rig import Clock, Running, jobwatch

RHOAI = "trainer.opendatahub.io/trainerStatus"


@pytest.fixture()
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2, max_watch_s=3) as f:
        yield f


def rhoai(step: int, *, at: str = "2026-06-12T03:00:00Z", loss: object = 0.2347) -> str:
    return json.dumps({"progressPercentage": step // 10, "estimatedRemainingSeconds": 3600, "currentStep": step,
                       "totalSteps": 1000, "currentEpoch": 1.35, "totalEpochs": 3,
                       "trainMetrics": {"loss": loss, "learning_rate": 1.8e-05, "grad_norm": 0.91,
                                        "throughput_samples_sec": 52.1},
                       "evalMetrics": {"eval_loss": 0.31}, "lastUpdatedTime": at})


def test_exposition_is_valid_text_with_the_issue_names_and_no_job_label(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", trainjob_pod("llama", 0))
    fake.apply("pods", trainjob_pod("llama", 1, node="gpu-node-2"))
    fake.apply("trainjobs", trainjob("llama", status=trainer_status(450)))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_step", 450, job_name="llama")
        fake.apply("pods", trainjob_pod("llama", 2))
        r.wait_value("gpu_jobwatch_events_total", 1, resource="pods", type="ADDED")
        text = r.scrape_text()
        names = {f.name for f in text_string_to_metric_families(text)}
        for want in ("gpu_pod_job_info", "gpu_pod_gpus_requested", "gpu_pod_main_container_terminated",
                     "gpu_job_progress_step", "gpu_job_progress_total_steps", "gpu_job_progress_ratio",
                     "gpu_job_progress_last_report_timestamp_seconds",
                     "gpu_job_progress_last_advance_timestamp_seconds", "gpu_job_stall_threshold_seconds",
                     "gpu_job_progress_resets", "gpu_job_redone_steps", "gpu_job_progress_resets_without_advance",
                     "gpu_job_metric", "gpu_job_metric_nonfinite", "gpu_job_condition",
                     "gpu_job_progress_source_info", "gpu_job_exempt", "gpu_jobwatch_watch_up",
                     "gpu_jobwatch_events", "gpu_jobwatch_build_info"):
            assert want in names, want
        assert "_created" not in text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                assert "job" not in s.labels
        assert r.value("gpu_pod_job_info", pod="llama-node-0-1-x1", job_kind="TrainJob", job_name="llama",
                       rank="1", Hostname="gpu-node-2", namespace="ml") == 1
        with urllib.request.urlopen(r.url + "/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")


def test_upstream_trainer_status_series(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", trainjob_pod("llama", 0))
    st = trainer_status(450, at="2026-06-12T03:00:00Z")
    st["estimatedRemainingSeconds"] = 3600
    st["metrics"] += [{"name": "current_epoch", "value": "1.35"}, {"name": "eval_loss", "value": "0.31"},
                      {"name": "grad_norm", "value": "nan"}, {"name": "train_runtime", "value": "12"}]
    fake.apply("trainjobs", trainjob("llama", status=st))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_step", 450, job_name="llama")
        s = r.scrape()
        jl = {("namespace", "ml"), ("job_kind", "TrainJob"), ("job_name", "llama")}
        one = {n: v for n, series in s.items() for ls, v in series.items() if ls == jl}
        assert one["gpu_job_progress_total_steps"] == 1000
        assert one["gpu_job_progress_ratio"] == 0.45
        assert one["gpu_job_progress_eta_seconds"] == 3600
        assert one["gpu_job_progress_epoch"] == 1.35
        assert one["gpu_job_progress_last_report_timestamp_seconds"] == 1781233200
        assert one["gpu_job_progress_last_advance_timestamp_seconds"] == 1781233200
        assert one["gpu_job_stall_threshold_seconds"] == 1800  # the 30-minute start-up floor
        metrics = {dict(ls)["name"] + "/" + dict(ls)["phase"]: v for ls, v in s["gpu_job_metric"].items()}
        assert metrics == {"loss/train": 0.25, "eval_loss/eval": 0.31}  # allowlist; train_runtime is not on it
        nonfinite = {dict(ls)["name"]: v for ls, v in s["gpu_job_metric_nonfinite"].items()}
        assert nonfinite == {"loss": 0, "eval_loss": 0, "grad_norm": 1}
        conds = {dict(ls)["condition"]: v for ls, v in s["gpu_job_condition"].items()}
        assert conds == {"Complete": 0, "Failed": 0, "Suspended": 0}


def test_rhoai_annotation_frozen_step_never_advances(fake: FakeAPIServer, tmp_path: Path) -> None:
    clock = Clock()
    fake.apply("pods", trainjob_pod("rh", 0))
    fake.apply("trainjobs", trainjob("rh", annotations={RHOAI: rhoai(450, loss=None)}))
    with jobwatch(fake, tmp_path, clock=clock) as r:
        r.wait_value("gpu_job_progress_step", 450, job_name="rh")
        assert r.value("gpu_job_progress_source_info", job_name="rh", source="rhoai_annotation") == 1
        assert r.value("gpu_job_metric_nonfinite", job_name="rh", name="loss") == 1  # NaN arrives as null
        first_advance = r.value("gpu_job_progress_last_advance_timestamp_seconds", job_name="rh")
        for minute in range(1, 4):  # the controller keeps polling; the loop is hung
            clock.advance(60)
            fake.apply("trainjobs", trainjob("rh", annotations={RHOAI: rhoai(450, at=f"2026-06-12T03:0{minute}:00Z")}))
            r.wait_value("gpu_job_progress_last_report_timestamp_seconds", 1781233200 + 60 * minute, job_name="rh")
        assert r.value("gpu_job_progress_last_advance_timestamp_seconds", job_name="rh") == first_advance


def test_status_wins_over_the_annotation(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("trainjobs", trainjob("both", status=trainer_status(700), annotations={RHOAI: rhoai(100)}))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_step", 700, job_name="both")
        assert r.value("gpu_job_progress_source_info", job_name="both", source="trainjob_status") == 1


@pytest.mark.parametrize(("kind", "bad", "code"), [
    ("annotation", "{not json", "not_json"),
    ("annotation", json.dumps({"currentStep": -5}), "out_of_range"),
    ("annotation", json.dumps({"currentStep": "NaN"}), "wrong_type"),
    ("annotation", "x" * (10 << 20), "too_large"),
    ("annotation", '{"currentStep": NaN}', "nonfinite"),
    ("status", {"lastUpdatedTime": "2026-06-12T03:00:00Z", "progressPercentage": "45"}, "wrong_type"),
    ("status", {"lastUpdatedTime": "2026-06-12T03:00:00Z", "metrics": [{"name": "current_step", "value": "nan"}]},
     "nonfinite"),
    ("status", {"lastUpdatedTime": "2026-06-12T03:00:00Z", "metrics": [{"name": "current_step", "value": "-5"}]},
     "out_of_range"),
    ("status", {"lastUpdatedTime": "2026-06-12T03:00:00Z", "metrics": [{"name": "loss", "value": "x" * (10 << 20)}]},
     "too_large"),
    ("status", {"progressPercentage": 45}, "missing_time"),
])
def test_malformed_progress_is_counted_logged_once_and_never_invents_progress(
        fake: FakeAPIServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, bad: object,
        code: str) -> None:
    caplog.set_level(logging.WARNING, logger="jobwatch")
    fake.apply("pods", trainjob_pod("bad", 0))
    source = "rhoai_annotation" if kind == "annotation" else "trainjob_status"

    def bad_job(i: int) -> dict[str, object]:
        if kind == "annotation":
            return trainjob("bad", annotations={RHOAI: str(bad) + " " * i})
        return trainjob("bad", status={**bad, "estimatedRemainingSeconds": i})  # type: ignore[dict-item]

    fake.apply("trainjobs", bad_job(0))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_jobwatch_progress_errors_total", 1, source=source, reason=code)
        fake.apply("trainjobs", bad_job(1))
        fake.apply("trainjobs", bad_job(2))
        fake.apply("trainjobs", trainjob("bad", annotations={"unrelated": "change"}) if kind == "status"
                   else bad_job(2))  # the same bad text again is not counted again
        r.wait_value("gpu_jobwatch_progress_errors_total", 3, source=source, reason=code)
        assert r.value("gpu_job_progress_step", job_name="bad") is None  # nothing invented
        assert r.value("gpu_job_progress_source_info", job_name="bad", source=source) is None
        logged = [m for m in caplog.messages if "malformed progress" in m]
        assert len(logged) == 1 and "bad" in logged[0]
        kept = r.app.state.trainjobs[("ml", "bad")]
        assert len(kept.status_raw or "") <= 64 and len(kept.annotation_raw or "") <= 64  # a digest, not 10 MB
        assert r.app.pods.running and r.value("gpu_jobwatch_watch_up", resource="trainjobs") == 1
        good = {"status": trainer_status(300)} if kind == "status" else {"annotations": {RHOAI: rhoai(300)}}
        fake.apply("trainjobs", trainjob("bad", **good))
        r.wait_value("gpu_job_progress_step", 300, job_name="bad")
        fake.apply("trainjobs", bad_job(3))  # a bad report after a good one keeps the last good state
        r.wait_value("gpu_jobwatch_progress_errors_total", 4, source=source, reason=code)
        assert r.value("gpu_job_progress_step", job_name="bad") == 300


def test_a_step_going_backwards_counts_a_reset(fake: FakeAPIServer, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobwatch")
    fake.apply("trainjobs", trainjob("rs", status=trainer_status(500, at="2026-06-12T03:00:00Z")))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_step", 500, job_name="rs")
        fake.apply("trainjobs", trainjob("rs", status=trainer_status(400, at="2026-06-12T03:10:00Z")))
        r.wait_value("gpu_job_progress_resets_total", 1, job_name="rs")
        assert r.value("gpu_job_progress_max_step", job_name="rs") == 500
        assert r.value("gpu_job_progress_resets_without_advance", job_name="rs") == 1
        fake.apply("trainjobs", trainjob("rs", status=trainer_status(450, at="2026-06-12T03:11:00Z")))
        r.wait_value("gpu_job_redone_steps_total", 50, job_name="rs")
        for i, step in enumerate((300, 350, 200, 250, 100)):  # a reporter flapping: counted each time
            fake.apply("trainjobs", trainjob("rs", status=trainer_status(step, at=f"2026-06-12T03:2{i}:00Z")))
        r.wait_value("gpu_job_progress_resets_total", 4, job_name="rs")
        went_back = [m for m in caplog.messages if "went back" in m]
        assert len(went_back) == 1 and "rs" in went_back[0]  # and logged once per job


def test_conditions_exempt_and_stall_after(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", gpu_pod("nb-0", labels={"pod-template-hash": "h1"}, owner=("ReplicaSet", "nb-h1"),
                               annotations={"gpu-telemetry.io/exempt": "true"}))
    fake.apply("trainjobs", trainjob("s", status=trainer_status(10), conditions={"Suspended": True},
                                     annotations={"gpu-telemetry.io/stall-after": "45m"}))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_exempt", 1, job_kind="Deployment", job_name="nb")
        r.wait_value("gpu_job_condition", 1, job_name="s", condition="Suspended")
        assert r.value("gpu_job_exempt", job_name="s") == 0
        assert r.value("gpu_job_stall_threshold_seconds", job_name="s") == 2700


def test_finished_job_holding_gpus_shows_it(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", trainjob_pod("fin", 0, terminated=True))
    fake.apply("trainjobs", trainjob("fin", status=trainer_status(1000, pct=100), conditions={"Complete": True}))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_finished", 1, job_name="fin")
        assert r.value("gpu_pod_main_container_terminated", job_name="fin") == 1
        assert r.value("gpu_job_condition", job_name="fin", condition="Complete") == 1
        assert r.value("gpu_pod_job_info", job_name="fin") == 1  # still holds its GPUs


def test_series_go_15_minutes_after_the_job_ends(fake: FakeAPIServer, tmp_path: Path) -> None:
    clock = Clock()
    fake.apply("pods", trainjob_pod("done", 0))
    fake.apply("trainjobs", trainjob("done", status=trainer_status(990)))
    fake.apply("pods", gpu_pod("job-0", labels={"batch.kubernetes.io/job-name": "bj"}, owner=("Job", "bj")))
    with jobwatch(fake, tmp_path, clock=clock) as r:
        r.wait_value("gpu_job_progress_step", 990, job_name="done")
        r.wait_value("gpu_job_exempt", 0, job_name="bj")
        fake.apply("trainjobs", trainjob("done", status=trainer_status(1000, pct=100), conditions={"Complete": True}))
        fake.delete("pods", "ml", "done-node-0-0-x0")
        fake.apply("pods", gpu_pod("job-0", labels={"batch.kubernetes.io/job-name": "bj"}, owner=("Job", "bj"),
                                   phase="Succeeded"))
        r.wait_for(lambda: r.value("gpu_pod_job_info", job_name="bj") is None
                   and r.value("gpu_pod_job_info", job_name="done") is None, what="pods gone")
        r.wait_value("gpu_job_progress_step", 1000, job_name="done")
        clock.advance(14 * 60 + 50)
        assert r.value("gpu_job_progress_step", job_name="done") == 1000  # the final state is still scraped
        assert r.value("gpu_job_exempt", job_name="bj") == 0
        clock.advance(15)
        assert r.value("gpu_job_progress_step", job_name="done") is None
        assert r.value("gpu_job_condition", job_name="done", condition="Complete") is None
        assert r.value("gpu_job_exempt", job_name="bj") is None
        clock.advance(3600)  # the TrainJob stays in the API, Complete: it does not come back
        seen = r.value("gpu_jobwatch_events_total", resource="trainjobs", type="MODIFIED") or 0
        fake.apply("trainjobs", trainjob("done", status=trainer_status(1000, pct=100), conditions={"Complete": True},
                                         annotations={"touched": "yes"}))
        fake.apply("trainjobs", trainjob("done", status=trainer_status(1000, pct=100, at="2026-06-12T04:00:00Z"),
                                         conditions={"Complete": True}, annotations={RHOAI: "{late"}))
        r.wait_value("gpu_jobwatch_events_total", seen + 2, resource="trainjobs", type="MODIFIED")
        assert r.value("gpu_job_exempt", job_name="done") is None  # neither a late status nor a bad one
        assert r.value("gpu_job_progress_step", job_name="done") is None
        assert ("ml", "TrainJob", "done") not in {(w.namespace, w.kind, w.name) for w in r.app.state.jobs}
        fake.apply("pods", trainjob_pod("done", 0))  # it runs again
        r.wait_value("gpu_job_exempt", 0, job_name="done")


def test_metric_allowlist_flag_and_limit(fake: FakeAPIServer, tmp_path: Path) -> None:
    st = trainer_status(5)
    st["metrics"] += [{"name": f"m{i}", "value": str(i)} for i in range(12)]
    fake.apply("trainjobs", trainjob("many", status=st))
    allow = ",".join(f"m{i}" for i in range(12))
    with jobwatch(fake, tmp_path, "--metrics-allowlist", allow) as r:
        r.wait_value("gpu_job_progress_step", 5, job_name="many")
        names = sorted(dict(ls)["name"] for ls in r.scrape()["gpu_job_metric"])
        assert names == sorted(f"m{i}" for i in range(8))  # at most 8 a job, in allowlist order


def test_render_of_5000_pods_is_fast_enough_to_do_per_change() -> None:
    health = Health()
    state = State(health=health, clock=lambda: 1_781_233_200.0)
    items = []
    for j in range(500):
        for i in range(10):
            rec = state.pods_sink.convert(trainjob_pod(f"job{j}", i, node=f"n{j}"))
            items.append(rec)
    state.pods_sink.replace(items)
    for j in range(500):
        state.trainjobs_sink.upsert(trainjob(f"job{j}", status=trainer_status(j)))
    body = render(state, health.snapshot(), 1_781_233_200.0)
    assert body.count(b"\ngpu_pod_job_info{") + body.startswith(b"gpu_pod_job_info{") == 5000
    assert health.snapshot().progress_errors == {}
    assert not any(math.isnan(float(line.rsplit(b" ", 1)[1])) for line in body.splitlines()
                   if line and not line.startswith(b"#"))
    assert set(FAMILIES) >= {line.split()[2].decode() for line in body.splitlines() if line.startswith(b"# TYPE")}


def test_health_and_ready(fake: FakeAPIServer, tmp_path: Path) -> None:
    with jobwatch(fake, tmp_path) as r:
        r.wait_for(lambda: r.app.pods.synced.is_set())
        for path in ("/health", "/ready", "/"):
            with urllib.request.urlopen(r.url + path, timeout=5) as resp:
                assert resp.status == 200


def test_ready_is_503_until_pods_are_listed(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.set_mode("forbidden")
    with jobwatch(fake, tmp_path) as r:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(r.url + "/ready", timeout=5)
        assert err.value.code == 503
        with urllib.request.urlopen(r.url + "/health", timeout=5) as resp:  # liveness: the process is fine
            assert resp.status == 200


def running_sanity(r: Running) -> None:  # pragma: no cover - helper kept for interactive debugging
    print(r.scrape_text())
