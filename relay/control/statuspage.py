"""The status page at ``GET /`` of the telemetry listener: server-rendered HTML, no scripts, no assets.

A pure function of the destinations' overviews (relay.overview, the same dicts that
``/api/v1/cardinality`` serves), so the numbers on the page are the API's numbers. Every value is
HTML-escaped; every number also sits in a ``data-value`` attribute (exact, unformatted) under a
``data-key`` of ``<destination>.<field>`` so tests and scrapers need not parse formatted text.
The page refreshes itself every ``REFRESH_S`` seconds (meta refresh).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from relay import __version__

REFRESH_S = 10

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:0 0 .4em}
.meta{color:#666;margin-bottom:1em}.dest{background:#fff;border:1px solid #ddd;border-radius:6px;
padding:1em;margin:0 0 1em;max-width:75em}.state{display:inline-block;padding:.1em .6em;border-radius:1em;
font-size:.85em;font-weight:600;margin-left:.5em;vertical-align:middle}.sending{background:#d6f5d6;color:#14591a}
.failing,.rejecting,.auth_blocked{background:#fbd5d5;color:#8a1111}.retrying{background:#fdf0c4;color:#6b4a00}
.dry{background:#e3e8f5;color:#243a73}
table{border-collapse:collapse;margin:.3em 0 .8em}td,th{padding:.15em .8em .15em 0;text-align:left;
vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}th{color:#555;font-weight:600}
.err{color:#8a1111}.cols{display:flex;gap:2.5em;flex-wrap:wrap;align-items:flex-start}
.side{flex:1;min-width:24em}.small{color:#666;font-size:.9em}
code{font-size:.95em}
"""


def _fmt_int(value: float) -> str:
    return f"{round(value):,}"


def _fmt_rate(value: float) -> str:
    return f"{value:,.2f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _size(nbytes: float, limit: float | None) -> str:
    def human(n: float) -> str:
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if n >= size:
                return f"{n / size:.1f} {unit}"
        return f"{n:.0f} B"

    return human(float(nbytes)) + (f" of {human(float(limit))}" if limit else "")


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    return f"{stamp} ({_age(max(0.0, now - ts))} ago)"


def _num(key: str, value: float, text: str) -> str:
    return f'<td class="n" data-key="{escape(key)}" data-value="{escape(repr(float(value)))}">{escape(text)}</td>'


def _row(label: str, cell: str) -> str:
    return f"<tr><th>{escape(label)}</th>{cell}</tr>"


def _text(key: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-key="{escape(key)}">{escape(text)}</td>'


def _top(title: str, key: str, items: Sequence[Mapping[str, Any]]) -> str:
    cells = [(str(i["metric"]), float(i["series"])) for i in items]
    rows = "".join(
        f"<tr><td>{escape(metric)}</td>{_num(key + '.' + metric, n, _fmt_int(n))}</tr>" for metric, n in cells
    ) or '<tr><td colspan="2" class="small">(none)</td></tr>'
    return f"<div><table><tr><th>{escape(title)}</th><th>series</th></tr>{rows}</table></div>"


def _cost(name: str, snap: Mapping[str, Any]) -> str:
    cost = snap.get("estimated_cost")
    if not isinstance(cost, Mapping):
        return '<p class="small">Not an Amazon Managed Prometheus workspace: no AMP estimate.</p>'
    before = snap.get("estimated_cost_without_rules")
    prices = cost.get("price_table", {})
    total = float(cost.get("total_usd", 0.0))
    rows = [
        _row("estimated AMP bill per month", _num(f"{name}.cost_usd", total, f"${total:,.2f}")),
        _row("samples per month", _num(f"{name}.cost_samples", float(cost.get("samples_per_month", 0)),
                                       _fmt_int(float(cost.get("samples_per_month", 0))))),
    ]
    if isinstance(before, Mapping):
        b = float(before.get("total_usd", 0.0))
        rows.append(_row("without this destination's rules", _num(f"{name}.cost_before_usd", b, f"${b:,.2f}")))
    note = f"{prices.get('region_note', '')}. Leaves out: {cost.get('leaves_out', 'queries')}."
    return f"<table>{''.join(rows)}</table><p class=\"small\">{escape(note)}</p>"


def _drops(key: str, drops: Mapping[str, Any]) -> str:
    """Samples lost in the last hour by reason, a number each (``<dest>.dropped.<reason>``), or none."""
    if not drops:
        return _text(f"{key}.dropped", "none")
    rows = "".join(f"<tr><td>{escape(str(r))}</td>{_num(f'{key}.dropped.{r}', float(n), _fmt_int(float(n)))}</tr>"
                   for r, n in drops.items())
    return f'<td data-key="{escape(key)}.dropped"><table>{rows}</table></td>'


def _destination(snap: Mapping[str, Any], samples_in: float, now: float) -> str:
    name = str(snap.get("destination", "?"))
    k = name
    sending = snap.get("sending", {})
    queue = snap.get("queue", {})
    active = snap.get("active_series", {})
    rates = snap.get("samples_per_second", {})
    state = str(sending.get("state", "sending"))
    state_text = str(sending.get("state_text", state))
    cls = state if state in ("sending", "retrying", "auth_blocked", "rejecting") else "dry"
    err = sending.get("last_error")
    err_text = "none" if not err else f"{_when(float(err['time']), now)}: {err['reason']}"
    def count(label: str, field: str, value: float) -> str:
        return _row(label, _num(f"{k}.{field}", value, _fmt_int(value)))

    numbers = [
        count("samples in", "samples_in", samples_in),
        count("kept", "samples_kept", float(sending.get("samples_kept", 0))),
        count("sent", "samples_sent", float(sending.get("samples_sent", 0))),
        count("failed", "samples_failed", float(sending.get("samples_failed", 0))),
        count("retried", "samples_retried", float(sending.get("samples_retried", 0))),
        count("queued samples", "queue_samples", float(queue.get("samples", 0))),
        count("active series in", "active_in", float(active.get("in", 0))),
        count("active series out", "active_out", float(active.get("out", 0))),
        _row("samples/s in", _num(f"{k}.rate_in", float(rates.get("in", 0.0)), _fmt_rate(float(rates.get("in", 0))))),
        _row("samples/s kept", _num(f"{k}.rate_kept", float(rates.get("out", 0.0)),
                                    _fmt_rate(float(rates.get("out", 0))))),
        _row("samples/s out", _num(f"{k}.rate_out", float(sending.get("samples_per_second", 0.0)),
                                   _fmt_rate(float(sending.get("samples_per_second", 0))))),
    ]
    no_queue = queue.get("max_bytes") is None
    status = [
        _row("last success", _text(f"{k}.last_success", _when(sending.get("last_success"), now))),
        _row("last error", _text(f"{k}.last_error", err_text, "err" if err else "")),
        _row("queue", _text(f"{k}.queue_bytes", "none (dry run)" if no_queue
                            else _size(queue.get("bytes", 0), queue.get("max_bytes")))),
        _row("oldest queued", _text(f"{k}.queue_oldest", _age(queue.get("oldest_age_seconds")))),
        _row("dropped, last hour", _drops(k, sending.get("dropped_last_hour") or {})),
    ]
    top = snap.get("top_metrics", {})
    tops = (_top("top metrics in", f"{k}.top_in", top.get("in", []))
            + _top("top metrics out", f"{k}.top_out", top.get("out", [])))
    return (
        f'<section class="dest" id="dest-{escape(name)}"><h2>{escape(name)}'
        f'<span class="state {cls}" data-key="{escape(k)}.state" data-value="{escape(state)}">'
        f'{escape(state_text)}</span></h2>'
        f'<div class="small"><code>{escape(str(snap.get("url", "")))}</code> · '
        f'{escape(str(snap.get("credentials", "")))}</div>'
        f'<table>{"".join(status)}</table>'
        f'<div class="cols"><table>{"".join(numbers)}</table>'
        f'<div class="side"><div class="cols">{tops}</div>{_cost(k, snap)}</div></div></section>'
    )


def render_status_page(overviews: Sequence[Mapping[str, Any]], *, samples_in: float, now: float,
                       config_ok: bool = True, write_listen: str | None = None) -> str:
    """The whole page for the destinations' overviews (``samples_in``: gpu_relay_samples_received_total;
    ``write_listen``: server.listen, shown since the page may be served on another port)."""
    config = "configuration loaded" if config_ok else "last reload REFUSED (old configuration running)"
    body = "".join(_destination(s, samples_in, now) for s in overviews) or "<p>No destinations configured.</p>"
    where = f" on <code>{escape(write_listen)}</code>" if write_listen else ""
    links = " · ".join(f'<a href="{p}">{p}</a>' for p in ("/metrics", "/api/v1/cardinality", "/-/healthy", "/-/ready"))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>gpu-relay status</title><style>{_CSS}</style></head><body>"
        f"<h1>gpu-relay {escape(__version__)}</h1>"
        f'<div class="meta">{escape(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now)))} · '
        f'<span data-key="config">{escape(config)}</span> · refreshes every {REFRESH_S} s · '
        f"remote-write in: <code>POST /api/v1/write</code>{where} · {links}</div>"
        f"{body}</body></html>\n"
    )
