"""telemetry_common.logs: one line per event in text, json and logfmt; UTC RFC 3339; quiet libraries."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from telemetry_common import logs

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def capture() -> io.StringIO:
    stream = io.StringIO()
    yield stream
    logs.configure("text", "warning", io.StringIO())


def _emit(fmt: str, stream: io.StringIO, level: str = "info") -> list[str]:
    logs.configure(fmt, level, stream)
    logging.getLogger("relay.sender").warning(
        "refused:\nline two %s", "x", extra={"destination": "amp", "reason": 'say "hi"'}
    )
    return stream.getvalue().splitlines()


def test_json_is_one_object_per_event_with_fields(capture: io.StringIO) -> None:
    lines = _emit("json", capture)
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["level"] == "warning" and obj["logger"] == "relay.sender"
    assert obj["msg"] == "refused:\nline two x"
    assert obj["destination"] == "amp" and obj["reason"] == 'say "hi"'
    assert RFC3339_UTC.match(obj["ts"])


def test_logfmt_quotes_and_escapes(capture: io.StringIO) -> None:
    (line,) = _emit("logfmt", capture)
    assert line.startswith("ts=") and " level=warning logger=relay.sender " in line
    assert 'msg="refused:\\nline two x"' in line
    assert line.endswith('destination=amp reason="say \\"hi\\""')
    assert RFC3339_UTC.match(line.split()[0][3:])


def test_text_keeps_a_multiline_message_on_one_line(capture: io.StringIO) -> None:
    (line,) = _emit("text", capture)
    stamp, level, rest = line.split(" ", 2)
    assert RFC3339_UTC.match(stamp) and level == "WARNING"
    assert rest.startswith("relay.sender: refused: | line two x destination=amp")


def test_traceback_stays_in_the_event(capture: io.StringIO) -> None:
    logs.configure("json", "info", capture)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed")
    (line,) = capture.getvalue().splitlines()
    assert "RuntimeError: boom" in json.loads(line)["msg"]


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_botocore_chatter_only_at_debug(capture: io.StringIO, level: str, shown: bool) -> None:
    logs.configure("text", level, capture)
    logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
    assert ("Found credentials" in capture.getvalue()) is shown


@pytest.mark.parametrize(("fmt", "level", "message"), [
    ("yaml", "info", "unknown log format 'yaml': expected one of text, json, logfmt"),
    ("json", "loud", "unknown log level 'loud': expected one of debug, info, warning, error"),
])
def test_unknown_choice_names_the_choices(fmt: str, level: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        logs.configure(fmt, level, io.StringIO())
