"""The series lines ``gpu-relay test-rules`` reads: ``name{a="1",b="2"}`` and its variants -> labels.

Text form: ``name{a="1"}``, ``{__name__="name",a="1"}``, a quoted UTF-8 name (``{"utf8.name",a="1"}``)
and exposition lines with a trailing value and timestamp (``curl :9400/metrics | gpu-relay test-rules``).
JSON form: one object of string label values a line. A line that cannot be parsed raises
:class:`SeriesSyntaxError` with a 1-based column; parsing never does anything else.
"""

from __future__ import annotations

import json

from relay.common.labels import METRIC_NAME, Labels, make

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
_LABEL_START = _NAME_START - {":"}
_LABEL_CHARS = _NAME_CHARS - {":"}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class SeriesSyntaxError(ValueError):
    """A series line that cannot be parsed; ``column`` is 1-based."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.message = message
        self.column = column


def parse_series(text: str) -> Labels:
    """``name{a="1"}``, ``{__name__="name",a="1"}`` or ``{"utf8.name",a="1"}`` -> sorted labels.

    A trailing sample value and timestamp (an exposition line) are accepted and ignored; empty
    label values are dropped, as Prometheus does."""
    p = _Cursor(text)
    name = p.word(_NAME_START, _NAME_CHARS)
    pairs: list[tuple[str, str]] = []
    p.space()
    if p.peek() == "{":
        p.pos += 1
        while True:
            p.space()
            if p.take("}"):
                break
            at = p.pos
            if p.peek() == '"':
                label = p.quoted()
                p.space()
                if p.peek() in (",", "}"):  # a bare quoted string is the metric name
                    if name:
                        raise SeriesSyntaxError("metric name given twice", at + 1)
                    name = label
                    p.take(",")
                    continue
            else:
                label = p.word(_LABEL_START, _LABEL_CHARS)
                if not label:
                    raise SeriesSyntaxError("expected a label name", at + 1)
            p.space()
            p.expect("=")
            p.space()
            value = p.quoted()
            if label in (n for n, _ in pairs) or (label == METRIC_NAME and name):
                raise SeriesSyntaxError(f'label "{label}" given twice', at + 1)
            pairs.append((label, value))
            p.space()
            if not p.take(","):
                p.expect("}")
                break
    elif not name:
        raise SeriesSyntaxError("expected a metric name or '{'", p.pos + 1)
    _check_sample(text, p.pos)
    if name:
        pairs.append((METRIC_NAME, name))
    return make(pairs)


def _check_sample(text: str, pos: int) -> None:
    """What follows the labels may only be an exposition sample: a value and an optional timestamp."""
    rest = text[pos:].split()
    try:
        if len(rest) > 2:
            raise ValueError
        for token, kind in zip(rest, (float, int), strict=False):
            kind(token)
    except ValueError:
        raise SeriesSyntaxError("unexpected text after the series", pos + 1) from None


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def space(self) -> None:
        while self.text.startswith((" ", "\t"), self.pos):
            self.pos += 1

    def take(self, c: str) -> bool:
        if self.peek() == c:
            self.pos += 1
            return True
        return False

    def expect(self, c: str) -> None:
        if not self.take(c):
            got = repr(self.peek()) if self.peek() else "end of line"
            raise SeriesSyntaxError(f"expected '{c}', got {got}", self.pos + 1)

    def word(self, start: frozenset[str], chars: frozenset[str]) -> str:
        begin = self.pos
        if self.peek() and self.peek() in start:
            while self.peek() and self.peek() in chars:
                self.pos += 1
        return self.text[begin : self.pos]

    def quoted(self) -> str:
        self.expect('"')
        out: list[str] = []
        while True:
            c = self.peek()
            if not c:
                raise SeriesSyntaxError("unterminated string", self.pos + 1)
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                if nxt not in _ESCAPES:
                    raise SeriesSyntaxError(r"unknown escape (use \\, \" or \n)", self.pos)
                out.append(_ESCAPES[nxt])
                self.pos += 1
            else:
                out.append(c)


def parse_json_series(text: str) -> Labels:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SeriesSyntaxError(f"invalid JSON: {e.msg}", e.colno) from None
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise SeriesSyntaxError("expected a JSON object of string label values", 1)
    return make(obj.items())


def format_json(labels: Labels | None) -> str:
    return "null" if labels is None else json.dumps(dict(labels), ensure_ascii=False)
