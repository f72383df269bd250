"""The interpreter's settings for the relay's workload, applied once after a successful start.

Every request makes and frees a few short-lived Python objects per series (the route loop's
entries, until the native core stops building them) and runs on one of several threads (a thread
per connection, the group committer, a sender per shard). CPython's defaults suit neither:

- **Garbage collection.** A young-generation collection runs every 700 net container allocations
  and walks every young object; each tenth one also walks the middle generation, and full
  collections walk everything the process holds: the configuration, compiled rules, modules.
  ``gc.freeze()`` after start-up moves those into the permanent generation (never walked again),
  and a young threshold of ``GC_THRESHOLD[0]`` makes collections rare, sized to a request's burst
  rather than to a few series. Cycles are still collected, later; the per-series objects are
  tuples of bytes, ints and str, freed by their reference counts, not by the collector.
- **The GIL switch interval.** A thread waiting for the GIL asks the running one to drop it after
  ``sys.getswitchinterval()`` (5 ms by default). A request's route and take run in C holding the
  GIL for a few milliseconds, so with four connections, the committer and the senders the default
  forces hand-offs (a context switch and a cold cache each) in the middle of those passes.
  ``SWITCH_INTERVAL_S`` lets most passes finish; threads blocked in I/O do not wait on it (they
  release the GIL), and no thread waits longer than the interval for its turn.
- **glibc's malloc thresholds.** A request's decompressed body, its queue pieces and a sender's
  batch are hundreds of kilobytes to megabytes each. Above glibc's mmap threshold (128 KiB,
  raised only by a freed mmapped chunk) each is a fresh mmap: every page faulted in and zeroed,
  then unmapped at free; below it, freed tops over the trim threshold go back with madvise. Fixed
  thresholds (``MMAP_THRESHOLD_BYTES``, ``TRIM_THRESHOLD_BYTES``) keep those buffers in the heap and
  reuse them: minor page faults on issue 9's pass-through job fell from about 227,000 to about
  12,000. Memory freed stays with the process up to the trim threshold per arena: at 8 MiB the
  relay's RSS at 1M active series is about what it is with glibc's defaults (184 and 211 B per
  series in two runs, against 210; relay_series_bench's memory section); a 64 MiB threshold held
  277 B. Only where the C library is glibc (``mallopt``); elsewhere nothing is changed.

Measured side by side (``bench/interpreter_bench.py``: the same relay with and without them,
alternating runs, issue 9's job): keep 4 names 2.28 -> 1.96 us per sample (0.86x), pass-through
4.15 -> 4.09 (0.99x: its cost is elsewhere, in bytes moved and compressed). bench/README.md has the run.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from dataclasses import dataclass
from typing import Any

GC_THRESHOLD = (50_000, 20, 100)  # young, middle, old (CPython's default: 700, 10, 10)
SWITCH_INTERVAL_S = 0.02  # CPython's default: 0.005
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest on 64-bit (its default: 128 KiB, dynamic)
TRIM_THRESHOLD_BYTES = 8 * 1024 * 1024  # glibc's default: 128 KiB (twice the dynamic mmap threshold)
M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3


@dataclass(frozen=True)
class Settings:
    gc_threshold: tuple[int, int, int]
    switch_interval_s: float
    frozen: bool  # gc.freeze() was called


def current() -> Settings:
    threshold = gc.get_threshold()
    return Settings((threshold[0], threshold[1], threshold[2]), sys.getswitchinterval(), gc.get_freeze_count() > 0)


def glibc() -> Any | None:
    """The process's C library when it is glibc (it has ``mallopt``), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl has mallopt too, not this)
        return libc if hasattr(libc, "mallopt") else None
    except (OSError, AttributeError):
        return None


def tune_malloc(libc: Any | None) -> bool:
    """Fix glibc's mmap and trim thresholds (see the module text). True when both took; ``libc``
    None (not glibc) changes nothing. glibc cannot go back to its dynamic thresholds: no undo."""
    if libc is None:
        return False
    ok = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD_BYTES)) == 1
    return bool(libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(TRIM_THRESHOLD_BYTES)) == 1 and ok)


def tune(libc: Any | None = None) -> Settings:
    """Apply the relay's settings (see the module text); returns the ones before, for ``restore``.
    ``libc``: the C library to tune (default: this process's, when it is glibc)."""
    before = current()
    tune_malloc(glibc() if libc is None else libc)
    gc.collect()  # start-up garbage goes now, not into the permanent generation
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return before


def restore(before: Settings) -> None:
    """Undo ``tune``'s interpreter settings (tests; a process embedding the relay); malloc's stay."""
    gc.set_threshold(*before.gc_threshold)
    sys.setswitchinterval(before.switch_interval_s)
    if not before.frozen:
        gc.unfreeze()
