"""``gpu-relay report``: the ``/api/v1/cardinality`` JSON as a readable terminal table."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Fetch = Callable[[str], Mapping[str, Any]]


def _fetch_json(url: str) -> Mapping[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        data = json.loads(resp.read().decode())
    if not isinstance(data, Mapping):
        raise ValueError(f"{url}: expected a JSON object, got {type(data).__name__}")
    return data


def _num(x: float) -> str:
    if x >= 1e9:
        return f"{x / 1e9:.2f}B"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        cells_out = [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
        return "  ".join(cells_out).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    if not rows:
        out.append("(none)")
    return out


def _pairs(items: Sequence[Mapping[str, Any]], key: str, count: str) -> list[tuple[str, int]]:
    return [(str(i[key]), int(i[count])) for i in items]


def _side_by_side(title: str, left: list[tuple[str, int]], right: list[tuple[str, int]],
                  what: str) -> list[str]:
    rows = []
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ("", None)
        b = right[i] if i < len(right) else ("", None)
        rows.append([a[0], "" if a[1] is None else _num(a[1]), b[0], "" if b[1] is None else _num(b[1])])
    return [title, *_table([f"in: {what}", "count", f"out: {what}", "count"], rows)]


def render_report(snapshot: Mapping[str, Any]) -> str:
    """Readable text from one destination's snapshot, or ``{"destinations": [...]}`` of several."""
    many = snapshot.get("destinations")
    if isinstance(many, Sequence) and not isinstance(many, str):
        return "\n\n".join(render_report(s) for s in many)
    active = snapshot.get("active_series", {})
    rates = snapshot.get("samples_per_second", {})
    window = _num(snapshot.get("window_seconds", 0))
    lines = [f"destination {snapshot.get('destination', '?')}  (window {window}s)", ""]
    lines += _table(["", "in", "out"], [
        ["active series", _num(active.get("in", 0)), _num(active.get("out", 0))],
        ["samples/s", _num(rates.get("in", 0.0)), _num(rates.get("out", 0.0))],
    ])
    top_m = snapshot.get("top_metrics", {})
    lines += ["", *_side_by_side("top metrics by series", _pairs(top_m.get("in", []), "metric", "series"),
                                 _pairs(top_m.get("out", []), "metric", "series"), "metric")]
    top_l = snapshot.get("top_labels", {})
    lines += ["", *_side_by_side("top labels by distinct values",
                                 _pairs(top_l.get("in", []), "label", "distinct_values"),
                                 _pairs(top_l.get("out", []), "label", "distinct_values"), "label")]
    dropped = snapshot.get("dropped", {})
    lines += ["", "dropped", *_table(["reason", "series", "samples"], [
        [r, _num(v.get("series", 0)), _num(v.get("samples", 0))] for r, v in sorted(dropped.items())])]
    cost = snapshot.get("estimated_cost")
    if isinstance(cost, Mapping):
        lines += ["", *_render_cost(cost, snapshot.get("estimated_cost_without_rules"))]
    return "\n".join(lines) + "\n"


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
        out.append(f"without this destination's rules: ${before.get('total_usd', 0):,.2f}/month")
    out.append(f"assumes {prices.get('bytes_per_sample', '?')} bytes/sample; "
               f"{'free tier deducted' if cost.get('free_tier_deducted') else 'free tier not deducted'}; "
               f"{prices.get('region_note', '')}")
    if cost.get("unverified"):
        out.append("prices marked unverified are not on the AWS pricing page we checked")
    return out


def fetch_and_render(url: str, destination: str | None, limit: int, fetch: Fetch = _fetch_json) -> str:
    """GET ``{url}/api/v1/cardinality`` (with ``destination`` and ``limit``) and render it."""
    query = {"limit": str(limit)}
    if destination is not None:
        query["destination"] = destination
    full = url.rstrip("/") + "/api/v1/cardinality?" + urllib.parse.urlencode(query)
    return render_report(fetch(full))
