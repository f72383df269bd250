"""The native tables at their limits: tables that cannot grow raise MemoryError and keep every entry;
label values count by their true slot across the 2^16 generation wrap; the largest window still
expires exactly.

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

_OUT_OF_SPACE = r"""
import resource, sys
from relay import native
cd, cs = native.load("cdcache"), native.load("cstage")
if cd is None or cs is None:
    print("skip"); sys.exit(0)
EXT = b"\n\x0c\n\x07cluster\x12\x01c"
POS_SHIFT = int(sys.argv[1])
keys = [b"series-%d" % i for i in range(400_000)]
ids = [(i * 0x9E3779B97F4A7C15 | 1) & (2**64 - 1) for i in range(400_000)]
t, s = cd.DecisionTable(2), cs.Table()
for i in range(40_000):  # past a mebibyte: their own mappings from here on
    t[keys[i]] = ((keys[i], i, "m"), (EXT, i | 1 << POS_SHIFT, "m"))
    s.put(ids[i], i)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (24 << 20), hard))  # a little room, then none
failed = {"cdcache": 0, "cstage": 0}
n_t = n_s = 40_000
for i in range(40_000, len(keys)):
    if not failed["cdcache"]:
        try:
            t[keys[i]] = ((keys[i], i, "m"), (EXT, i | 1 << POS_SHIFT, "m"))
            n_t += 1
        except MemoryError:
            failed["cdcache"] = i
    if not failed["cstage"]:
        try:
            s.put(ids[i], i)
            n_s += 1
        except MemoryError:
            failed["cstage"] = i
    if all(failed.values()):
        break
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
assert all(failed.values()), failed  # both hit the limit
assert len(t) == n_t and len(s) == n_s, (len(t), n_t, len(s), n_s)
assert all(t[keys[i]][0][1] == i for i in range(n_t))
assert all(s.get(ids[i]) == i for i in range(n_s))
s.check()
t[keys[n_t]] = ((keys[n_t], n_t, "m"), None)  # grows again once there is room
assert len(t) == n_t + 1
t.clear(); del s
print("ok", failed)
"""


def _run_script(tmp_path: Path, text: str, *args: str) -> None:
    """text as a script in a fresh interpreter (its own address space limit), which prints "ok"."""
    import subprocess
    import sys

    script = tmp_path / "limits.py"
    script.write_text(text)
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == 0 and done.stdout.startswith("ok"), (done.stdout, done.stderr[-2000:])


def test_native_tables_that_cannot_grow_raise_memoryerror_and_keep_every_entry(tmp_path: Path) -> None:
    from relay import native
    from relay.state.stage import POS_SHIFT

    if native.load("cdcache") is None or native.load("cstage") is None:
        pytest.skip("native modules off or not built")
    _run_script(tmp_path, _OUT_OF_SPACE, str(POS_SHIFT))


_WIDEN_OUT_OF_SPACE = r"""
import resource, sys
from relay import native
cd = native.load("cdcache")
if cd is None:
    print("skip"); sys.exit(0)
n = 200_000
keys = [b"series-%d" % i for i in range(n)]
t = cd.DecisionTable(2)
for i, k in enumerate(keys):  # compact: 40 bytes an entry, in a mapping of its own
    t[k] = ((k, i, "m"), (k, i | 1 << 64, "m"))
assert t.words == 5
renamed = ((b"renamed", 1, "m"), (b"renamed", 2, "other"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 20), hard))  # not the 6 MiB more the wide array needs
try:
    t[b"renamed"] = renamed
    failed = False
except MemoryError:
    failed = True
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
assert failed and t.words == 5 and len(t) == n and b"renamed" not in t
assert all(t[k] == ((k, i, "m"), (k, i | 1 << 64, "m")) for i, k in enumerate(keys))
t[b"renamed"] = renamed  # room again: the table turns wide
assert t.words == 7 and len(t) == n + 1 and t[b"renamed"] == renamed
assert all(t[k] == ((k, i, "m"), (k, i | 1 << 64, "m")) for i, k in enumerate(keys))
print("ok")
"""


def test_a_decision_table_that_cannot_turn_wide_raises_memoryerror_and_keeps_every_entry(tmp_path: Path) -> None:
    from relay import native

    if native.load("cdcache") is None:
        pytest.skip("native modules off or not built")
    _run_script(tmp_path, _WIDEN_OUT_OF_SPACE)


def _trackers() -> list[str]:
    from relay import native
    return ["python"] + (["c"] if native.load("cstage") is not None else [])


@pytest.mark.parametrize("kind", _trackers())
def test_label_values_count_by_their_true_slot_across_the_2_16_wrap(kind: str) -> None:
    from relay.state import series_tracker

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    cls = series_tracker.PySeriesTracker if kind == "python" else series_tracker.CSeriesTracker
    t = cls(60.0, clock, slots=60, max_values=100)  # one slot a second

    def uid(sid: int, value: str) -> None:
        t.observe(sid, "m", (("__name__", "m"), ("uid", value)))

    uid(1, "early")  # slot 0
    clock.t = 30.0
    assert t.expire() == 0  # cutoff below 0: the base stays at 0
    clock.t = 65_535.0  # 2**16 - 1 slots on, no expire since: no sweep yet, the value is still counted
    uid(2, "late")  # kept as 65535 mod 2**16: read back as 65535, not as a slot before 0
    assert t.top_labels(5, "m") == [("uid", 2)]
    clock.t = 65_535.0 + 59
    t.expire()  # cutoff 65534: "early" (slot 0) leaves, "late" (65535) is in the window
    assert t.top_labels(5, "m") == [("uid", 1)]
    clock.t = 65_535.0 + 2 * 65_536  # two wraps on without expire: the next labels noted sweep first
    uid(3, "later")
    assert t.top_labels(5, "m") == [("uid", 1)]  # "late" swept, though expire() never ran
    clock.t += 59
    t.expire()
    assert t.top_labels(5, "m") == [("uid", 1)] and t.active() == 1
    clock.t += 2
    t.expire()
    assert t.top_labels(5, "m") == [] and t.active() == 0


@pytest.mark.parametrize("kind", _trackers())
def test_the_largest_window_of_slots_still_expires_values_exactly_across_wraps(kind: str) -> None:
    from relay.state import series_tracker

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    slots = series_tracker.MAX_SLOTS
    cls = series_tracker.PySeriesTracker if kind == "python" else series_tracker.CSeriesTracker
    t = cls(float(slots), clock, slots=slots, max_values=1000)  # one slot a second, 2**15 of them
    with pytest.raises(ValueError):
        cls(float(slots), clock, slots=slots + 1)
    for step in range(8):  # a value a quarter span apart, never an expire(): sweeps only
        clock.t = step * 16_384.0
        t.observe(step, "m", (("__name__", "m"), ("uid", f"v{step}")))
        # in the window: the values of the last 2**15 slots (older ones may linger until a sweep)
        assert t.top_labels(1, "m")[0][1] >= min(step + 1, 3)
    clock.t += 1
    t.expire()  # cutoff = now - 2**15: v6 (now - 16385) and v7 (now - 1) in, the rest out
    assert t.top_labels(1, "m") == [("uid", 2)]
