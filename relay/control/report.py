"""``gpu-relay report``: every destination's ``/api/v1/cardinality`` report as one readable block each.

Without ``--destination`` it shows every destination the relay has (the first answer lists them
all). Each block: where it sends and how it signs, its state (sending, retrying (queueing), blocked
by auth (holding), rejecting (dropping 4xx), dry run), sent, failed and retried samples, queue depth
and oldest age, last success and last error, the samples dropped in the last hour by reason, active
series and rates (in, kept by the rules, out: sent), top metrics and labels (in, then out: one list under the other),
drops, and the AMP bill for AMP destinations only. An error the relay answers (an unknown
destination) is shown in the relay's own words.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay.common.units import format_duration

Fetch = Callable[[str], Mapping[str, Any]]


class ReportError(ValueError):
    """The relay answered with an error (its message), or not with a JSON object."""


def _fetch_json(url: str) -> Mapping[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.loads(resp.read().decode())
    except urllib.error.HTTPError as e:
        raise ReportError(_server_error(e.code, e.read())) from None
    if not isinstance(data, Mapping):
        raise ReportError(f"{url}: expected a JSON object, got {type(data).__name__}")
    return data


def _server_error(status: int, body: bytes) -> str:
    try:
        data = json.loads(body.decode())
    except (ValueError, UnicodeDecodeError):
        first = body.decode("utf-8", "replace").strip().splitlines()
        return f"the relay answered HTTP {status}: {first[0] if first else '(empty body)'}"
    if isinstance(data, Mapping) and "error" in data:
        known = data.get("destinations")
        also = f" (destinations: {', '.join(map(str, known))})" if isinstance(known, list) else ""
        return f"{data['error']}{also}"
    return f"the relay answered HTTP {status}"


def _num(x: float) -> str:
    if x >= 1e9:
        return f"{x / 1e9:.2f}B"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:g} B"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) + f" ({_age(max(0.0, now - ts))} ago)"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        cells_out = [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
        return (indent + "  ".join(cells_out)).rstrip()

    out = [line(headers)]
    out.extend(line(r) for r in rows)
    if not rows:
        out.append(indent + "(none)")
    return out


def _fields(pairs: Sequence[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in pairs)
    return [f"  {k.ljust(width)}  {v}".rstrip() for k, v in pairs]


def _sending(snapshot: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    s = snapshot.get("sending")
    q = snapshot.get("queue")
    out: list[tuple[str, str]] = []
    if isinstance(s, Mapping):
        out.append(("state", str(s.get("state_text", s.get("state", "?")))))
    out.append(("dry_run", "true" if snapshot.get("dry_run") else "false"))
    if snapshot.get("url"):
        out.append(("url", str(snapshot["url"])))
    if snapshot.get("credentials"):
        out.append(("credentials", str(snapshot["credentials"])))
    if isinstance(s, Mapping):
        out += [
            ("samples kept", _num(float(s.get("samples_kept", 0)))),
            ("samples sent", _num(float(s.get("samples_sent", 0)))),
            ("samples failed", _num(float(s.get("samples_failed", 0)))),
            ("samples retried", _num(float(s.get("samples_retried", 0)))),
        ]
    if isinstance(q, Mapping):
        age = q.get("oldest_age_seconds")
        limit = q.get("max_bytes")
        of = f" of {_bytes(float(limit))}" if limit else ""
        oldest = "empty" if age is None else f"oldest {_age(float(age))}"
        out.append(("queue", f"{_num(float(q.get('samples', 0)))} samples, {_bytes(float(q.get('bytes', 0)))}"
                             f"{of}, {oldest}"))
    if isinstance(s, Mapping):
        out.append(("last success", _when(s.get("last_success"), now)))
        err = s.get("last_error")
        out.append(("last error", "none" if not isinstance(err, Mapping)
                    else f"{_when(float(err['time']), now)}: {err['reason']}"))
        drops = s.get("dropped_last_hour")
        if isinstance(drops, Mapping):
            out.append(("dropped, last hour", ", ".join(f"{r} {_num(float(n))}" for r, n in drops.items())
                        or "none"))
    return out


def _sent_rate(snapshot: Mapping[str, Any]) -> float:
    s = snapshot.get("sending")
    return float(s.get("samples_per_second", 0.0)) if isinstance(s, Mapping) else 0.0


def _tops(title: str, key: str, count: str, what: str, section: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for direction in ("in", "out"):
        items = section.get(direction, [])
        lines += ["", f"{title} {direction}",
                  *_table([what, count], [[str(i[key]), _num(int(i[count]))] for i in items])]
    return lines


def render_report(snapshot: Mapping[str, Any], now: float | None = None) -> str:
    """Readable text from one destination's snapshot, or ``{"destinations": [...]}`` of several."""
    now = time.time() if now is None else now
    many = snapshot.get("destinations")
    if isinstance(many, Sequence) and not isinstance(many, str):
        return "\n".join(render_report(s, now) for s in many)
    active = snapshot.get("active_series", {})
    rates = snapshot.get("samples_per_second", {})
    lines = [f"== destination {snapshot.get('destination', '?')} =="]
    lines += _fields([
        *_sending(snapshot, now),
        ("window", format_duration(max(0.0, float(snapshot.get("window_seconds", 0))))),
        ("active series", f"in {_num(active.get('in', 0))}, out {_num(active.get('out', 0))}"),
        ("samples/s", f"in {_num(rates.get('in', 0.0))}, kept {_num(rates.get('out', 0.0))}, "
                      f"out {_num(_sent_rate(snapshot))}"),
    ])
    lines += _tops("top metrics by series,", "metric", "series", "metric", snapshot.get("top_metrics", {}))
    lines += _tops("top labels by distinct values,", "label", "distinct_values", "label",
                   snapshot.get("top_labels", {}))
    dropped = snapshot.get("dropped", {})
    lines += ["", "dropped", *_table(["reason", "series", "samples"], [
        [r, _drop_series(v), _num(v.get("samples", 0))] for r, v in sorted(dropped.items())])]
    if any(_drop_series(v) == "-" for v in dropped.values()):
        lines.append("  series -: counted in samples only (rules, aggregation, a full queue)")
    cost = snapshot.get("estimated_cost")
    if isinstance(cost, Mapping):
        lines += ["", *_render_cost(cost, snapshot.get("estimated_cost_without_rules"))]
    elif "estimated_cost" in snapshot:
        lines += ["", "no AMP bill: not an Amazon Managed Prometheus workspace URL"]
    return "\n".join(lines) + "\n"


def _drop_series(drop: Mapping[str, Any]) -> str:
    """The series a drop counted, or ``-`` for the reasons the relay counts in samples only."""
    series, samples = drop.get("series", 0), drop.get("samples", 0)
    return "-" if not series and samples else _num(float(series))


def _render_cost(cost: Mapping[str, Any], before: Any) -> list[str]:
    prices = cost.get("price_table", {})
    rows = [[f"ingest tier ${t['usd_per_10m']:.2f}/10M{'' if t.get('verified') else ' (unverified)'}",
             _num(t["samples"]), f"${t['usd']:,.2f}"] for t in cost.get("ingest_tiers", [])]
    rows.append([f"storage ${prices.get('storage_usd_per_gb_month', 0):.2f}/GB-month, "
                 f"{prices.get('retention_days', 0):g} d retention", f"{cost.get('storage_gb', 0):,.1f} GB",
                 f"${cost.get('storage_usd', 0):,.2f}"])
    total = cost.get("total_usd", 0)
    rows.append(["total per month", _num(cost.get("samples_per_month", 0)), f"${total:,.2f}"])
    out = ["estimated AMP bill per month (at the current out rate)",
           *_table(["item", "quantity", "USD"], rows)]
    if isinstance(before, Mapping):
        out.append(f"  without this destination's rules: ${before.get('total_usd', 0):,.2f}/month")
    out.append(f"  assumes {prices.get('bytes_per_sample', '?')} bytes/sample; "
               f"{'free tier deducted' if cost.get('free_tier_deducted') else 'free tier not deducted'}; "
               f"{prices.get('region_note', '')}")
    if cost.get("unverified"):
        out.append("  prices marked unverified are not on the AWS pricing page we checked")
    if cost.get("leaves_out"):
        out.append(f"  leaves out: {cost['leaves_out']}")
    return out


def fetch_report(url: str, destination: str | None, limit: int, fetch: Fetch = _fetch_json) -> dict[str, Any]:
    """One destination's snapshot, or ``{"destinations": [...]}`` of all of them (none named)."""
    base = url.rstrip("/") + "/api/v1/cardinality?"

    def get(name: str | None) -> Mapping[str, Any]:
        query = {"limit": str(limit)}
        if name is not None:
            query["destination"] = name
        return fetch(base + urllib.parse.urlencode(query))

    first = get(destination)
    if destination is not None:
        return dict(first)
    names = first.get("all_destinations")
    if not isinstance(names, list):
        return dict(first)
    snaps = [first if name == first.get("destination") else get(str(name)) for name in names]
    return {"destinations": snaps}


def fetch_and_render(url: str, destination: str | None, limit: int, fetch: Fetch = _fetch_json) -> str:
    """GET ``{url}/api/v1/cardinality`` (every destination unless one is named) and render it."""
    return render_report(fetch_report(url, destination, limit, fetch))
