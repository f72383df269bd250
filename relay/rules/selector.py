"""Prometheus series selectors: ``metric{a="b",c=~"d.*"}`` parsed once, matched against label sets.

Semantics follow PromQL: a label the series lacks has the value ``""``; ``=~`` and ``!~`` are fully
anchored RE2 regexes (``^(?s:...)$``); a bare ``metric`` means ``{__name__="metric"}``. Values may be
written in double quotes (Go escapes), single quotes or backticks (raw). ``{}`` matches every series.
Errors are :class:`SelectorError` carrying the text and the 0-based position of the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import re2

from relay.common.labels import METRIC_NAME, Labels

OPS = ("=", "!=", "=~", "!~")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is raised with the pattern; don't also spam stderr


class SelectorError(ValueError):
    """A selector that cannot be parsed; ``position`` is the 0-based offset into ``text``."""

    def __init__(self, text: str, position: int, message: str) -> None:
        super().__init__(f"selector {text!r}: position {position}: {message}")
        self.text = text
        self.position = position
        self.message = message


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    _regex: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"matcher {self.name!r}: unknown operator {self.op!r} (want one of {OPS})")
        if self.op in ("=~", "!~"):
            try:
                compiled = re2.compile(f"^(?s:{self.value})$", _RE2_OPTIONS)
            except Exception as e:  # re2.error is not a stable public type across versions
                raise ValueError(f"matcher {self.name!r}: invalid regex {self.value!r}: {_text(e)}") from e
            object.__setattr__(self, "_regex", compiled)

    def matches_value(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = self._regex.match(value) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{_quote(self.value)}"


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    def matches(self, labels: Labels) -> bool:
        for m in self.matchers:
            value = ""
            for n, v in labels:
                if n == m.name:
                    value = v
                    break
            if not m.matches_value(value):
                return False
        return True

    def __str__(self) -> str:
        return "{" + ",".join(str(m) for m in self.matchers) + "}"


def _text(error: Exception) -> str:
    arg = error.args[0] if error.args else error
    return arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", '"': '"', "'": "'"}


def _is_name_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c == "_")


def _is_name_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, pos: int | None = None) -> SelectorError:
        return SelectorError(self.text, self.pos if pos is None else pos, message)

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name(self, allow_colon: bool) -> str:
        start = self.pos
        if not _is_name_start(self.peek()) and not (allow_colon and self.peek() == ":"):
            raise self.error("expected a name")
        while self.pos < len(self.text) and (
            _is_name_char(self.text[self.pos]) or (allow_colon and self.text[self.pos] == ":")
        ):
            self.pos += 1
        return self.text[start:self.pos]

    def string(self) -> str:
        quote = self.peek()
        if quote not in ('"', "'", "`"):
            raise self.error("expected a quoted string")
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated string", start)
            c = self.text[self.pos]
            if c == quote:
                self.pos += 1
                return "".join(out)
            if c == "\\" and quote != "`":
                out.append(self.escape())
                continue
            if c == "\n" and quote != "`":
                raise self.error("newline in string")
            out.append(c)
            self.pos += 1

    def escape(self) -> str:
        at = self.pos
        self.pos += 1
        c = self.peek()
        if c in _SIMPLE_ESCAPES:
            self.pos += 1
            return _SIMPLE_ESCAPES[c]
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width is not None:
            digits = self.text[self.pos + 1:self.pos + 1 + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"invalid \\{c} escape", at)
            self.pos += 1 + width
            return chr(int(digits, 16))
        digits = self.text[self.pos:self.pos + 3]
        if len(digits) == 3 and all(d in "01234567" for d in digits):
            self.pos += 3
            return chr(int(digits, 8))
        raise self.error(f"unknown escape sequence \\{c}", at)

    def matcher(self) -> Matcher:
        self.skip_ws()
        label = self.string() if self.peek() == '"' else self.name(allow_colon=False)
        self.skip_ws()
        op_pos = self.pos
        two = self.text[self.pos:self.pos + 2]
        if two in ("!=", "=~", "!~"):
            op = two
        elif self.peek() == "=":
            op = "="
        else:
            raise self.error("expected one of =, !=, =~, !~")
        self.pos += len(op)
        self.skip_ws()
        value_pos = self.pos
        value = self.string()
        try:
            return Matcher(label, op, value)
        except ValueError as e:
            raise self.error(str(e), value_pos if op in ("=~", "!~") else op_pos) from e

    def selector(self) -> Selector:
        self.skip_ws()
        matchers: list[Matcher] = []
        bare_name = self.peek() != "{"
        if bare_name:
            metric = self.name(allow_colon=True)
            matchers.append(Matcher(METRIC_NAME, "=", metric))
            self.skip_ws()
        if self.peek() == "{":
            self.pos += 1
            self.skip_ws()
            while self.peek() != "}":
                if not self.peek():
                    raise self.error("expected '}'")
                at = self.pos
                m = self.matcher()
                if bare_name and m.name == METRIC_NAME:
                    raise self.error("metric name given twice", at)
                matchers.append(m)
                self.skip_ws()
                if self.peek() == ",":
                    self.pos += 1
                    self.skip_ws()
                elif self.peek() != "}":
                    raise self.error("expected ',' or '}'")
            self.pos += 1
        self.skip_ws()
        if self.pos != len(self.text):
            raise self.error("unexpected text after selector")
        return Selector(tuple(matchers))


def parse_selector(text: str) -> Selector:
    """``'{__name__=~"DCGM_FI_DEV_.*",pod!=""}'`` or ``'metric{a="b"}'`` -> :class:`Selector`."""
    if not text.strip():
        raise SelectorError(text, 0, "empty selector")
    return _Parser(text).selector()
