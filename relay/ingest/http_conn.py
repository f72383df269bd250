"""Connection I/O for relay.server: reads bounded by a deadline, writes in one piece, reply heads."""

from __future__ import annotations

import email.utils
import http
import io
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


_date: tuple[int, str] = (0, "")  # (second, its Date value): formatted once a second, not per reply


def http_date(now: float | None = None) -> str:
    """The Date header's value (RFC 9110 IMF-fixdate) for ``now`` (default: the time)."""
    global _date
    second = int(time.time() if now is None else now)
    cached = _date
    if cached[0] != second:
        cached = _date = (second, email.utils.formatdate(second, usegmt=True))
    return cached[1]


def response_head(status: int, content_type: str, headers: Mapping[str, str], length: int, close: bool) -> bytes:
    """Status line and headers of a reply, ready to be sent together with its body."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}", "Server: gpu-relay", f"Date: {http_date()}",
             f"Content-Type: {content_type}", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


LATE_S = 0.25  # how long past its deadline a stalled read may end, at most


class DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by what is left until ``deadline`` (monotonic seconds;
    None: the socket's own timeout). Past the deadline a read raises TimeoutError, so a client that
    sends one byte a second cannot hold a request open for longer than the deadline allows."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("read deadline passed")
            # Never a timeout that ends a read before the deadline; one that may end it a little after
            # (LATE_S, or a tenth of what is left) is kept: the reads of a request that arrives quickly
            # reuse its first read's timeout (each settimeout is a syscall and a GIL hand-off).
            now = self._sock.gettimeout()
            if now is None or now < left or now > left + min(LATE_S, left / 10):
                self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class SocketWriter(io.RawIOBase):
    """Every write is one sendall: with TCP_NODELAY, a reply built whole leaves in one segment train."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any, /) -> int:
        self._sock.sendall(data)
        return len(data)
