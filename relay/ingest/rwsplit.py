"""Split a RW1 WriteRequest by series without decoding samples: for max_samples_per_send and 413s.

A queued payload is a WriteRequest: TimeSeries (field 1) and MetricMetadata (field 3) messages.
Splitting walks only tags and lengths: the top level, and inside a TimeSeries the fields, to count
its samples (field 2) and histograms (field 4). The label, sample and exemplar bytes are copied,
never parsed. A series with more samples than a chunk may hold is cut into several TimeSeries with
the same labels (exemplars go with the first), which a receiver reads as the same series.
Any byte string concatenation of these units is again one valid WriteRequest.
"""

from __future__ import annotations

from relay.common.protowire import encode_len, fields

_TIMESERIES, _METADATA = 1, 3
_LABELS, _SAMPLES, _EXEMPLARS, _HISTOGRAMS = 1, 2, 3, 4

Unit = tuple[bytes, int]  # encoded top-level field(s), samples in it


def units(payload: bytes) -> list[Unit]:
    """One unit per TimeSeries (with its sample + histogram count); metadata as 0-sample units.
    Raises protowire.WireError on bytes that are not a WriteRequest."""
    out: list[Unit] = []
    for number, wire_type, tag_start, vstart, end in fields(payload, 0, len(payload)):
        n = 0
        if number == _TIMESERIES and wire_type == 2:
            n = sum(1 for f in fields(payload, vstart, end) if f[0] in (_SAMPLES, _HISTOGRAMS))
        out.append((payload[tag_start:end], n))
    return out


def _cut_series(unit: bytes, max_samples: int) -> list[Unit]:
    """A TimeSeries unit with too many samples as several, each with <= max_samples."""
    (_, _, _, vstart, end), = fields(unit, 0, len(unit))
    head: list[bytes] = []
    exemplars: list[bytes] = []
    points: list[bytes] = []
    for number, _, tag_start, _, stop in fields(unit, vstart, end):
        raw = unit[tag_start:stop]
        if number in (_SAMPLES, _HISTOGRAMS):
            points.append(raw)
        elif number == _EXEMPLARS:
            exemplars.append(raw)
        else:
            head.append(raw)
    labels = b"".join(head)
    out: list[Unit] = []
    for i in range(0, len(points), max_samples):
        part = points[i : i + max_samples]
        extra = b"".join(exemplars) if i == 0 else b""
        out.append((encode_len(_TIMESERIES, labels + b"".join(part) + extra), len(part)))
    return out


def chunks(payload: bytes, max_samples: int) -> list[Unit]:
    """The payload as WriteRequests of at most max_samples samples each (metadata rides along with
    the first chunk that has room; a request of metadata only stays one chunk)."""
    max_samples = max(1, max_samples)
    out: list[Unit] = []
    cur: list[bytes] = []
    cur_n = 0
    for raw, n in units(payload):
        parts = _cut_series(raw, max_samples) if n > max_samples else [(raw, n)]
        for praw, pn in parts:
            if cur and cur_n + pn > max_samples:
                out.append((b"".join(cur), cur_n))
                cur, cur_n = [], 0
            cur.append(praw)
            cur_n += pn
    if cur:
        out.append((b"".join(cur), cur_n))
    return out


def halves(payload: bytes) -> tuple[Unit, Unit] | None:
    """Two WriteRequests with about half the samples each; None when it is one unit (one series)."""
    us = units(payload)
    if len(us) < 2:
        return None
    total = sum(n for _, n in us)
    acc = 0
    cut = 1
    for i, (_, n) in enumerate(us[:-1], start=1):
        acc += n
        cut = i
        if acc * 2 >= total:
            break
    left, right = us[:cut], us[cut:]
    return ((b"".join(r for r, _ in left), sum(n for _, n in left)),
            (b"".join(r for r, _ in right), sum(n for _, n in right)))
