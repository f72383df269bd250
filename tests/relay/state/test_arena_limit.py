"""relay.state.memory_trim.limit_arenas: the relay's threads share at most ARENA_MAX malloc arenas
(glibc's default is 8 a core, each keeping its thread's freed memory), unless the user chose a
number with glibc.malloc.arena_max / MALLOC_ARENA_MAX. Each case runs in a fresh interpreter:
arenas, once made, stay for the process's life."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from relay.state import memory_trim
from tests.helpers import REPO_ROOT

CHILD = r"""
import json, sys, threading, ctypes
from relay.state import memory_trim
limited = memory_trim.limit_arenas() if sys.argv[1] == "limit" else None
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
barrier = threading.Barrier(8)
def work():
    p = libc.malloc(200_000)  # not mmapped: from the thread's arena
    barrier.wait(10)  # all eight hold a block at once: each needs an arena of its own unless limited
    libc.free(p)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"limited": limited, "arenas": memory_trim.arenas(), "limit": memory_trim.arena_limit()}))
"""


def child(mode: str, env: dict[str, str] | None = None) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    environ.update(env or {})
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=REPO_ROOT, env=environ, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    result: dict[str, object] = json.loads(out)
    return result


pytestmark = pytest.mark.skipif(memory_trim.arenas() == 0, reason="not glibc: no malloc arenas to limit")


def test_the_relays_threads_share_at_most_arena_max_arenas() -> None:
    got = child("limit")
    assert got["limited"] is True
    assert 1 <= int(got["arenas"]) <= memory_trim.ARENA_MAX, got  # type: ignore[call-overload]
    assert got["limit"] == memory_trim.ARENA_MAX


def test_without_the_limit_eight_threads_make_arenas_of_their_own() -> None:
    """The control: the same threads, glibc's default, make more arenas than the limit allows."""
    got = child("default")
    assert int(got["arenas"]) > memory_trim.ARENA_MAX, got  # type: ignore[call-overload]


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "6"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=6"}])
def test_a_number_the_user_chose_is_kept(env: dict[str, str]) -> None:
    got = child("limit", env)
    assert got["limited"] is False
    assert got["limit"] == 6
    assert int(got["arenas"]) > memory_trim.ARENA_MAX, got  # type: ignore[call-overload]
