"""relay.state.memory_trim.trim_arenas: the free tops of glibc's thread arenas, which malloc_trim
leaves, go back too. Each row runs in a fresh interpreter (the thresholds are process-wide, and RSS is
what is measured): threads write blocks under the mmap threshold (one arena each), free them,
and the process's RSS (/proc/self/statm) is read before, after the frees and after trim_arenas.
Freed last first, the blocks make each arena's top, which malloc_trim leaves (glibc 2.36: 11-46 MB
stays after it in these rows, 0.3-1.2 MB after trim_arenas)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from relay.state import memory_trim

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20

CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from relay.state import memory_trim

    threads_n, block, blocks, keep_alive = json.loads(sys.argv[2])
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    assert memory_trim.map_large_blocks()
    memory_trim.trim_arenas()
    before = rss()
    done, stay = threading.Barrier(threads_n + 1), threading.Event()

    def work():  # the threads are all alive at once: each in its own arena (while there are enough)
        data = [b"\\x01" * block for _ in range(blocks)]  # written: resident
        while data:
            data.pop()  # the last first: each joins the arena's free top (under the trim threshold)
        done.wait()
        if keep_alive:
            stay.wait()  # a live thread keeps its arena (not on glibc's free list)

    ts = [threading.Thread(target=work) for _ in range(threads_n)]
    for t in ts:
        t.start()
    done.wait()
    if not keep_alive:
        for t in ts:
            t.join()
        time.sleep(0.2)  # gone: glibc puts a thread's arena on its free list last, after join returns
    freed = rss()
    memory_trim.trim_arenas()
    after = rss()
    stay.set()
    for t in ts:
        t.join()
    print(json.dumps({"before": before, "freed": freed, "after": after, "arenas": memory_trim.arenas()}))
""")


def run_child(shape: list[Any], env: dict[str, str] | None = None) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), json.dumps(shape)], check=True,
                         capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(memory_trim._LIBC is None, reason="not glibc: nothing to trim")
@pytest.mark.parametrize(("threads", "block", "blocks", "keep_alive", "env"), [
    (8, 300_000, 20, False, {}),  # the Python route's per-series slices: ~6 MB a thread, under the 8 MiB threshold
    (4, 1_000_000, 7, False, {}),  # 1 MB blocks
    (2, 3_000_000, 2, False, {}),  # just under the mmap threshold (4 MiB)
    (3, 300_000, 20, True, {"MALLOC_ARENA_MAX": "2"}),  # glibc's limit: one arena shared, held by live threads
])
def test_the_threads_arenas_give_their_free_tops_back(threads: int, block: int, blocks: int, keep_alive: bool,
                                                     env: dict[str, str]) -> None:
    r = run_child([threads, block, blocks, keep_alive], env)
    held = (threads if not env else 1) * block * blocks  # (a shared arena's blocks are reused in turn)
    assert r["freed"] - r["before"] >= held // 2, r  # freed, not given back: the tops kept them
    assert r["after"] - r["before"] <= 6 * MiB, r


@pytest.mark.parametrize(("environ", "cpus", "limit"), [
    ({}, 2, 16),  # glibc's default: 8 a core
    ({}, 64, 512),
    ({"MALLOC_ARENA_MAX": "2"}, 2, 2),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=3"}, 2, 3),
    ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=4"}, 2, 4),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4", "MALLOC_ARENA_MAX": "2"}, 2, 4),  # the tunable wins
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_test=4"}, 2, 16),  # another tunable: the default
    ({"MALLOC_ARENA_MAX": "0"}, 2, 16),  # not a limit: the default
    ({"MALLOC_ARENA_MAX": "many"}, 2, 16),
])
def test_the_arena_limit_is_glibcs(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], cpus: int,
                                   limit: int) -> None:
    for name in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(memory_trim, "_arena_max", None)  # as before limit_arenas (a Runtime calls it)
    assert memory_trim.arena_limit() == limit


@pytest.mark.skipif(memory_trim._LIBC is None, reason="not glibc: no arenas to count")
def test_arenas_counts_the_main_one_at_least() -> None:
    assert memory_trim.arenas() >= 1
