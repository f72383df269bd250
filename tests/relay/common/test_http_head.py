"""relay.http_head: the request head parser the relay's HTTP front uses instead of email's."""

from __future__ import annotations

import email.utils
import http.client
import io

import pytest

from relay.common.http_head import MAX_HEADERS, MAX_LINE, HeadError, Headers, Response, parse_line, read_headers
from relay.ingest import http_conn


@pytest.mark.parametrize(("line", "parsed"), [
    (b"Content-Length: 5", ("Content-Length", "5")),
    (b"content-length:5", ("content-length", "5")),
    (b"X-Empty:", ("X-Empty", "")),
    (b"X-Pad: \t padded value \t", ("X-Pad", "padded value")),
    (b"X-Colons: a:b:c", ("X-Colons", "a:b:c")),
    (b"X-Latin: caf\xe9", ("X-Latin", "caf\u00e9")),
    (b"X-Tchars!#$%&'*+-.^_`|~09: v", ("X-Tchars!#$%&'*+-.^_`|~09", "v")),
    (b"Content-Length : 5", HeadError(400, "Malformed header line")),  # RFC 9112 5.1: must be refused
    (b"Content Length: 5", HeadError(400, "Malformed header line")),
    (b": no name", HeadError(400, "Malformed header line")),
    (b"no colon at all", HeadError(400, "Malformed header line")),
    (b"X-CR: a\rb", HeadError(400, "Malformed header line")),
    (b"X-NUL: a\0b", HeadError(400, "Malformed header line")),
    (b"X-\xe9: v", HeadError(400, "Malformed header line")),
    (b" folded continuation", HeadError(400, "Obsolete line folding in headers")),
    (b"\tfolded continuation", HeadError(400, "Obsolete line folding in headers")),
])
def test_a_header_line_is_a_token_a_colon_and_a_trimmed_value_or_is_refused(
    line: bytes, parsed: tuple[str, str] | HeadError
) -> None:
    assert parse_line(line) == parsed


def _read(raw: bytes) -> Headers | HeadError:
    return read_headers(io.BufferedReader(io.BytesIO(raw)))  # type: ignore[arg-type]


def test_headers_end_at_the_empty_line_and_leave_the_body_unread() -> None:
    f = io.BufferedReader(io.BytesIO(b"Host: x\r\nContent-Length: 4\r\n\r\nbody"))  # type: ignore[arg-type]
    h = read_headers(f)
    assert isinstance(h, Headers) and h.items() == [("Host", "x"), ("Content-Length", "4")]
    assert f.read() == b"body"


@pytest.mark.parametrize("raw", [b"Host: x\n\n", b"Host: x\r\n\r\n", b"Host: x\r\n"])
def test_bare_lf_line_ends_and_a_head_cut_off_by_the_end_of_the_stream_parse(raw: bytes) -> None:
    h = _read(raw)
    assert isinstance(h, Headers) and h.items() == [("Host", "x")]


def test_lookups_ignore_case_and_repeated_headers_keep_every_value_in_order() -> None:
    h = _read(b"Content-Length: 5\r\nX-A: 1\r\ncontent-length: 6\r\n\r\n")
    assert isinstance(h, Headers)
    assert "CONTENT-LENGTH" in h and "x-a" in h and "X-B" not in h and 5 not in h
    assert h["content-length"] == "5" and h.get("Content-Length") == "5"  # the first, as email's Message
    assert h.get_all("Content-Length") == ["5", "6"] and h.get_all("X-B") is None and h.get_all("X-B", []) == []
    assert h.get("X-B") is None and h.get("X-B", "d") == "d"
    assert list(h) == ["Content-Length", "X-A"] and len(h) == 2
    assert h.lowered() == {"content-length": "6", "x-a": "1"}  # the last, as a dict of items() holds
    with pytest.raises(KeyError):
        h["X-B"]


def test_a_line_over_the_limit_is_431_line_too_long() -> None:
    at_limit = _read(b"X-Big: " + b"a" * (MAX_LINE - 9) + b"\r\n\r\n")  # MAX_LINE bytes with its CRLF
    assert isinstance(at_limit, Headers) and at_limit["X-Big"] == "a" * (MAX_LINE - 9)
    assert _read(b"X-Big: " + b"a" * MAX_LINE + b"\r\n\r\n") == HeadError(431, "Line too long")


def test_more_than_the_maximum_headers_is_431_too_many_headers() -> None:
    ok = _read(b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n")
    assert isinstance(ok, Headers) and len(ok) == MAX_HEADERS
    assert _read(b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n") == HeadError(
        431, "Too many headers")


def test_the_first_malformed_line_refuses_the_head() -> None:
    assert _read(b"Host: x\r\nBad Line\r\nContent-Length: 5\r\n\r\n") == HeadError(400, "Malformed header line")


def test_the_date_header_is_formatted_once_a_second_and_is_rfc_9110s() -> None:
    assert http_conn.http_date(1_700_000_000.2) == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert http_conn.http_date(1_700_000_000.9) == email.utils.formatdate(1_700_000_000, usegmt=True)
    assert http_conn.http_date(1_700_000_001.0) == "Tue, 14 Nov 2023 22:13:21 GMT"


# ---- responses (the sender's transport) ----------------------------------------------------------

def test_a_response_head_is_read_leniently_folded_lines_join_and_malformed_ones_are_dropped() -> None:
    h = read_headers(io.BufferedReader(io.BytesIO(  # type: ignore[arg-type]
        b"X-A: 1\r\n  continued\r\nNot a header\r\nBad Name: v\r\nX-Spaced : 2\r\nX-B: 3\r\n\r\n")), strict=False)
    assert isinstance(h, Headers)
    # (email keeps a fold's CRLF and tab in the value; RFC 9112 5.2 replaces the fold by one space)
    assert h.items() == [("X-A", "1 continued"), ("X-Spaced", "2"), ("X-B", "3")]


class _Sock:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.raw))  # type: ignore[arg-type]


RESPONSES = [
    b"HTTP/1.1 204 No Content\r\nDate: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nbad request",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\n\r\nuntil the connection closes",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nbusy",
    b"HTTP/1.1 200 OK\r\n\r\nno length: until close",
    b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\nneg",
    b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nbad length",
    b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\nRETRY-AFTER: 8\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
]


def _outcome(cls: type[http.client.HTTPResponse], raw: bytes, method: str = "POST") -> tuple[object, ...]:
    r = cls(_Sock(raw), method=method)  # type: ignore[arg-type]
    try:
        r.begin()
    except http.client.HTTPException as e:
        return ("error", type(e).__name__)
    return (r.status, r.reason, r.version, r.will_close, r.chunked, r.length,
            [(k.lower(), v) for k, v in r.getheaders()], r.getheader("retry-after"), r.read())


@pytest.mark.parametrize("raw", RESPONSES)
def test_the_transports_response_reads_status_framing_headers_and_body_as_http_client_does(raw: bytes) -> None:
    assert _outcome(Response, raw) == _outcome(http.client.HTTPResponse, raw)


def test_a_head_requests_response_has_no_body_as_in_http_client() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert _outcome(Response, raw, "HEAD") == _outcome(http.client.HTTPResponse, raw, "HEAD")


@pytest.mark.parametrize(("raw", "error"), [
    (b"HTTP/2 200 OK\r\n\r\n", "UnknownProtocol"),
    (b"garbage\r\n\r\n", "BadStatusLine"),
    (b"", "RemoteDisconnected"),
    (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n", "HTTPException"),
])
def test_a_response_that_cannot_be_read_raises_http_clients_errors(raw: bytes, error: str) -> None:
    assert _outcome(Response, raw)[:2] == ("error", error)
