"""The demo's waste summary: waits (up to --wait seconds) for the alerts the demo plays to fire on
Prometheus, then prints every waste alert firing with what it costs, and the waste series per
namespace. `python scripts/demo_waste_summary.py http://127.0.0.1:9090 --wait 240`; exit 0 also when
an expected alert has not fired yet (it says which, and when it is due)."""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from typing import Any

EXPECTED = ("GPUJobStalled", "GPUJobBusyHang")
WASTE_ALERTS = {"GPUHeldIdle", "GPUJobStalled", "GPUJobBusyHang", "GPUJobRankHang", "GPUJobFinishedHoldingGPUs",
                "GPUJobNoProgressAcrossRestarts", "GPUJobLossNonFinite", "GPUJobUnderutilized"}


def get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}" + (("?" + urllib.parse.urlencode(params)) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]


def firing(base: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = get(base, "/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["state"] == "firing" and a["labels"].get("alertname") in WASTE_ALERTS]


def query(base: str, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = get(base, "/api/v1/query", query=expr)["result"]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prometheus")
    ap.add_argument("--wait", type=float, default=240.0, help="seconds to wait for the expected alerts")
    ap.add_argument("--started", type=float, default=time.time(), help="when the demo's programs started (unix s)")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.wait
    seen: dict[str, float] = {}
    while True:
        now = time.time()
        for a in firing(args.prometheus):
            seen.setdefault(a["labels"]["alertname"], now)
        if all(name in seen for name in EXPECTED) or time.monotonic() >= deadline:
            break
        time.sleep(2)
    alerts = sorted(firing(args.prometheus), key=lambda a: (a["labels"].get("namespace", ""), a["labels"]["alertname"]))
    print("Alerts firing (demo clock: every window and threshold 12x shorter than the real rules):")
    if not alerts:
        print("  none yet")
    for a in alerts:
        lb, ann = a["labels"], a["annotations"]
        cost = ann.get("usd_per_hour", "").strip()
        after = seen.get(lb["alertname"], time.time()) - args.started
        print(f"  {lb['alertname']:<26} {lb.get('namespace', '')}/{lb.get('job_name', '')}"
              f"{' pod ' + lb['pod'] if lb.get('pod') else ''}: {'$' + cost + '/hour' if cost else 'no price'}"
              f" (first seen {after:.0f} s after start)")
        print(f"    {' '.join(ann.get('summary', '').split())}")
    missing = [name for name in EXPECTED if name not in seen]
    if missing:
        print(f"  not fired yet: {', '.join(missing)} (due about 200 s after the demo starts: run it longer)")
    print()
    print("Waste now, per namespace (namespace:gpu_wasted:count, namespace:gpu_wasted_usd_per_hour:sum):")
    held = {r["metric"].get("namespace", ""): float(r["value"][1])
            for r in query(args.prometheus, "namespace:gpu_held:count")}
    usd = {r["metric"].get("namespace", ""): float(r["value"][1])
           for r in query(args.prometheus, "namespace:gpu_wasted_usd_per_hour:sum")}
    rows = query(args.prometheus, "namespace:gpu_wasted:count")
    if not rows:
        print("  no GPU wasted yet")
    for r in sorted(rows, key=lambda r: r["metric"].get("namespace", "")):
        ns, reason, n = r["metric"].get("namespace", ""), r["metric"].get("reason", ""), float(r["value"][1])
        dollars = f"${usd[ns]:.2f}/hour, ${usd[ns] * 24 * 30:,.0f} a month if left" if ns in usd else "no price"
        print(f"  {ns:<12} {reason:<17} {n:g} of {held.get(ns, 0):g} held GPUs wasted: {dollars}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
