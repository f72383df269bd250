"""Connection I/O for relay.server: reads bounded by a deadline, writes in one piece, reply heads."""

from __future__ import annotations

import email.utils
import http
import io
import socket
import struct
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
_TIMEVAL = struct.Struct("@ll")  # struct timeval (Linux: two longs)


class KernelTimeout:
    """A blocking socket whose reads (``SO_RCVTIMEO``) or writes (``SO_SNDTIMEO``) the kernel times out.

    Why not ``socket.settimeout``: CPython runs a socket with a timeout as a non-blocking one and calls
    poll() before every recv() and send(), each call releasing and taking the GIL again. On a relay with
    a few busy connections each GIL hand-off is a futex wake and a context switch (issue 20 point 10:
    35 futex calls a request). A blocking socket with a kernel timeout does one syscall a read; when the
    timeout passes the call fails with EAGAIN (BlockingIOError), raised here as TimeoutError.
    ``seconds`` is what the socket holds now (None: never set, so no timeout)."""

    __slots__ = ("_opt", "_sock", "seconds")

    def __init__(self, sock: socket.socket, opt: int) -> None:
        self._sock = sock
        self._opt = opt
        self.seconds: float | None = None

    def set(self, seconds: float) -> None:
        seconds = max(seconds, 1e-3)  # 0 would mean no timeout at all
        whole = int(seconds)
        self._sock.setsockopt(socket.SOL_SOCKET, self._opt, _TIMEVAL.pack(whole, int((seconds - whole) * 1e6)))
        self.seconds = seconds

    def bound(self, left: float) -> None:
        """Make the timeout end a call by ``left`` seconds from now and not much later (LATE_S, or a
        tenth of what is left); a timeout already within that is kept (each change is a syscall)."""
        now = self.seconds
        if now is None or now > left + min(LATE_S, left / 10) or now < left:
            self.set(left)


def blocking(sock: socket.socket) -> None:
    """Put ``sock`` in blocking mode (no poll() before each call) for KernelTimeout's timeouts."""
    if sock.gettimeout() is not None:
        sock.settimeout(None)


class DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by what is left until ``deadline`` (monotonic seconds;
    None: no bound of its own). Past the deadline a read raises TimeoutError, so a client that
    sends one byte a second cannot hold a request open for longer than the deadline allows.
    The socket must be blocking (``blocking``); the kernel times each read out (KernelTimeout)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._timeout = KernelTimeout(sock, socket.SO_RCVTIMEO)
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("read deadline passed")
            # Never a timeout that ends a read before the deadline; one that may end it a little after
            # is kept: the reads of a request that arrives quickly reuse its first read's timeout.
            self._timeout.bound(left)
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:  # SO_RCVTIMEO passed with nothing read
            raise TimeoutError("read timed out") from None


class SocketWriter(io.RawIOBase):
    """Every write is one send where the socket takes it whole (a reply built whole leaves in one
    segment train, TCP_NODELAY), all of a write within ``timeout`` seconds (as CPython's sendall with a
    socket timeout: a slow reader cannot hold the connection past it), timed by the kernel
    (SO_SNDTIMEO, KernelTimeout) on a blocking socket."""

    def __init__(self, sock: socket.socket, timeout: float = 30.0) -> None:
        super().__init__()
        self._sock = sock
        self._timeout = KernelTimeout(sock, socket.SO_SNDTIMEO)
        self.timeout = timeout

    def writable(self) -> bool:
        return True

    def write(self, data: Any, /) -> int:
        view = memoryview(data).cast("B")
        total, size = 0, len(view)
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"reply not sent within {self.timeout:g} s ({total} of {size} bytes)")
            self._timeout.bound(left)
            try:
                total += self._sock.send(view[total:] if total else view)
            except BlockingIOError:  # SO_SNDTIMEO passed with nothing sent
                continue  # the deadline check above ends it
            if total >= size:
                return size
