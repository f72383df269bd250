"""Remote-write client policy as pure functions: retry classes, Retry-After, backoff with jitter,
request headers, written counts of a reply, the reason label of a failure (reference §1, §5, §6).
Used by relay.sender; no I/O here."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping

from relay.delivery.transport import CREDENTIALS_PREFIX

REMOTE_WRITE_VERSION = "0.1.0"
RESERVED_HEADERS = frozenset(
    {"content-encoding", "content-type", "user-agent", "x-prometheus-remote-write-version", "retry-attempt"}
)
EXPIRED_MARKERS = ("expired", "expiredtoken")  # body checked lower-cased
JITTER = 0.2
_DELTA_SECONDS = re.compile(r"[0-9]{1,12}")
WRITTEN_HEADERS = ("x-prometheus-remote-write-samples-written", "x-prometheus-remote-write-histograms-written")


def classify(status: int, body: bytes) -> str:
    """'ok', 'retry', 'refresh' (403 expired token) or 'drop'."""
    if 200 <= status < 300:
        return "ok"
    if status == 0 or status >= 500 or status in (408, 429):
        return "retry"
    if status == 403 and any(m in body.decode("utf-8", "replace").lower() for m in EXPIRED_MARKERS):
        return "refresh"
    return "drop"


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date); None if absent or bad."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - now)
    except Exception:  # anything else is not a Retry-After: ignore it (never fail the send loop)
        return None


def written_count(headers: Mapping[str, str]) -> int | None:
    """Samples + histograms the destination says it wrote (RW 2.0 response headers); None if unsaid."""
    total: int | None = None
    for name in WRITTEN_HEADERS:
        raw = headers.get(name)
        if raw is not None and raw.strip().isascii() and raw.strip().isdigit():
            total = (total or 0) + int(raw.strip())
    return total


def first_line(body: bytes, limit: int = 200) -> str:
    """The body's first non-empty line, for logs and last_error (bodies never carry secrets)."""
    for line in body[:4096].decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def failure_reason(status: int, body: bytes = b"") -> str:
    """The reason label of a failed attempt: http_<code>, network or credentials."""
    if status:
        return f"http_{status}"
    return "credentials" if body.startswith(CREDENTIALS_PREFIX) else "network"


def backoff_delay(backoff: float, max_backoff: float, rnd: float) -> float:
    """``backoff`` with +-JITTER jitter (rnd in [0, 1)), capped at max_backoff."""
    return min(max_backoff, backoff * (1.0 - JITTER + 2 * JITTER * rnd))


def request_headers(user: Mapping[str, str] | None, user_agent: str, attempt: int) -> dict[str, str]:
    """User headers, then the reserved remote-write headers that users may not override."""
    out = {k: v for k, v in (user or {}).items() if k.lower() not in RESERVED_HEADERS}
    out["Content-Encoding"] = "snappy"
    out["Content-Type"] = "application/x-protobuf"
    out["User-Agent"] = user_agent
    out["X-Prometheus-Remote-Write-Version"] = REMOTE_WRITE_VERSION
    if attempt > 0:
        out["Retry-Attempt"] = str(attempt)
    return out
