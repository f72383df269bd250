"""Response heads as http.client reads them: endless dropped or folded lines and interim 100 heads
count against the limit (relay.common.http_head).

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

import http.client
import io

import pytest

from relay.common.http_head import MAX_HEADERS, Response


class _Sock:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.raw))


def _begin(cls: type[http.client.HTTPResponse], raw: bytes) -> str:
    r = cls(_Sock(raw), method="POST")  # type: ignore[arg-type]
    try:
        r.begin()
    except http.client.HTTPException as e:
        return type(e).__name__
    return f"{r.status}"


@pytest.mark.parametrize("line", [b"not a header line\r\n", b"  folded onto the previous value\r\n",
                                  b"Bad Name: v\r\n"])
def test_a_response_head_of_endless_dropped_or_folded_lines_is_refused_like_http_clients(line: bytes) -> None:
    # a receiver (or anything between) that streams such lines must not hold the sender forever nor
    # grow a value without bound: http.client counts every line against its 100, so must we
    raw = b"HTTP/1.1 200 OK\r\nX-A: 1\r\n" + line * (MAX_HEADERS + 5) + b"Content-Length: 0\r\n\r\n"
    assert _begin(http.client.HTTPResponse, raw) == "HTTPException"
    assert _begin(Response, raw) == "HTTPException"


def test_an_interim_100_heads_lines_count_against_the_limit_too() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n" + b"junk\r\n" * (MAX_HEADERS + 5) + b"\r\nHTTP/1.1 204 No Content\r\n\r\n"
    assert _begin(http.client.HTTPResponse, raw) == "HTTPException"
    assert _begin(Response, raw) == "HTTPException"
