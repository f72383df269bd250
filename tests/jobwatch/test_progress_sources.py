"""jobwatch.progress: every progress source into one Report, and bad input never becoming progress."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobwatch import progress as pg
from jobwatch.progress import BodyTooLarge, ProgressError, Report
from tests.jobwatch import objects as o

T0 = o.T0


def test_upstream_trainer_status_from_trainjob() -> None:
    obj = o.trainjob(trainer_status=o.UPSTREAM_STATUS)
    r = pg.parse_trainer_status(obj["status"]["trainerStatus"], "trainjob_status")
    assert r == Report(
        step=450,
        total_steps=1000,
        ratio=0.45,
        eta_seconds=3600.0,
        epoch=1.35,
        metrics={
            ("loss", "train"): 0.2347,
            ("grad_norm", "train"): 0.91,
            ("learning_rate", "train"): 1.8e-05,
            ("eval_loss", "eval"): 0.31,
        },
        nonfinite=frozenset(),
        reported_at=T0,
        source="trainjob_status",
    )
    assert r.has_progress


def test_rhoai_annotation() -> None:
    r = pg.parse_rhoai_annotation(o.RHOAI_ANNOTATION)
    assert r == Report(
        step=450,
        total_steps=1000,
        ratio=0.45,
        eta_seconds=3600.0,
        epoch=1.35,
        metrics={
            ("loss", "train"): 0.2347,
            ("learning_rate", "train"): 1.8e-05,
            ("grad_norm", "train"): 0.91,
            ("throughput_samples_sec", "train"): 52.1,
            ("eval_loss", "eval"): 0.31,
        },
        nonfinite=frozenset(),
        reported_at=T0,
        source="rhoai_annotation",
        total_epochs=3.0,
        summary="1 hour",
    )


def test_push_body_from_hf_callback() -> None:
    r = pg.validate_push_body(o.HF_CALLBACK_BODY)
    assert r is not None
    assert (r.step, r.total_steps, r.ratio, r.eta_seconds, r.epoch, r.source) == (450, 1000, 0.45, 3600.0, 1.35, "push")
    assert r.reported_at == pytest.approx(T0 + 0.123456)
    assert r.metrics[("epoch", "train")] == 1.35


def _status(**changes: Any) -> dict[str, Any]:
    s = copy.deepcopy(o.UPSTREAM_STATUS)
    for k, v in changes.items():
        if v is _DROP:
            s.pop(k, None)
        else:
            s[k] = v
    return s


def _metrics(*pairs: tuple[Any, Any]) -> dict[str, Any]:
    return _status(metrics=[{"name": n, "value": v} for n, v in pairs])


_DROP = object()

UPSTREAM_OK = [
    ("minimal", {"lastUpdatedTime": "2026-06-12T03:00:00Z"}, {"step": None, "ratio": None, "metrics": {}}),
    ("percent-0", _status(progressPercentage=0), {"ratio": 0.0}),
    ("percent-100", _status(progressPercentage=100), {"ratio": 1.0}),
    ("no-percent", _status(progressPercentage=_DROP), {"ratio": None, "step": 450}),
    ("null-percent", _status(progressPercentage=None), {"ratio": None}),
    ("eta-0", _status(estimatedRemainingSeconds=0), {"eta_seconds": 0.0}),
    ("metrics-null", _status(metrics=None), {"step": None, "metrics": {}}),
    ("step-as-float-text", _metrics(("current_step", "450.0")), {"step": 450}),
    ("step-exponent", _metrics(("current_step", "1e3")), {"step": 1000}),
    ("epoch-falls-back-to-epoch", _metrics(("epoch", "2.5")), {"epoch": 2.5, "metrics": {("epoch", "train"): 2.5}}),
    (
        "nan-loss-is-nonfinite",
        _metrics(("loss", "nan"), ("current_step", "9")),
        {"step": 9, "nonfinite": frozenset({"loss"}), "metrics": {}},
    ),
    ("inf-eval-loss", _metrics(("eval_loss", "-Infinity")), {"nonfinite": frozenset({"eval_loss"})}),
    ("overflow-loss-is-nonfinite", _metrics(("loss", "1e999")), {"nonfinite": frozenset({"loss"})}),
    ("text-metric-dropped", _metrics(("optimizer", "adamw"), ("loss", "0.5")), {"metrics": {("loss", "train"): 0.5}}),
    ("underscore-number-dropped", _metrics(("loss", "1_000")), {"metrics": {}}),
    ("negative-loss-kept", _metrics(("loss", "-0.25")), {"metrics": {("loss", "train"): -0.25}}),
    ("duplicate-last-wins", _metrics(("loss", "0.9"), ("loss", "0.8")), {"metrics": {("loss", "train"): 0.8}}),
    ("eval-prefix-is-eval-phase", _metrics(("eval_accuracy", "0.91")), {"metrics": {("eval_accuracy", "eval"): 0.91}}),
    ("time-with-offset", _status(lastUpdatedTime="2026-06-12T05:00:00+02:00"), {"reported_at": T0}),
    ("time-nanoseconds", _status(lastUpdatedTime="2026-06-12T03:00:00.123456789Z"), {"reported_at": T0 + 0.123456}),
    ("time-lowercase", _status(lastUpdatedTime="2026-06-12t03:00:00z"), {"reported_at": T0}),
    ("unknown-field-ignored", _status(somethingNew=1), {"step": 450}),
    ("max-metrics", _status(metrics=[{"name": f"m{i}", "value": "1"} for i in range(256)]), {"step": None}),
]


@pytest.mark.parametrize(("status", "want"), [r[1:] for r in UPSTREAM_OK], ids=[r[0] for r in UPSTREAM_OK])
def test_upstream_accepts(status: dict[str, Any], want: dict[str, Any]) -> None:
    r = pg.parse_trainer_status(status, "trainjob_status")
    for field, value in want.items():
        got = getattr(r, field)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), field


UPSTREAM_BAD = [
    ("not-an-object", ["x"], "not an object"),
    ("string", '{"progressPercentage": 4}', "not an object"),
    ("no-last-updated", _status(lastUpdatedTime=_DROP), "lastUpdatedTime is required"),
    ("null-last-updated", _status(lastUpdatedTime=None), "lastUpdatedTime is required"),
    ("last-updated-no-zone", _status(lastUpdatedTime="2026-06-12T03:00:00"), "RFC 3339"),
    ("last-updated-date-only", _status(lastUpdatedTime="2026-06-12"), "RFC 3339"),
    ("last-updated-number", _status(lastUpdatedTime=1781233200), "RFC 3339"),
    ("last-updated-month-13", _status(lastUpdatedTime="2026-13-12T03:00:00Z"), "not a valid time"),
    ("percent-101", _status(progressPercentage=101), "outside 0..100"),
    ("percent-negative", _status(progressPercentage=-1), "outside 0..100"),
    ("percent-fraction", _status(progressPercentage=45.5), "not an integer"),
    ("percent-float-whole", _status(progressPercentage=45.0), "not an integer"),
    ("percent-text", _status(progressPercentage="45"), "not an integer"),
    ("percent-bool", _status(progressPercentage=True), "not an integer"),
    ("eta-negative", _status(estimatedRemainingSeconds=-5), "outside"),
    ("eta-over-int32", _status(estimatedRemainingSeconds=2**31), "outside"),
    ("metrics-not-list", _status(metrics={"loss": "1"}), "not a list"),
    ("metric-not-object", _status(metrics=["loss=1"]), "metrics[0]: not an object"),
    ("metric-value-number", _metrics(("loss", 0.5)), "metrics[0].value"),
    ("metric-value-empty", _metrics(("loss", "")), "metrics[0].value"),
    ("metric-value-65", _metrics(("loss", "1" * 65)), "metrics[0].value"),
    ("metric-name-missing", _status(metrics=[{"value": "1"}]), "metrics[0].name"),
    ("metric-name-65", _metrics(("n" * 65, "1")), "metrics[0].name"),
    ("257-metrics", _status(metrics=[{"name": f"m{i}", "value": "1"} for i in range(257)]), "at most 256"),
    ("step-nan-text", _metrics(("current_step", "NaN")), "current_step"),
    ("step-inf-text", _metrics(("current_step", "inf")), "current_step"),
    ("step-negative", _metrics(("current_step", "-3")), "current_step"),
    ("step-fraction", _metrics(("current_step", "4.5")), "not a whole number"),
    ("step-words", _metrics(("current_step", "four")), "not a number"),
    ("step-huge", _metrics(("current_step", "1e30")), "not a whole number"),
    ("total-negative", _metrics(("total_steps", "-1000")), "total_steps"),
    ("epoch-nan", _metrics(("current_epoch", "nan")), "current_epoch"),
    ("epoch-negative", _metrics(("current_epoch", "-0.5")), "current_epoch"),
]


@pytest.mark.parametrize(("status", "reason"), [r[1:] for r in UPSTREAM_BAD], ids=[r[0] for r in UPSTREAM_BAD])
def test_upstream_rejects(status: Any, reason: str) -> None:
    with pytest.raises(ProgressError, match=re.escape(reason)) as info:
        pg.parse_trainer_status(status, "trainjob_status")
    assert info.value.code in pg.ERROR_CODES


def test_unknown_source_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown source"):
        pg.parse_trainer_status(o.UPSTREAM_STATUS, "prometheus")


def _ann(**changes: Any) -> str:
    d = json.loads(o.RHOAI_ANNOTATION)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return json.dumps(d)


RHOAI_OK = [
    (
        "nan-loss-arrives-as-null",
        _ann(trainMetrics={"loss": None, "learning_rate": 1e-5}),
        {"nonfinite": frozenset({"loss"}), "metrics": {("learning_rate", "train"): 1e-5, ("eval_loss", "eval"): 0.31}},
    ),
    (
        "bare-nan-constant-in-metric",
        _ann(trainMetrics={"grad_norm": "x"}).replace('"x"', "NaN"),
        {"nonfinite": frozenset({"grad_norm"})},
    ),
    ("eval-null", _ann(evalMetrics={"eval_loss": None}), {"nonfinite": frozenset({"eval_loss"})}),
    (
        "metric-text-dropped",
        _ann(trainMetrics={"loss": "0.5", "note": "warmup", "flag": True, "nested": {}}),
        {"metrics": {("loss", "train"): 0.5, ("eval_loss", "eval"): 0.31}},
    ),
    ("metrics-absent", _ann(trainMetrics=_DROP, evalMetrics=None), {"metrics": {}}),
    ("no-step-yet", _ann(currentStep=None, totalSteps=_DROP), {"step": None, "total_steps": None}),
    (
        "complete",
        _ann(progressPercentage=100, estimatedRemainingTimeSummary="complete", estimatedRemainingSeconds=0),
        {"ratio": 1.0, "summary": "complete", "eta_seconds": 0.0},
    ),
    ("no-last-updated", _ann(lastUpdatedTime=_DROP), {"reported_at": None, "step": 450}),
    ("epoch-int", _ann(currentEpoch=2), {"epoch": 2.0}),
    ("empty-object", "{}", {"step": None, "ratio": None, "metrics": {}}),
    ("step-0", _ann(currentStep=0), {"step": 0}),
]


@pytest.mark.parametrize(("text", "want"), [r[1:] for r in RHOAI_OK], ids=[r[0] for r in RHOAI_OK])
def test_rhoai_accepts(text: str, want: dict[str, Any]) -> None:
    r = pg.parse_rhoai_annotation(text)
    assert r.source == "rhoai_annotation"
    for field, value in want.items():
        assert getattr(r, field) == value, field


RHOAI_BAD = [
    ("not-json", "{progressPercentage: 45}", "not JSON", ProgressError),
    ("truncated", o.RHOAI_ANNOTATION[:40], "not JSON", ProgressError),
    ("empty", "", "not JSON", ProgressError),
    ("array", "[1, 2]", "not a JSON object", ProgressError),
    ("null", "null", "not a JSON object", ProgressError),
    ("10-mb", '{"currentStep": 1, "pad": "' + "x" * 10_000_000 + '"}', "over 65536 bytes", BodyTooLarge),
    ("just-over-64k", '{"pad": "' + "x" * (64 * 1024) + '"}', "over 65536 bytes", BodyTooLarge),
    ("multibyte-over-64k", '{"pad": "' + "\u00e9" * 33_000 + '"}', "over 65536 bytes", BodyTooLarge),
    ("deep-nesting", "[" * 50_000 + "]" * 50_000, "over", BodyTooLarge),
    ("deep-nesting-under-limit", '{"a":' * 10_000 + "1" + "}" * 10_000, "not JSON", ProgressError),
    ("step-nan-text", _ann(currentStep="NaN"), "currentStep: not an integer", ProgressError),
    (
        "step-nan-constant",
        _ann(currentStep=1).replace('"currentStep": 1', '"currentStep": NaN'),
        "currentStep: NaN",
        ProgressError,
    ),
    ("step-negative", _ann(currentStep=-10), "currentStep: -10 is outside", ProgressError),
    ("step-float", _ann(currentStep=450.5), "currentStep: not an integer", ProgressError),
    ("step-text-number", _ann(currentStep="450"), "currentStep: not an integer", ProgressError),
    ("step-bool", _ann(currentStep=True), "currentStep: not an integer", ProgressError),
    ("total-negative", _ann(totalSteps=-1), "totalSteps", ProgressError),
    ("percent-over-100", _ann(progressPercentage=140), "progressPercentage", ProgressError),
    (
        "percent-infinity",
        _ann(progressPercentage=1).replace('"progressPercentage": 1', '"progressPercentage": Infinity'),
        "progressPercentage: NaN or Infinity",
        ProgressError,
    ),
    ("eta-negative", _ann(estimatedRemainingSeconds=-60), "estimatedRemainingSeconds", ProgressError),
    ("epoch-negative", _ann(currentEpoch=-1.0), "currentEpoch", ProgressError),
    ("epoch-text", _ann(currentEpoch="1.35"), "currentEpoch: not a number", ProgressError),
    ("total-epochs-float", _ann(totalEpochs=2.5), "totalEpochs", ProgressError),
    ("summary-not-string", _ann(estimatedRemainingTimeSummary=5), "estimatedRemainingTimeSummary", ProgressError),
    ("train-metrics-list", _ann(trainMetrics=[1, 2]), "trainMetrics: not an object", ProgressError),
    ("bad-time", _ann(lastUpdatedTime="yesterday"), "lastUpdatedTime", ProgressError),
    ("time-number", _ann(lastUpdatedTime=1781233200), "lastUpdatedTime", ProgressError),
]


@pytest.mark.parametrize(("text", "reason", "error"), [r[1:] for r in RHOAI_BAD], ids=[r[0] for r in RHOAI_BAD])
def test_rhoai_rejects(text: str, reason: str, error: type[ProgressError]) -> None:
    with pytest.raises(error, match=reason) as info:
        pg.parse_rhoai_annotation(text)
    assert info.value.code in pg.ERROR_CODES


def test_rhoai_not_a_string() -> None:
    with pytest.raises(ProgressError, match="not a string"):
        pg.parse_rhoai_annotation(45)  # type: ignore[arg-type]


def _body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


PUSH_NOOP = [
    ("empty-object", b"{}"),
    ("null-status", b'{"trainerStatus": null}'),
    ("json-null", b"null"),
    ("other-keys-only", b'{"status": {"progressPercentage": 4}}'),
]


@pytest.mark.parametrize("body", [r[1] for r in PUSH_NOOP], ids=[r[0] for r in PUSH_NOOP])
def test_push_without_trainer_status_is_a_noop(body: bytes) -> None:
    assert pg.validate_push_body(body) is None


PUSH_BAD = [
    ("not-json", b"progress=45", "not JSON", ProgressError),
    ("not-utf8", b'{"trainerStatus": "\xff"}', "not JSON", ProgressError),
    ("array", b"[]", "not a JSON object", ProgressError),
    ("status-string", b'{"trainerStatus": "45%"}', "not an object", ProgressError),
    (
        "no-last-updated",
        _body({"trainerStatus": {"progressPercentage": 4}}),
        "lastUpdatedTime is required",
        ProgressError,
    ),
    (
        "over-64k",
        _body({"trainerStatus": {"lastUpdatedTime": "2026-06-12T03:00:00Z", "pad": "x" * 65536}}),
        "over 65536 bytes",
        BodyTooLarge,
    ),
    (
        "nan-constant-percent",
        b'{"trainerStatus": {"lastUpdatedTime": "2026-06-12T03:00:00Z", "progressPercentage": NaN}}',
        "NaN",
        ProgressError,
    ),
    ("step-negative", _body({"trainerStatus": _metrics(("current_step", "-1"))}), "current_step", ProgressError),
    (
        "257-metrics",
        _body({"trainerStatus": _status(metrics=[{"name": f"m{i}", "value": "1"} for i in range(257)])}),
        "at most 256",
        ProgressError,
    ),
]


@pytest.mark.parametrize(("body", "reason", "error"), [r[1:] for r in PUSH_BAD], ids=[r[0] for r in PUSH_BAD])
def test_push_rejects(body: bytes, reason: str, error: type[ProgressError]) -> None:
    with pytest.raises(error, match=reason) as info:
        pg.validate_push_body(body)
    assert info.value.code in pg.ERROR_CODES


def test_push_body_at_the_limit_is_read() -> None:
    status = {"lastUpdatedTime": "2026-06-12T03:00:00Z", "pad": ""}
    body = _body({"trainerStatus": status})
    status["pad"] = "x" * (pg.MAX_PUSH_BYTES - len(body))
    body = _body({"trainerStatus": status})
    assert len(body) == pg.MAX_PUSH_BYTES
    assert pg.validate_push_body(body) is not None


CODES = [
    ("not-json", lambda: pg.parse_rhoai_annotation("{"), "not_json"),
    ("not-object", lambda: pg.parse_rhoai_annotation("[]"), "not_object"),
    ("too-large", lambda: pg.parse_rhoai_annotation(" " * 70_000), "too_large"),
    ("wrong-type", lambda: pg.parse_rhoai_annotation('{"currentStep": "5"}'), "wrong_type"),
    ("negative", lambda: pg.parse_rhoai_annotation('{"currentStep": -5}'), "out_of_range"),
    ("nan-constant", lambda: pg.parse_rhoai_annotation('{"currentStep": NaN}'), "nonfinite"),
    ("huge-float", lambda: pg.parse_rhoai_annotation('{"currentEpoch": 1e999}'), "nonfinite"),
    ("nan-text", lambda: pg.parse_trainer_status(_metrics(("current_step", "NaN"))), "nonfinite"),
    ("negative-text", lambda: pg.parse_trainer_status(_metrics(("current_step", "-1"))), "out_of_range"),
    ("bad-time", lambda: pg.parse_trainer_status(_status(lastUpdatedTime="now")), "bad_time"),
    ("missing-time", lambda: pg.parse_trainer_status(_status(lastUpdatedTime=_DROP)), "missing_time"),
    ("bad-metric", lambda: pg.parse_trainer_status(_metrics(("loss", 1.0))), "bad_metric"),
    (
        "too-many",
        lambda: pg.parse_trainer_status(_status(metrics=[{"name": "a", "value": "1"}] * 257)),
        "too_many_metrics",
    ),
]


@pytest.mark.parametrize(("call", "code"), [r[1:] for r in CODES], ids=[r[0] for r in CODES])
def test_error_codes_are_bounded_labels(call: Any, code: str) -> None:
    with pytest.raises(ProgressError) as info:
        call()
    assert info.value.code == code and code in pg.ERROR_CODES


def test_body_too_large_is_a_progress_error() -> None:
    assert issubclass(BodyTooLarge, ProgressError) and issubclass(ProgressError, ValueError)


SELECT = [
    (
        "default-allowlist",
        pg.DEFAULT_ALLOW,
        8,
        [("loss", "train"), ("eval_loss", "eval"), ("learning_rate", "train"), ("grad_norm", "train")],
    ),
    ("custom-order", ("grad_norm", "loss"), 8, [("grad_norm", "train"), ("loss", "train")]),
    ("limit", pg.DEFAULT_ALLOW, 2, [("loss", "train"), ("eval_loss", "eval")]),
    ("unknown-names", ("accuracy",), 8, []),
    ("duplicates-once", ("loss", "loss"), 8, [("loss", "train")]),
    ("limit-zero", pg.DEFAULT_ALLOW, 0, []),
]


@pytest.mark.parametrize(("allow", "limit", "keys"), [r[1:] for r in SELECT], ids=[r[0] for r in SELECT])
def test_select_metrics(allow: tuple[str, ...], limit: int, keys: list[tuple[str, str]]) -> None:
    r = pg.parse_rhoai_annotation(o.RHOAI_ANNOTATION)
    got = pg.select_metrics(r, allow, limit)
    assert list(got) == keys
    assert all(got[k] == r.metrics[k] for k in keys)


FINISHED = [
    ("100-percent", {"ratio": 1.0}, True),
    ("99-percent", {"ratio": 0.99}, False),
    ("rhoai-complete", {"summary": "complete"}, True),
    ("rhoai-complete-early", {"summary": "complete (early stopped)"}, True),
    ("rhoai-early-stopped", {"summary": "early stopped"}, True),
    ("rhoai-failed", {"summary": "failed at 40%"}, False),
    ("rhoai-eta-text", {"summary": "9 days 5 hours"}, False),
    ("nothing", {}, False),
]


@pytest.mark.parametrize(("fields", "want"), [r[1:] for r in FINISHED], ids=[r[0] for r in FINISHED])
def test_report_finished(fields: dict[str, Any], want: bool) -> None:
    assert Report(**fields).finished is want


def test_report_metrics_are_read_only() -> None:
    r = pg.parse_rhoai_annotation(o.RHOAI_ANNOTATION)
    with pytest.raises(TypeError):
        r.metrics[("loss", "train")] = 0.0  # type: ignore[index]


def test_select_metrics_leaves_nonfinite_to_its_own_list() -> None:
    r = pg.parse_rhoai_annotation(_ann(trainMetrics={"loss": None, "grad_norm": 2.0}, evalMetrics={}))
    assert pg.select_metrics(r) == {("grad_norm", "train"): 2.0}
    assert pg.select_nonfinite(r) == ["loss"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "progressPercentage",
    "estimatedRemainingSeconds",
    "currentStep",
    "totalSteps",
    "currentEpoch",
    "totalEpochs",
    "trainMetrics",
    "evalMetrics",
    "lastUpdatedTime",
    "estimatedRemainingTimeSummary",
]


@settings(deadline=None, max_examples=150)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=8))
def test_rhoai_any_json_is_a_report_or_a_progress_error(doc: dict[str, Any]) -> None:
    text = json.dumps(doc)
    try:
        r = pg.parse_rhoai_annotation(text)
    except ProgressError:
        return
    assert r.step is None or (isinstance(r.step, int) and r.step >= 0)
    assert r.ratio is None or 0 <= r.ratio <= 1
    assert all(math.isfinite(v) for v in r.metrics.values())


@settings(deadline=None, max_examples=150)
@given(
    st.dictionaries(
        st.sampled_from(["progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"]),
        JSON_VALUES,
        max_size=4,
    ),
    st.lists(
        st.tuples(st.sampled_from(["current_step", "total_steps", "current_epoch", "loss"]), st.text(max_size=8)),
        max_size=4,
    ),
)
def test_push_any_body_is_a_report_none_or_a_progress_error(
    status: dict[str, Any], pairs: list[tuple[str, str]]
) -> None:
    if pairs:
        status["metrics"] = [{"name": n, "value": v} for n, v in pairs]
    status.setdefault("lastUpdatedTime", "2026-06-12T03:00:00Z")
    try:
        r = pg.validate_push_body(_body({"trainerStatus": status}))
    except ProgressError:
        return
    assert r is not None and r.source == "push"
    assert r.step is None or r.step >= 0
    assert r.ratio is None or 0 <= r.ratio <= 1
