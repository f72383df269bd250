"""Log set-up shared by both programs: ``--log-format text|json|logfmt``.

Every event is one line (a message with newlines, or a traceback, is escaped into it), stamped
in UTC RFC 3339 with milliseconds, with the level, the logger and structured fields passed as
``extra={"destination": "amp", "reason": "403"}``. Chatty libraries (botocore, boto3, urllib3)
log at DEBUG only: below that they are held at WARNING.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LOG_FORMATS = ("text", "json", "logfmt")
LOG_LEVELS = ("debug", "info", "warning", "error")
QUIET_LIBRARIES = ("botocore", "boto3", "urllib3", "s3transfer", "grpc")

# LogRecord attributes of the standard library: anything else on a record is a structured field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def utc_timestamp(created: float) -> str:
    """RFC 3339 in UTC with milliseconds: ``2026-12-01T09:40:00.123Z``."""
    secs = int(created)
    millis = int((created - secs) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{millis:03d}Z"


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record (its ``extra``), in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _message(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + formatter.formatException(record.exc_info)
    if record.stack_info:
        text += "\n" + formatter.formatStack(record.stack_info)
    return text


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger: message key=value ...`` on one line (newlines become `` | ``)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = _message(record, self).replace("\r\n", "\n").replace("\n", " | ")
        extra = "".join(f" {k}={_logfmt_value(v)}" for k, v in fields_of(record).items())
        return f"{utc_timestamp(record.created)} {record.levelname} {record.name}: {msg}{extra}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record, self),
        }
        for k, v in fields_of(record).items():
            obj.setdefault(k, v)
        return json.dumps(obj, default=str, ensure_ascii=False)


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\r\t'):
        return text
    return json.dumps(text, ensure_ascii=False)  # a quoted string with \n, \" and \\ escaped


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=relay.sender msg="..." destination=amp``."""

    def format(self, record: logging.LogRecord) -> str:
        pairs: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record, self),
        }
        for k, v in fields_of(record).items():
            pairs.setdefault(k, v)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs.items())


_FORMATTERS: dict[str, type[logging.Formatter]] = {
    "text": TextFormatter,
    "json": JsonFormatter,
    "logfmt": LogfmtFormatter,
}


def formatter(fmt: str) -> logging.Formatter:
    try:
        return _FORMATTERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}") from None


def configure(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one writing ``fmt`` lines to ``stream`` (stderr).

    Raises ValueError naming the choices for an unknown format or level.
    """
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}: expected one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)
    return handler
