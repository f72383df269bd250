"""What the relay's HTTP front answers with, and what it asks of the code behind it.

``Reply`` is a whole answer (status, body, content type, extra headers); ``Endpoints`` is the
interface the front delegates every request to (relay.control.service.Runtime in production, fakes in
tests). ``text`` builds a one-line plain-text reply (the message's whitespace collapsed, nothing of
the request echoed), ``busy`` the 503 with Retry-After that load refusals share.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


class Endpoints(Protocol):
    max_request_bytes: int

    def write(self, headers: Mapping[str, str], body: bytes) -> Reply: ...

    def metrics(self, accept: str) -> Reply: ...

    def healthy(self) -> Reply: ...

    def ready(self) -> Reply: ...

    def reload(self) -> Reply: ...

    def cardinality(self, query: Mapping[str, list[str]]) -> Reply: ...

    def status_page(self, query: Mapping[str, list[str]]) -> Reply: ...


def json_reply(status: int, obj: Any) -> Reply:
    return Reply(status, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode(), "application/json")


def text(status: int, message: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, (" ".join(message.split()) + "\n").encode(), headers=headers or {})


def busy(what: str) -> Reply:
    return text(503, f"too many concurrent {what}; retry later", {"Retry-After": str(RETRY_AFTER_S)})
