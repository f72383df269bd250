"""The waste rules on a demo clock: every window, offset, `for:` and age threshold divided by a factor.

`python scripts/demo_rules.py OUT.yaml [--factor 12]` writes deploy/monitoring/rules/gpu-waste.rules.yaml
with 15m -> 75s, 10m -> 50s, 1h -> 5m and so on (and the group's 1m interval -> 5s), so the demo
shows in minutes what the real rules say in an hour. The real files are never changed; promtool
checks what this writes (the demo does `promtool check rules` on it before starting Prometheus).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "deploy" / "monitoring" / "rules" / "gpu-waste.rules.yaml"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])\b")
_IN_PROMQL = re.compile(r"(\[|offset\s+)(\d+[smhd])(\])?")
_FOR = re.compile(r"^([ \t]*(?:for|interval):[ \t]*)(\d+[smhd])[ \t]*$", re.M)
_AGE = re.compile(r"(job:progress_age:seconds\s*(?:>=|<=|>|<)\s*)(\d+)")


def scaled(duration: str, factor: float) -> str:
    """``15m`` / 12 -> ``75s``; never below 1 s."""
    m = _DURATION.fullmatch(duration)
    if m is None:
        raise ValueError(f"not a duration: {duration!r}")
    seconds = max(1, round(int(m.group(1)) * UNITS[m.group(2)] / factor))
    return f"{seconds}s"


def scale_rules(text: str, factor: float) -> str:
    """The rule file's text with its time constants divided by ``factor`` (comments untouched)."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        line = _IN_PROMQL.sub(lambda m: m.group(1) + scaled(m.group(2), factor) + (m.group(3) or ""), line)
        line = _FOR.sub(lambda m: m.group(1) + scaled(m.group(2), factor), line)
        line = _AGE.sub(lambda m: m.group(1) + str(max(1, round(int(m.group(2)) / factor))), line)
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--factor", type=float, default=12.0,
                    help="how much faster than real time (default 12: the 1m evaluation interval becomes 5s)")
    args = ap.parse_args(argv)
    if args.factor < 1:
        print("demo_rules: --factor must be at least 1", file=sys.stderr)
        return 2
    args.out.write_text(scale_rules(SOURCE.read_text(encoding="utf-8"), args.factor), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
