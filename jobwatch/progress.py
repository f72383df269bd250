"""Training progress from every source, normalised into one :class:`Report`; pure, no I/O.

Sources: the upstream Kubeflow Trainer ``TrainJob.status.trainerStatus`` (:func:`parse_trainer_status`,
``source="trainjob_status"``), the same shape POSTed to our push endpoint (:func:`validate_push_body`,
``source="push"``), and the RHOAI 3.4 annotation ``trainer.opendatahub.io/trainerStatus``
(:func:`parse_rhoai_annotation`, ``source="rhoai_annotation"``).

Contract: a report is never invented. Each parser returns a whole valid report or raises
:class:`ProgressError` (a ``ValueError``) with a short reason; the caller counts it and logs it once.

- **Fields that void the whole report when present and bad**: the step, total steps, epoch,
  total epochs, progress percentage, ETA and ``lastUpdatedTime``; wrong JSON type, a fraction
  where an integer belongs, a negative value, a percentage outside 0-100, ``NaN``/``Infinity``
  (as a JSON constant or, upstream, as the metric text ``"nan"``), a time that is not RFC 3339
  with a zone. Also: input over the size limit, not JSON, not an object, a metric list entry
  that is not ``{name, value}`` strings of 1-64 characters, more than 256 metrics.
- **Absent fields** read as None. Upstream's ``lastUpdatedTime`` is required (the CRD's rule);
  the annotation's is optional.
- **Free-form metrics** (``loss``, ``eval_loss``, ...) never void a report: a finite number goes to
  ``metrics``; NaN, Inf or (RHOAI) ``null`` puts the name in ``nonfinite``; any other value (text,
  a boolean, an object) is dropped.

``metrics`` is keyed by ``(name, phase)`` with phase ``"train"`` or ``"eval"``: RHOAI's
``evalMetrics`` are eval, its ``trainMetrics`` train; upstream names starting ``eval_`` are eval.
Upstream's ``current_step``, ``total_steps`` and ``current_epoch`` metrics become the typed fields
(``epoch`` stands in for ``current_epoch`` when that is absent) and are not kept as metrics.
``ratio`` is only ``progressPercentage / 100``; it is never derived from the step.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

MAX_PUSH_BYTES = 64 * 1024  # upstream's status server limit
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_METRICS = 256
MAX_METRIC_TEXT = 64
INT32_MAX = 2**31 - 1
STEP_MAX = 2**53  # steps beyond this lose precision as a float sample
DEFAULT_ALLOW = ("loss", "eval_loss", "learning_rate", "grad_norm")
SOURCES = ("trainjob_status", "rhoai_annotation", "push")

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")
_TYPED = {"current_step", "total_steps", "current_epoch"}
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


ERROR_CODES = (
    "not_json",
    "not_object",
    "too_large",
    "wrong_type",
    "out_of_range",
    "nonfinite",
    "bad_time",
    "missing_time",
    "bad_metric",
    "too_many_metrics",
)


class ProgressError(ValueError):
    """A progress input that cannot be used; ``str()`` is a short reason naming the field.

    ``code`` is one of :data:`ERROR_CODES`, a bounded value fit for a metric label (the reason
    text carries the bad value and is for the log only).
    """

    def __init__(self, reason: str, code: str = "wrong_type") -> None:
        super().__init__(reason)
        self.code = code


class BodyTooLarge(ProgressError):
    """An input over its byte limit (the push endpoint answers 413, not 422)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "too_large")


@dataclass(frozen=True)
class Report:
    """One progress report. ``metrics`` is read-only, keyed ``(name, phase)``; ``nonfinite`` holds names only."""

    step: int | None = None
    total_steps: int | None = None
    ratio: float | None = None  # 0..1
    eta_seconds: float | None = None
    epoch: float | None = None
    metrics: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (name, phase) -> finite value
    nonfinite: frozenset[str] = frozenset()
    reported_at: float | None = None  # unix seconds of lastUpdatedTime
    source: str = "trainjob_status"
    total_epochs: float | None = None
    summary: str | None = None  # RHOAI estimatedRemainingTimeSummary ("complete", "failed at 40%", ...)

    @property
    def has_progress(self) -> bool:
        return self.step is not None or self.ratio is not None

    @property
    def finished(self) -> bool:
        """Progress 100 %, or RHOAI's summary says complete or early stopped (not "failed at N%")."""
        summary = (self.summary or "").strip().lower()
        return self.ratio == 1.0 or summary.startswith("complete") or summary == "early stopped"


class _Bad:
    """Stands for a JSON ``NaN``/``Infinity`` constant, so that it can be told from a number."""


_BAD = _Bad()


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=lambda _c: _BAD)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProgressError(f"{what} is not JSON ({type(e).__name__})", "not_json") from None


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    if v is _BAD:
        raise ProgressError(f"{name}: NaN or Infinity", "nonfinite")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProgressError(f"{name}: not an integer ({type(v).__name__})")
    if not lo <= v <= hi:
        raise ProgressError(f"{name}: {v} is outside {lo}..{hi}", "out_of_range")
    return v


def _float(v: Any, name: str) -> float:
    if v is _BAD:
        raise ProgressError(f"{name}: NaN or Infinity", "nonfinite")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProgressError(f"{name}: not a number ({type(v).__name__})")
    f = float(v)
    if not math.isfinite(f):
        raise ProgressError(f"{name}: {v} is not a finite number", "nonfinite")
    if f < 0:
        raise ProgressError(f"{name}: {v} is negative", "out_of_range")
    return f


def _parse_text(text: str) -> float | None:
    """A decimal number's text as a float (math.nan for NaN/Inf text), None for anything else."""
    if _NONFINITE.fullmatch(text):
        return math.nan
    return float(text) if _NUMBER.fullmatch(text) else None


def _text_number(text: str, name: str) -> float:
    """A metric's string value as a float; ProgressError for text that is not a finite number >= 0."""
    f = _parse_text(text)
    if f is None:
        raise ProgressError(f"{name}: {text[:64]!r} is not a number")
    if not math.isfinite(f):
        raise ProgressError(f"{name}: {text[:64]!r} is not a finite number", "nonfinite")
    if f < 0:
        raise ProgressError(f"{name}: {text[:64]!r} is negative", "out_of_range")
    return f


def _text_int(text: str, name: str) -> int:
    f = _text_number(text, name)
    if f != int(f) or f > STEP_MAX:
        raise ProgressError(f"{name}: {text[:64]!r} is not a whole number")
    return int(f)


def parse_time(v: Any, name: str = "lastUpdatedTime") -> float:
    """Unix seconds of an RFC 3339 time with a zone (``Z`` or ``+hh:mm``; up to 9 fraction digits)."""
    if not isinstance(v, str) or not _RFC3339.fullmatch(v):
        raise ProgressError(f"{name}: not an RFC 3339 time", "bad_time")
    text = v.upper().replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:  # datetime takes at most 6 fraction digits in every form; keep microseconds
        digits = re.match(r"\d+", rest)
        assert digits is not None
        text = f"{head}.{digits.group()[:6].ljust(6, '0')}{rest[digits.end() :]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ProgressError(f"{name}: {v[:40]!r} is not a valid time", "bad_time") from None


def _free_metric(value: Any) -> float | None:
    """A free-form metric value as a finite float, math.nan for NaN/Inf/null, None to drop it."""
    if value is None or value is _BAD:
        return math.nan
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else math.nan
    if isinstance(value, str):
        f = _parse_text(value)
        return f if f is None or math.isfinite(f) else math.nan
    return None


def _metric_text(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_METRIC_TEXT:
        raise ProgressError(f"{what}: not a string of 1..{MAX_METRIC_TEXT} characters", "bad_metric")
    return v


def parse_trainer_status(obj: Any, source: str = "trainjob_status") -> Report:
    """The upstream ``TrainerStatus`` dict (``status.trainerStatus``, or a push body's) as a Report."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    if not isinstance(obj, Mapping):
        raise ProgressError(f"trainerStatus: not an object ({type(obj).__name__})", "not_object")
    if obj.get("lastUpdatedTime") is None:
        raise ProgressError("lastUpdatedTime is required when trainerStatus is present", "missing_time")
    reported_at = parse_time(obj["lastUpdatedTime"])
    pct = obj.get("progressPercentage")
    ratio = None if pct is None else _int(pct, "progressPercentage", 0, 100) / 100
    eta = obj.get("estimatedRemainingSeconds")
    eta_s = None if eta is None else float(_int(eta, "estimatedRemainingSeconds", 0, INT32_MAX))
    raw = obj.get("metrics")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ProgressError(f"metrics: not a list ({type(raw).__name__})")
    if len(raw) > MAX_METRICS:
        raise ProgressError(f"metrics: {len(raw)} items, at most {MAX_METRICS}", "too_many_metrics")
    values: dict[str, str] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ProgressError(f"metrics[{i}]: not an object", "bad_metric")
        values[_metric_text(item.get("name"), f"metrics[{i}].name")] = _metric_text(
            item.get("value"), f"metrics[{i}].value"
        )  # duplicates: the last wins
    step = None if "current_step" not in values else _text_int(values["current_step"], "current_step")
    total = None if "total_steps" not in values else _text_int(values["total_steps"], "total_steps")
    epoch_key = "current_epoch" if "current_epoch" in values else "epoch" if "epoch" in values else None
    epoch = None if epoch_key is None else _text_number(values[epoch_key], epoch_key)
    metrics: dict[tuple[str, str], float] = {}
    nonfinite: set[str] = set()
    for name, text in values.items():
        if name in _TYPED:
            continue
        f = _free_metric(text)
        if f is not None and math.isnan(f):
            nonfinite.add(name)
        elif f is not None:
            metrics[(name, "eval" if name.startswith("eval_") else "train")] = f
    return Report(
        step, total, ratio, eta_s, epoch, MappingProxyType(metrics), frozenset(nonfinite), reported_at, source
    )


def _opt_int(obj: Mapping[str, Any], key: str, hi: int) -> int | None:
    v = obj.get(key)
    return None if v is None else _int(v, key, 0, hi)


def parse_rhoai_annotation(text: str) -> Report:
    """The RHOAI ``trainer.opendatahub.io/trainerStatus`` annotation's JSON as a Report."""
    if not isinstance(text, str):
        raise ProgressError(f"annotation: not a string ({type(text).__name__})")
    if len(text) > MAX_ANNOTATION_BYTES or len(text.encode("utf-8", "replace")) > MAX_ANNOTATION_BYTES:
        raise BodyTooLarge(f"annotation: over {MAX_ANNOTATION_BYTES} bytes")
    obj = _loads(text, "annotation")
    if not isinstance(obj, Mapping):
        raise ProgressError(f"annotation: not a JSON object ({type(obj).__name__})", "not_object")
    pct = _opt_int(obj, "progressPercentage", 100)
    eta = _opt_int(obj, "estimatedRemainingSeconds", INT32_MAX)
    step = _opt_int(obj, "currentStep", STEP_MAX)
    total = _opt_int(obj, "totalSteps", STEP_MAX)
    total_epochs = _opt_int(obj, "totalEpochs", INT32_MAX)
    epoch = None if obj.get("currentEpoch") is None else _float(obj["currentEpoch"], "currentEpoch")
    summary = obj.get("estimatedRemainingTimeSummary")
    if summary is not None and not isinstance(summary, str):
        raise ProgressError("estimatedRemainingTimeSummary: not a string")
    when = obj.get("lastUpdatedTime")
    reported_at = None if when is None or when == "" else parse_time(when)
    metrics: dict[tuple[str, str], float] = {}
    nonfinite: set[str] = set()
    for key, phase in (("trainMetrics", "train"), ("evalMetrics", "eval")):
        m = obj.get(key)
        if m is None:
            continue
        if not isinstance(m, Mapping):
            raise ProgressError(f"{key}: not an object ({type(m).__name__})")
        for name, value in m.items():
            if not 1 <= len(name) <= MAX_METRIC_TEXT or len(metrics) + len(nonfinite) >= MAX_METRICS:
                continue  # names beyond the limits are dropped, like a value we cannot read
            f = _free_metric(value)
            if f is not None and math.isnan(f):
                nonfinite.add(name)
            elif f is not None:
                metrics[(name, phase)] = f
    return Report(
        step=step,
        total_steps=total,
        ratio=None if pct is None else pct / 100,
        eta_seconds=None if eta is None else float(eta),
        epoch=epoch,
        metrics=MappingProxyType(metrics),
        nonfinite=frozenset(nonfinite),
        reported_at=reported_at,
        source="rhoai_annotation",
        total_epochs=None if total_epochs is None else float(total_epochs),
        summary=summary or None,
    )


def validate_push_body(body: bytes) -> Report | None:
    """A push request's ``UpdateTrainJobStatusRequest`` body; None when it has no ``trainerStatus`` (a no-op)."""
    if len(body) > MAX_PUSH_BYTES:
        raise BodyTooLarge(f"body: over {MAX_PUSH_BYTES} bytes")
    obj = _loads(body, "body")
    if obj is None:  # Go decodes a JSON null into the zero request: no trainerStatus, a no-op
        return None
    if not isinstance(obj, Mapping):
        raise ProgressError(f"body: not a JSON object ({type(obj).__name__})", "not_object")
    status = obj.get("trainerStatus")
    return None if status is None else parse_trainer_status(status, "push")


def select_metrics(
    report: Report, allow: Sequence[str] = DEFAULT_ALLOW, limit: int = 8
) -> dict[tuple[str, str], float]:
    """The report's finite metrics whose name is allowed, in ``allow`` order, at most ``limit``."""
    out: dict[tuple[str, str], float] = {}
    for name in dict.fromkeys(allow):
        for phase in ("train", "eval"):
            if (name, phase) in report.metrics and len(out) < limit:
                out[(name, phase)] = report.metrics[(name, phase)]
    return out


def select_nonfinite(report: Report, allow: Sequence[str] = DEFAULT_ALLOW) -> list[str]:
    """The allowed names reported as NaN/Inf/null, in ``allow`` order."""
    return [n for n in dict.fromkeys(allow) if n in report.nonfinite]
