"""Durations (``30ms``, ``1h30m``) and sizes (``512MiB``, ``32MB``, ``100``) as the relay config writes them.

Durations use Prometheus' syntax: one or more ``<integer><unit>`` terms with units in decreasing order
(``y w d h m s ms``), so ``1h30m`` is valid and ``30m1h`` is not; ``0`` alone is zero. A ``y`` is 365 days.
Sizes are a number (decimals allowed) and an optional unit: none or ``B`` for bytes, SI ``kB KB MB GB TB``
(powers of 1000) or IEC ``KiB MiB GiB TiB`` (powers of 1024); the result must be a whole number of bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_DURATION_UNITS: tuple[tuple[str, int], ...] = (
    ("y", 365 * 86400_000),
    ("w", 7 * 86400_000),
    ("d", 86400_000),
    ("h", 3600_000),
    ("m", 60_000),
    ("s", 1000),
    ("ms", 1),
)
_DURATION_RE = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?", re.ASCII
)
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)", re.ASCII)


class UnitError(ValueError):
    """A duration or size that cannot be parsed; ``kind`` is "duration" or "size", ``text`` the input."""

    def __init__(self, kind: str, text: str, reason: str = "") -> None:
        self.kind = kind
        self.text = text
        self.reason = reason
        detail = f" ({reason})" if reason else ""
        super().__init__(f'invalid {kind} "{text}"{detail}')


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration: ``30ms`` -> 0.03, ``1h30m`` -> 5400.0, ``0`` -> 0.0."""
    if text == "0":
        return 0.0
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise UnitError("duration", text)
    millis = sum(int(g) * mult for g, (_, mult) in zip(match.groups(), _DURATION_UNITS, strict=True) if g)
    return millis / 1000.0


def format_duration(seconds: float) -> str:
    """The shortest Prometheus spelling of a duration: 5400 -> ``1h30m``, 0.03 -> ``30ms``, 0 -> ``0s``."""
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    parts = []
    for unit, mult in _DURATION_UNITS:
        if unit == "y" or unit == "w":
            continue  # 1w and 1y read worse than 7d and 365d in metric names
        count, millis = divmod(millis, mult)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_size(text: str) -> int:
    """Bytes in a size: ``512MiB`` -> 536870912, ``32MB`` -> 32000000, ``100`` -> 100, ``1.5KiB`` -> 1536."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise UnitError("size", text)
    number, unit = match.groups()
    if unit not in _SIZE_UNITS:
        raise UnitError("size", text, f"unknown unit {unit!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    try:
        value = Decimal(number) * _SIZE_UNITS[unit]
    except InvalidOperation as e:  # pragma: no cover - the regex admits only valid decimals
        raise UnitError("size", text) from e
    if value != value.to_integral_value():
        raise UnitError("size", text, "not a whole number of bytes")
    return int(value)


def format_size(size: int) -> str:
    """The largest IEC unit that divides the size exactly: 1073741824 -> ``1GiB``, 1000 -> ``1000B``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        mult = _SIZE_UNITS[unit]
        if size and size % mult == 0:
            return f"{size // mult}{unit}"
    return f"{size}B"
