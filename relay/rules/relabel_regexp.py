"""The regex half of the relabel engine: RE2 ``Regexp`` and Go's ``Regexp.Expand`` templates.

- regexes are RE2, compiled fully anchored as ``^(?s:<re>)$``; ``Regexp.pattern`` is the original;
  a small program also gets an ``re2.Set`` for the ~5x cheaper yes/no match;
- ``$1``, ``${1}``, ``$name``, ``${name}`` expand the Go ``Regexp.Expand`` way: a name is the
  longest run of letters, digits and ``_`` (``$1_x`` is the group "1_x", so ""), ``$$`` is ``$``,
  a malformed ``$`` stays literal, unknown groups expand to "";
- Go string helpers for messages and the case actions (``%q`` quoting, simple case mapping).

The rules themselves (parse, validate, process) are in :mod:`relay.relabel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import re2


class RelabelConfigError(ValueError):
    """A relabel rule that can never be applied. ``field`` names the offending key (or None)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would otherwise print every bad pattern to stderr
    return options


_RE2_OPTIONS = _re2_options()


# re2.Set answers yes/no about 5x faster than re2's search() wrapper. It has no NFA fallback when its
# DFA runs out of memory, so it is only used where that cannot happen: small programs, short texts.
_SET_MAX_PROGRAM = 2000
_SET_MAX_TEXT = 1024
# Yes/no answers are memoised per regex for short texts (label names, metric names, values seen
# again and again on the uncached path): bounded, cleared when full; a pure function's results.
MEMO_MAX = 1024
MEMO_MAX_TEXT = 128


class Regexp:
    """An RE2 regex anchored as ``^(?s:pattern)$``, as Prometheus compiles relabel regexes."""

    __slots__ = ("_compiled", "_memo", "_pattern", "_set")

    def __init__(self, pattern: str) -> None:
        try:
            anchored = f"^(?s:{pattern})$"
            compiled = re2.compile(anchored, _RE2_OPTIONS)
        except re2.error as exc:
            detail = exc.args[0] if exc.args else exc
            if isinstance(detail, bytes):
                detail = detail.decode("utf-8", "replace")
            raise RelabelConfigError(
                f"error parsing regexp {_go_quote(pattern)}: {detail}", "regex"
            ) from None
        self._pattern = pattern
        self._compiled = compiled
        self._set: Any = None
        self._memo: dict[str, bool] = {}
        if compiled.programsize <= _SET_MAX_PROGRAM:
            try:
                matcher = re2.Set.SearchSet(_RE2_OPTIONS)
                matcher.Add(anchored)
                matcher.Compile()
                self._set = matcher
            except re2.error:  # pragma: no cover - the plain search below always works
                self._set = None

    @property
    def pattern(self) -> str:
        """The original text, without the anchors."""
        return self._pattern

    @property
    def groups(self) -> int:
        return int(self._compiled.groups)

    @property
    def groupindex(self) -> Mapping[str, int]:
        return dict(self._compiled.groupindex)

    def matches(self, text: str) -> bool:
        """Go ``MatchString``."""
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        hit = self._match(text)
        if len(text) <= MEMO_MAX_TEXT:
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            self._memo[text] = hit
        return hit

    def _match(self, text: str) -> bool:
        if self._set is not None and len(text) <= _SET_MAX_TEXT:
            return self._set.Match(text) is not None
        return self._compiled.search(text) is not None

    def submatch_index(self, text: str, pos: int = 0) -> list[int] | None:
        """Go ``FindStringSubmatchIndex`` (offsets in characters): [start0, end0, start1, ...]."""
        if pos == 0 and not self.matches(text):  # the yes/no check is ~5x cheaper than a search
            return None
        m = self._compiled.search(text, pos)
        if m is None:
            return None
        index: list[int] = []
        for group in range(self._compiled.groups + 1):
            index.extend(m.span(group))
        return index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Regexp) and other._pattern == self._pattern

    def __hash__(self) -> int:
        return hash(self._pattern)

    def __repr__(self) -> str:
        return f"Regexp({self._pattern!r})"


DEFAULT_REGEX = Regexp("(.*)")  # identity matters: Go compares this pointer (fast path, keepequal)

# A compiled template: literal text, or the number of the group to insert.
Template = tuple[str | int, ...]


# ---------------------------------------------------------------------------------------------
# Go Regexp.Expand


def _extract(template: str, i: int) -> tuple[str, int] | None:
    """Go ``extract``: the name after a ``$`` at ``template[i:]`` and where the rest starts."""
    n = len(template)
    brace = i < n and template[i] == "{"
    if brace:
        i += 1
    start = i
    while i < n:
        c = template[i]
        if not (c == "_" or c.isalpha() or c.isdecimal()):
            break
        i += 1
    if i == start:
        return None
    name = template[start:i]
    if brace:
        if i >= n or template[i] != "}":
            return None
        i += 1
    return name, i


def _group_number(name: str) -> int:
    """Go's number parse inside ``extract``: -1 unless plain ASCII digits without a leading zero."""
    num = 0
    for c in name:
        if not "0" <= c <= "9" or num >= 100_000_000:
            return -1
        num = num * 10 + ord(c) - 48
    if name[0] == "0" and len(name) > 1:
        return -1
    return num


def compile_template(template: str, regex: Regexp) -> Template:
    """Parse a ``$``-template once against ``regex``'s groups (Go ``Regexp.Expand`` rules)."""
    if "$" not in template:
        return (template,)
    parts: list[str | int] = []
    literal: list[str] = []
    ngroups = regex.groups
    names = regex.groupindex
    i, n = 0, len(template)
    while True:
        j = template.find("$", i)
        if j < 0:
            literal.append(template[i:])
            break
        literal.append(template[i:j])
        i = j + 1
        if i < n and template[i] == "$":
            literal.append("$")
            i += 1
            continue
        extracted = _extract(template, i)
        if extracted is None:
            literal.append("$")  # malformed: the $ is kept as text
            continue
        name, i = extracted
        num = _group_number(name)
        group = (num if num <= ngroups else None) if num >= 0 else names.get(name)
        if group is not None:  # an unknown group expands to ""
            parts.append("".join(literal))
            literal.clear()
            parts.append(group)
    parts.append("".join(literal))
    return tuple(p for p in parts if p != "")


def expand(template: Template, src: str, index: Sequence[int]) -> str:
    """Go ``Regexp.ExpandString`` with a template from ``compile_template``."""
    if len(template) == 1 and isinstance(template[0], str):
        return template[0]
    out: list[str] = []
    for part in template:
        if isinstance(part, str):
            out.append(part)
        else:
            start = index[2 * part]
            if start >= 0:
                out.append(src[start : index[2 * part + 1]])
    return "".join(out)


def _replace_all(regex: Regexp, src: str, template: Template) -> str:
    """Go ``Regexp.ReplaceAllString`` (for anchored regexes: one match, the whole string)."""
    out: list[str] = []
    last_end = 0
    pos = 0
    while pos <= len(src):
        index = regex.submatch_index(src, pos)
        if index is None:
            break
        start, end = index[0], index[1]
        out.append(src[last_end:start])
        if end > last_end or start == 0:
            out.append(expand(template, src, index))
        last_end = end
        pos = pos + 1 if pos + 1 > end else end
    out.append(src[last_end:])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Go string helpers


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_quote(s: str) -> str:
    """Go ``%q`` (strconv.Quote) for the strings in error messages."""
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c in _GO_ESCAPES:
            out.append(_GO_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x80 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def _go_case(value: str, upper: bool) -> str:
    """Go ``strings.ToUpper``/``ToLower``: one rune to one rune (simple case mapping)."""
    if value.isascii():
        return value.upper() if upper else value.lower()
    out: list[str] = []
    for c in value:
        mapped = c.upper() if upper else c.lower()
        if len(mapped) != 1:  # Python applied a full (multi-rune) mapping; Go's is simple
            if upper:
                title = c.title()  # e.g. U+1F80 -> U+1F88, the simple uppercase
                mapped = title if len(title) == 1 else c
            else:
                mapped = "i" if c == "\u0130" else c
        out.append(mapped)
    return "".join(out)
