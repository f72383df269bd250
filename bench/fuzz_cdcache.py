"""Fuzz relay.native._cdcache.DecisionTable against a dict (atheris, coverage-guided): each input is a
program of set/get/pop/popitem/clear operations on keys and decisions built from the fuzz bytes
(label-entry keys of any length, outputs derived from them by leaving entries out and putting runs
in, the decision shapes of relay.stage, and malformed ones); both must give the same answers.

    .venv/bin/pip install atheris                     # not a dependency of the project
    .venv/bin/python bench/fuzz_cdcache.py -max_total_time=180
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import atheris

from relay.native import _cdcache  # type: ignore[attr-defined]

# atheris instruments Python only: the coverage that guides it is this harness's branches (which
# shapes were built, which operations ran); the C table is checked on every input regardless.

CLAIM = 1 << 64
POS_SHIFT = 65
EXT = b"\n\x0c\n\x07cluster\x12\x01c"
DROP = (b"", 0, "rules")


@atheris.instrument_func
def _key(fdp: Any) -> bytes:
    if fdp.ConsumeBool():
        return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300)))
    parts = []
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))
        n = len(payload)
        parts.append(b"\n" + (bytes([n]) if n < 128 else bytes([n & 0x7F | 0x80, n >> 7])) + payload)
    return b"".join(parts)


def _entries(key: bytes) -> list[bytes]:
    out, p = [], 0
    while p < len(key):
        if key[p] != 0x0A or p + 1 >= len(key):
            return []
        n, q = key[p + 1], p + 2
        if n & 0x80:
            if q >= len(key):
                return []
            n, q = (n & 0x7F) | key[q] << 7, q + 1
        out.append(key[p:q + n])
        p = q + n
    return out


@atheris.instrument_func
def _dest(fdp: Any, key: bytes) -> Any:
    kind = fdp.ConsumeIntInRange(0, 8)
    sid = fdp.ConsumeIntInRange(0, (1 << 64) - 1)
    if kind == 0:
        return None
    if kind == 1:
        return DROP
    if kind == 2:
        return (key, sid | (CLAIM if fdp.ConsumeBool() else 0), "m")
    if kind == 3:
        return (EXT, sid | fdp.ConsumeIntInRange(1, 1 << 20) << POS_SHIFT, "m")
    if kind == 4:
        es = [e for e in _entries(key) if fdp.ConsumeBool()]
        at = fdp.ConsumeIntInRange(0, len(es))
        run = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        return (b"".join(es[:at]) + run + b"".join(es[at:]), sid | CLAIM, "m")
    if kind == 5:
        return (fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 60)), sid, "m")
    if kind == 6:
        return (b"g", -fdp.ConsumeIntInRange(1, 9), "m")
    if kind == 7:
        return (key, sid << fdp.ConsumeIntInRange(0, 200), "m")
    return (key, sid)


def _restore(got: Any, want: Any) -> bool:
    if not (isinstance(got, tuple) and got and isinstance(got[0], tuple)) or got is want:
        return bool(got == want)
    return len(got) == len(want) and all(
        (g[1:] == w[1:] and isinstance(w[0], bytes)) if isinstance(g, tuple) and g and g[0] is None else g == w
        for g, w in zip(got, want, strict=True))


@atheris.instrument_func
def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    width = fdp.ConsumeIntInRange(1, 4)
    table = _cdcache.DecisionTable(width)
    model: dict[bytes, Any] = {}
    keys: list[bytes] = [b""]
    for _ in range(fdp.ConsumeIntInRange(0, 200)):
        op = fdp.ConsumeIntInRange(0, 5)
        key = keys[fdp.ConsumeIntInRange(0, len(keys) - 1)] if fdp.ConsumeBool() else _key(fdp)
        if op <= 1:
            value: Any = ((key, fdp.ConsumeIntInRange(0, (1 << 60) - 1), "m"),
                          *[_dest(fdp, key) for _ in range(width - 1)])
            if fdp.ConsumeIntInRange(0, 9) == 0:
                value = value[:-1]
            table[key] = value
            model[key] = value
            keys.append(key)
        elif op == 2:
            assert table.get(bytes(bytearray(key)), 0) == model.get(key, 0)
        elif op == 3:
            assert table.pop(key, 0) == model.pop(key, 0)
        elif op == 4 and model:
            digest, got = table.popitem()
            k = next(k for k in model if _cdcache.digest(k) == digest)
            assert _restore(got, model.pop(k))
        elif op == 5 and fdp.ConsumeIntInRange(0, 20) == 0:
            table.clear()
            model.clear()
        assert len(table) == len(model)
    for k, v in model.items():
        assert table[k] == v


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
