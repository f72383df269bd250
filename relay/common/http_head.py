"""The head of an HTTP/1.x request or response, read and parsed without the email package.

http.server hands header parsing to ``email.parser`` (a MIME parser: policy objects, content-type
probes, a lower() per header per lookup), which cost about a tenth of the relay's CPU per small write.
``read_headers`` reads the header lines of a request whose request line is well formed, with
http.client's limits (a line of at most 65,536 bytes, at most 100 headers, answered 431), and parses
them strictly as RFC 9112 asks of a server: ``name: value`` with a token for a name and nothing
between the name and its colon, no obsolete line folding (both answered 400: a proxy before us might
read such a line otherwise, which is how requests get smuggled). ``Headers`` offers what the server
reads of email's Message: ``in``, ``get`` (the first value), ``get_all``, ``items``, case-insensitive.

``read_headers(rfile, strict=False)`` reads a response head the way http.client does, leniently (a
receiver's odd header must not fail every send): a folded line continues the previous value, a line
that is not ``name: value`` is skipped. ``Response`` is http.client's HTTPResponse with that reader
(the sender's transport uses it).
"""

from __future__ import annotations

import http
import http.client
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, overload

MAX_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
_T = TypeVar("_T")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True, slots=True)
class HeadError:
    """Why a head cannot be read: the status to answer and its reason phrase."""

    status: int
    reason: str


class Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class Headers(Mapping[str, str]):
    """A request's headers in arrival order; lookups ignore case. ``h[name]`` and ``get`` give the
    first value of a repeated header, ``get_all`` every one; iteration gives each name once."""

    __slots__ = ("_fields", "_index")

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields
        self._index: dict[str, list[str]] = {}
        for name, value in fields:
            self._index.setdefault(name.lower(), []).append(value)

    def __getitem__(self, name: str) -> str:
        return self._index[name.lower()][0]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._index

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for name, _ in self._fields:
            if name.lower() not in seen:
                seen.add(name.lower())
                yield name

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def get(self, name: str, /) -> str | None: ...

    @overload
    def get(self, name: str, /, default: str | _T) -> str | _T: ...

    def get(self, name: str, /, default: object = None) -> object:
        values = self._index.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: list[str] | None = None) -> list[str] | None:
        values = self._index.get(name.lower())
        return list(values) if values else default

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        """Every (name, value) in arrival order, repeats included (as email's Message gives them)."""
        return list(self._fields)

    def lowered(self) -> dict[str, str]:
        """name.lower() -> value; of a repeated header the last value (what a dict of items() holds)."""
        return {name: values[-1] for name, values in self._index.items()}

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


def parse_line(line: bytes) -> tuple[str, str] | HeadError:
    """One header line (its CRLF or LF already stripped) as (name, value), or why it is refused."""
    if line[:1] in (b" ", b"\t"):
        return HeadError(400, "Obsolete line folding in headers")
    if b"\r" in line or b"\0" in line or b"\n" in line:
        return HeadError(400, "Malformed header line")
    text = line.decode("iso-8859-1")
    name, sep, value = text.partition(":")
    if not sep or not _TOKEN.fullmatch(name):
        return HeadError(400, "Malformed header line")
    return name, value.strip(" \t")


def _lenient(fields: list[tuple[str, str]], line: bytes) -> None:
    """A response header line into ``fields``: folded lines continue the last value; a line that
    is not ``name: value`` is dropped (as email's parser drops it from the headers)."""
    text = line.decode("iso-8859-1")
    if text[:1] in (" ", "\t"):
        if fields:
            name, value = fields[-1]
            fields[-1] = (name, (value + " " + text.strip(" \t")).strip())
        return
    name, sep, value = text.partition(":")
    name = name.rstrip(" \t")
    if sep and name and _TOKEN.fullmatch(name):
        fields.append((name, value.strip(" \t")))


def read_headers(rfile: Lines, strict: bool = True) -> Headers | HeadError:
    """The header lines up to the empty line that ends them (or the end of the stream). Timeouts and
    socket errors of ``rfile`` propagate. ``strict``: a request's (refuse malformed lines); else a
    response's (see ``_lenient``); the limits hold either way."""
    fields: list[tuple[str, str]] = []
    lines = 0  # every line counts, folded or dropped ones too (else a peer could stream them forever)
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            return HeadError(431, "Line too long")
        if line in (b"\r\n", b"\n", b""):
            return Headers(fields)
        if lines >= MAX_HEADERS:
            return HeadError(431, "Too many headers")
        lines += 1
        end = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
        if not strict:
            _lenient(fields, line[: len(line) - end])
            continue
        parsed = parse_line(line[: len(line) - end])
        if isinstance(parsed, HeadError):
            return parsed
        fields.append(parsed)


class Response(http.client.HTTPResponse):
    """http.client's response with its head read by ``read_headers(strict=False)``: the same status,
    version, framing (Content-Length, chunked, close) and errors, without the email parser."""

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != http.HTTPStatus.CONTINUE:
                break
            skipped = read_headers(self.fp, strict=False)  # an interim 100's head
            if isinstance(skipped, HeadError):
                raise http.client.HTTPException(skipped.reason.lower())
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        head = read_headers(self.fp, strict=False)
        if isinstance(head, HeadError):
            raise http.client.HTTPException(head.reason.lower())
        self.headers = self.msg = head
        self.chunked = head.get("transfer-encoding", "").lower() == "chunked"
        self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = head.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            if self.length is not None and self.length < 0:  # a negative length means nothing
                self.length = None
        if status in (http.HTTPStatus.NO_CONTENT, http.HTTPStatus.NOT_MODIFIED) or 100 <= status < 200 \
                or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True  # no framing: the body ends when the connection does
