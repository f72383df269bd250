from __future__ import annotations

import pytest

from relay.common.units import UnitError, format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30ms", 0.03),
        ("5s", 5.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("1w", 7 * 86400.0),
        ("1y", 365 * 86400.0),
        ("1m30s500ms", 90.5),
        ("0", 0.0),
        ("0s", 0.0),
        ("90s", 90.0),
    ],
)
def test_parse_duration_accepts_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "5q", "30", "1.5s", "30m1h", "-5s", "5 s", "s", "1h 30m", "1S", "5sec", "1hh"]
)
def test_parse_duration_rejects_invalid_text(text: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_duration(text)
    assert str(info.value) == f'invalid duration "{text}"'
    assert info.value.kind == "duration"
    assert info.value.text == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.03, "30ms"), (5, "5s"), (5400, "1h30m"), (86400, "1d"), (0, "0s"), (90.5, "1m30s500ms")],
)
def test_format_duration_is_the_inverse_of_parse(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_format_duration_rejects_negative_seconds() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(-1)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MiB", 512 * 1024**2),
        ("1GiB", 1024**3),
        ("32MB", 32_000_000),
        ("100", 100),
        ("100B", 100),
        ("1kB", 1000),
        ("1KB", 1000),
        ("2KiB", 2048),
        ("1TiB", 1024**4),
        ("1.5KiB", 1536),
        ("0", 0),
    ],
)
def test_parse_size_accepts_si_and_iec_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'invalid size ""'),
        ("MiB", 'invalid size "MiB"'),
        ("-1GiB", 'invalid size "-1GiB"'),
        ("1.5", 'invalid size "1.5" (not a whole number of bytes)'),
        ("1.0000001KB", 'invalid size "1.0000001KB" (not a whole number of bytes)'),
        ("10XB", "invalid size \"10XB\" (unknown unit 'XB'; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"),
        ("1mib", "invalid size \"1mib\" (unknown unit 'mib'; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"),
    ],
)
def test_parse_size_rejects_invalid_text(text: str, message: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_size(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("size", "text"), [(1024**3, "1GiB"), (512 * 1024**2, "512MiB"), (1000, "1000B"), (0, "0B")]
)
def test_format_size_uses_the_largest_exact_iec_unit(size: int, text: str) -> None:
    assert format_size(size) == text
    assert parse_size(text) == size
