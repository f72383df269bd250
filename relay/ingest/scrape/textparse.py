"""The two text exposition formats, read as Prometheus 2.42's ``textparse`` reads them.

Contract: :func:`parse` takes a scrape body and its Content-Type and returns every sample in body
order, names and labels exactly as exposed (a counter not ending in ``_total``, such as
``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``, keeps its name; OpenMetrics ``_created`` series are series),
and the metadata of every family that has a TYPE, HELP or UNIT line. The format follows the media
type as ``textparse.New`` picks it: ``application/openmetrics-text`` is OpenMetrics 1.0 (strict:
single spaces, ``# EOF`` last, float-second timestamps truncated to ms, exemplars read and
ignored), anything else the classic 0.0.4 text (free whitespace, trailing label commas, integer-ms
timestamps, other ``#`` lines are comments). Values parse as Go's ``strconv.ParseFloat`` would
(no ``_``, ``p``, hex; out of range is an error) and every NaN becomes Prometheus's normal NaN
(``0x7ff8000000000001``). A body that does not parse raises :class:`ParseError` naming the line;
the samples of the lines before it are on the error (Prometheus appends them before it fails).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

NORMAL_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]

# RW 1.0 MetricMetadata.MetricType numbers
TYPE_NUMBERS = {"": 0, "unknown": 0, "untyped": 0, "counter": 1, "gauge": 2, "histogram": 3,
                "gaugehistogram": 4, "summary": 5, "info": 6, "stateset": 7}  # fmt: skip
_PROM_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_OM_TYPES = ("counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset", "unknown")

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_WS = re.compile(r"[ \t]*")
_PROM_VALUE_END = re.compile(r"[^{ \t]+")
_PROM_TAIL = re.compile(r"(?:[ \t]+([0-9]+))?[ \t]*")
_QUOTED = re.compile(r'"((?:\\.|[^\\"])*)"')
_ESCAPE = re.compile(r"\\(.)")
_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)|[nN][aA][nN]")
_INF = re.compile(r"[+-]?[iI][nN][fF]")


class ParseError(ValueError):
    def __init__(self, line: int, message: str, samples: list[Sample]) -> None:
        super().__init__(f"line {line}: {message}")
        self.samples = samples


@dataclass(frozen=True)
class Sample:
    key: str  # the series as written (name and label text): Prometheus's scrape-cache key
    name: str
    labels: tuple[tuple[str, str], ...]  # as exposed, in order, without __name__
    value: float
    timestamp_ms: int | None


@dataclass
class Family:
    type: str = ""
    help: str = ""
    unit: str = ""


@dataclass
class Parsed:
    samples: list[Sample] = field(default_factory=list)
    families: dict[str, Family] = field(default_factory=dict)


def is_openmetrics(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"


def parse(body: bytes, content_type: str = "") -> Parsed:
    text = body.decode("utf-8", "surrogateescape")
    return _Parser(text, is_openmetrics(content_type)).run()


def go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat`` as textparse calls it; ValueError for what Go refuses."""
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"invalid float {_short(text)!r}")
    value = float(text)
    if value != value:
        return NORMAL_NAN
    if value in (float("inf"), float("-inf")) and not _INF.match(text):
        raise ValueError(f"value {_short(text)!r} out of range")
    return value


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _unescape(value: str, quote: bool) -> str:
    def one(m: re.Match[str]) -> str:
        c = m.group(1)
        if c == "n":
            return "\n"
        if c == "\\" or (quote and c == '"'):
            return c
        return m.group(0)

    return _ESCAPE.sub(one, value) if "\\" in value else value


def _utf8(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"invalid UTF-8 {what}") from None
    return text


class _Parser:
    def __init__(self, text: str, om: bool) -> None:
        self.text, self.om = text, om
        self.out = Parsed()

    def run(self) -> Parsed:
        lines = self.text.split("\n")
        if self.om and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        for number, line in enumerate(lines, 1):
            try:
                if not self.om:
                    self._prom_line(line)
                elif line != "# EOF":
                    self._om_line(line)
                elif number < len(lines):
                    raise ValueError("unexpected data after # EOF")
                else:
                    return self.out
            except ValueError as e:
                raise ParseError(number, str(e), self.out.samples) from None
        if self.om:
            raise ParseError(len(lines), "data does not end with # EOF", self.out.samples)
        return self.out

    # -- classic text 0.0.4 ---------------------------------------------------------------------
    def _prom_line(self, line: str) -> None:
        pos = _WS.match(line).end()  # type: ignore[union-attr]
        if pos == len(line):
            return
        if line[pos] == "#":
            m = re.match(r"#[ \t]+(HELP|TYPE)[ \t]+", line[pos:])
            if m is None:
                return  # a comment
            rest = line[pos + m.end():]
            name = _METRIC.match(rest)
            if name is None:
                raise ValueError(f"expected metric name after {m.group(1)}")
            self._meta(m.group(1), name.group(0), rest[name.end() + 1:], _PROM_TYPES)
            return
        name = _METRIC.match(line, pos)
        if name is None:
            raise ValueError(f'"{_short(line[pos:])}" is not a valid start of a series')
        pos = _WS.match(line, name.end()).end()  # type: ignore[union-attr]
        labels: list[tuple[str, str]] = []
        if pos < len(line) and line[pos] == "{":
            pos = self._prom_labels(line, pos + 1, labels)
        key = line[_WS.match(line).end():pos].rstrip(" \t")  # type: ignore[union-attr]
        pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
        value = _PROM_VALUE_END.match(line, pos)
        if value is None:
            raise ValueError(f"expected value after metric {name.group(0)}")
        tail = _PROM_TAIL.fullmatch(line, value.end())
        if tail is None:
            raise ValueError(f'expected timestamp or new record, got "{_short(line[value.end():].strip())}"')
        ts = int(tail.group(1)) if tail.group(1) else None
        if ts is not None and ts >= 1 << 63:
            raise ValueError(f'timestamp "{tail.group(1)}" out of range')
        self._sample(key, name.group(0), labels, go_float(value.group(0)), ts)

    def _prom_labels(self, line: str, pos: int, labels: list[tuple[str, str]]) -> int:
        while True:
            pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
            if line.startswith("}", pos):
                return pos + 1
            name = _LABEL.match(line, pos)
            if name is None:
                raise ValueError("expected label name")
            pos = _WS.match(line, name.end()).end()  # type: ignore[union-attr]
            if not line.startswith("=", pos):
                raise ValueError(f"expected equal after label name {name.group(0)}")
            pos = _WS.match(line, pos + 1).end()  # type: ignore[union-attr]
            value = _QUOTED.match(line, pos)
            if value is None:
                raise ValueError(f"expected label value for {name.group(0)}")
            labels.append((name.group(0), _utf8(_unescape(value.group(1), True), "label value")))
            pos = _WS.match(line, value.end()).end()  # type: ignore[union-attr]
            if line.startswith(",", pos):
                pos += 1

    # -- OpenMetrics 1.0 ------------------------------------------------------------------------
    def _om_line(self, line: str) -> None:
        if line.startswith("#"):
            m = re.match(r"# (HELP|TYPE|UNIT) ", line)
            name = _METRIC.match(line, m.end()) if m else None
            if m is None or name is None:
                raise ValueError(f'"{_short(line)}" is not a valid OpenMetrics line')
            text = line[name.end():]
            if not text.startswith(" "):
                raise ValueError(f"expected text after {m.group(1)} {name.group(0)}")
            self._meta(m.group(1), name.group(0), text[1:], _OM_TYPES)
            return
        name = _METRIC.match(line)
        if name is None:
            raise ValueError(f'"{_short(line)}" is not a valid start of a series')
        pos, labels = name.end(), list[tuple[str, str]]()
        if line.startswith("{", pos):
            pos = self._om_labels(line, pos + 1, labels)
        key = line[:pos]
        if not line.startswith(" ", pos):
            raise ValueError(f"expected value after metric {name.group(0)}")
        body, hash_, exemplar = line[pos + 1:].partition(" # ")
        tokens = body.split(" ")
        if not all(tokens) or len(tokens) > 2:
            raise ValueError(f'expected value and timestamp, got "{_short(body)}"')
        ts: int | None = None
        if len(tokens) == 2:
            seconds = go_float(tokens[1])
            if seconds != seconds or seconds in (float("inf"), float("-inf")):
                raise ValueError(f'invalid timestamp "{tokens[1]}"')
            ts = int(seconds * 1000)
        if hash_:
            self._exemplar("# " + exemplar)
        value = tokens[0]
        self._sample(key, name.group(0), labels, go_float(value), ts)

    def _om_labels(self, line: str, pos: int, labels: list[tuple[str, str]]) -> int:
        first = True
        while True:
            if line.startswith("}", pos):
                return pos + 1
            if not first:
                if not line.startswith(",", pos):
                    raise ValueError("expected comma between labels")
                pos += 1
            name = _LABEL.match(line, pos)
            if name is None or not line.startswith("=", name.end()):
                raise ValueError("expected label name and equal")
            value = _QUOTED.match(line, name.end() + 1)
            if value is None or "\n" in value.group(1):
                raise ValueError(f"expected label value for {name.group(0)}")
            labels.append((name.group(0), _utf8(_unescape(value.group(1), True), "label value")))
            pos, first = value.end(), False

    def _exemplar(self, rest: str) -> None:
        if not rest.startswith("# {"):
            raise ValueError(f'expected timestamp or exemplar, got "{_short(rest)}"')
        end = self._om_labels(rest, 3, [])
        parts = rest[end:].split(" ")
        if len(parts) not in (2, 3) or parts[0] != "":
            raise ValueError("invalid exemplar")
        for number in parts[1:]:
            go_float(number)

    # -- shared ---------------------------------------------------------------------------------
    def _meta(self, kind: str, name: str, text: str, types: tuple[str, ...]) -> None:
        family = self.out.families.setdefault(name, Family())
        if kind == "TYPE":
            if text not in types:
                raise ValueError(f'invalid metric type "{_short(text)}"')
            family.type = text
        elif kind == "HELP":
            family.help = _utf8(_unescape(text, self.om), "help text")
        else:
            if text and not (name.endswith("_" + text)):
                raise ValueError(f'unit not a suffix of metric "{name}"')
            family.unit = text

    def _sample(self, key: str, name: str, labels: list[tuple[str, str]], value: float, ts: int | None) -> None:
        self.out.samples.append(Sample(key, name, tuple(labels), value, ts))
