"""The exposition parser: exposed names kept (issue 20 point 2), both formats as Prometheus 2.42's
textparse reads them, and the errors it raises."""

from __future__ import annotations

import struct

import pytest

from relay.ingest.scrape import textparse

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


@pytest.mark.parametrize(
    ("body", "content_type", "name", "labels", "value", "ts"),
    [
        # counters without _total keep their exposed names (prometheus_client's parser renamed them)
        ('# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 3\n', "",
         "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", (("gpu", "0"),), 3.0, None),
        ("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION 9\n",
         "text/plain; version=0.0.4", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", (), 9.0, None),
        ('# TYPE c counter\nc_total{a="1"} 2 1.5\n# EOF\n', OM, "c_total", (("a", "1"),), 2.0, 1500),
        ("# TYPE c counter\nc_created 17\n# EOF", OM, "c_created", (), 17.0, None),
        ('m{a="x",b="y"} 1 # {t="1"} 2 3\n# EOF\n', OM, "m", (("a", "x"), ("b", "y")), 1.0, None),
        # classic text: free whitespace, trailing comma, no comma, escapes, integer-ms timestamps
        ('  m { a = "1" , b="2",} 4 1700000000123 \n', "", "m", (("a", "1"), ("b", "2")), 4.0, 1_700_000_000_123),
        ('m{a="1" b="2"} 5\n', "", "m", (("a", "1"), ("b", "2")), 5.0, None),
        ('m{a="q\\"b\\\\s\\nn\\t"} 1\n', "", "m", (("a", 'q"b\\s\nn\\t'),), 1.0, None),
        ("m +Inf\n", "", "m", (), float("inf"), None),
        ("m -inf\n", "", "m", (), float("-inf"), None),
        ("m 1e3\n", "", "m", (), 1000.0, None),
        ("ns:sub_metric 1", "", "ns:sub_metric", (), 1.0, None),  # a last line without a newline
    ],
)
def test_parse_keeps_exposed_names_labels_values_and_timestamps(
    body: str, content_type: str, name: str, labels: tuple[tuple[str, str], ...], value: float, ts: int | None
) -> None:
    (sample,) = textparse.parse(body.encode(), content_type).samples
    assert (sample.name, sample.labels, sample.value, sample.timestamp_ms) == (name, labels, value, ts)


@pytest.mark.parametrize("content_type", ["", OM])
def test_nan_becomes_prometheus_normal_nan(content_type: str) -> None:
    body = b"m NaN\n" + (b"# EOF\n" if content_type else b"")
    (sample,) = textparse.parse(body, content_type).samples
    assert bits(sample.value) == 0x7FF8000000000001


def test_metadata_of_each_family_type_help_unit() -> None:
    body = (b"# HELP a The \\\\ help\\n.\n# TYPE a counter\n# TYPE h histogram\n# TYPE u untyped\n# just a comment\n"
            b"a 1\n")
    families = textparse.parse(body).families
    assert families["a"] == textparse.Family("counter", "The \\ help\n.", "")
    assert families["h"].type == "histogram" and families["u"].type == "untyped"
    om = textparse.parse(b"# TYPE t gauge\n# UNIT t_celsius celsius\n# HELP t Temp \\\"x\\\".\n# EOF\n", OM).families
    assert om["t_celsius"].unit == "celsius" and om["t"].help == 'Temp "x".'


@pytest.mark.parametrize(
    ("body", "content_type", "error"),
    [
        (b"m 1e400\n", "", "out of range"),
        (b"m 0x1p3\n", "", "invalid float"),
        (b"m 1_000\n", "", "invalid float"),
        (b"m +NaN\n", "", "invalid float"),
        (b"m 1\r\n", "", "invalid float"),
        (b'm{a="1"} 1 # {t="x"} 1\n', "", "expected timestamp or new record"),  # exemplars are OM only
        (b"m 1 -5\n", "", "expected timestamp or new record"),
        (b"m{a=1} 1\n", "", "expected label value"),
        (b'm{,a="1"} 1\n', "", "expected label name"),
        (b'm{a="\xff"} 1\n', "", "invalid UTF-8"),
        (b"# TYPE m meter\n", "", "invalid metric type"),
        (b"# TYPE m  gauge\n", "", "invalid metric type"),
        (b"1m 1\n", "", "not a valid start"),
        (b"m\n", "", "expected value"),
        (b"m 1\n", OM, "does not end with # EOF"),
        (b"m 1\n# EOF\nm 2\n", OM, "after # EOF"),
        (b"m  1\n# EOF\n", OM, "expected value and timestamp"),
        (b'm{a="1",} 1\n# EOF\n', OM, "expected label name"),
        (b"# just a comment\n# EOF\n", OM, "not a valid OpenMetrics line"),
        (b"# UNIT m_seconds bytes\n# EOF\n", OM, "unit not a suffix"),
        (b"m 1 NaN\n# EOF\n", OM, "invalid timestamp"),
    ],
)
def test_parse_errors_name_the_line(body: bytes, content_type: str, error: str) -> None:
    with pytest.raises(textparse.ParseError, match=error) as info:
        textparse.parse(b"ok 1\n" + body, content_type)
    assert str(info.value).startswith("line " if "EOF" in error else "line 2:")
    assert info.value.samples[0].name == "ok"  # what came before the error is on it


def test_the_format_follows_the_media_type() -> None:
    assert textparse.is_openmetrics("application/openmetrics-text;version=0.0.1")
    assert not textparse.is_openmetrics("text/plain; version=0.0.4")
    assert not textparse.is_openmetrics("")
    # the same body is OpenMetrics only when served as such
    with pytest.raises(textparse.ParseError):
        textparse.parse(b"m 1 # {a=\"b\"} 1\n# EOF\n", "text/plain")
    assert len(textparse.parse(b"m 1 # {a=\"b\"} 1\n# EOF\n", OM).samples) == 1
