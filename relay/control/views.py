"""The telemetry listener's read-only views: ``/api/v1/cardinality`` (JSON) and the status page.

Both are built from the destinations' overviews (relay.control.overview), the same dicts for both,
so the page and the API never disagree. ``cardinality_reply`` validates the query (a 400 naming the
parameter, a 404 naming the known destinations); neither view changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay.control.statuspage import render_status_page
from relay.ingest.server import Reply, json_reply

Overview = Callable[[str, int], dict[str, Any]]  # name, limit -> the overview; KeyError if unknown


def cardinality_reply(names: Sequence[str], overview: Overview, query: Mapping[str, list[str]]) -> Reply:
    """``?destination=<name>&limit=<n>``: one destination's overview (default: the first), with the names."""
    try:
        limit = int((query.get("limit") or ["10"])[0])
    except ValueError:
        return json_reply(400, {"status": "error", "error": "limit must be an integer"})
    if limit < 1:
        return json_reply(400, {"status": "error", "error": "limit must be a positive integer"})
    if not names:
        return json_reply(404, {"status": "error", "error": "no destinations configured", "destinations": []})
    name = (query.get("destination") or [names[0]])[0]
    try:
        snap = overview(name, limit)
    except KeyError:
        return json_reply(
            404, {"status": "error", "error": f"unknown destination {name!r}", "destinations": list(names)}
        )
    snap["all_destinations"] = list(names)
    return json_reply(200, snap)


def status_page_reply(names: Sequence[str], overview: Overview, *, samples_in: float, now: float,
                      config_ok: bool, write_listen: str) -> Reply:
    """The HTML status page of every destination (one removed by a reload just now is left out)."""
    overviews = []
    for name in names:
        try:
            overviews.append(overview(name, 10))
        except KeyError:  # removed by a reload just now
            continue
    html = render_status_page(overviews, samples_in=samples_in, now=now, config_ok=config_ok,
                              write_listen=write_listen)
    return Reply(200, html.encode(), "text/html; charset=utf-8")
