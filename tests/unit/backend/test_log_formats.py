"""The log's formatters (backend.log): `json` records, and control characters escaped in every
format, including inside context fields and tracebacks."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from pystub_backend.backend import log as backend_log
from pystub_backend.backend.log import LogSettings, configure_logging, escape_text

HOSTILE = "a\r\nb\x1b[2Jc\x9bd\u2028e\tf"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    saved = asdict(backend_log.settings)
    logger = logging.getLogger("pystub")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    buffer = io.StringIO()
    yield buffer
    for key, value in saved.items():
        setattr(backend_log.settings, key, value)
    logger.handlers[:] = handlers
    logger.propagate, logger.level = propagate, level


def _configure(buffer: io.StringIO, log_format: str) -> logging.Logger:
    configure_logging(LogSettings(log_format=log_format))
    handler = logging.getLogger("pystub").handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buffer)
    return logging.getLogger("pystub.test")


def test_escape_text() -> None:
    assert escape_text(HOSTILE) == "a\\r\\nb\\x1b[2Jc\\x9bd\\u2028e\\tf"
    assert escape_text("plain 'text' ünïcode") == "plain 'text' ünïcode"


def test_json_records_carry_context_and_decode_to_what_was_logged(stream: io.StringIO) -> None:
    log = _configure(stream, "json")
    log.info("request %s", HOSTILE, extra={"model": HOSTILE, "version": 3, "request_id": "r1"})
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        log.exception("failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert all(ord(char) >= 0x20 and not 0x7F <= ord(char) < 0xA0 and char not in "\u2028\u2029"
               for line in lines for char in line)
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == f"request {HOSTILE}" and first["model"] == HOSTILE
    assert first["version"] == 3 and first["request_id"] == "r1" and first["level"] == "INFO"
    assert first["file"].startswith("test_log_formats.py:") and first["pid"] > 0
    assert second["level"] == "ERROR" and "ValueError" in second["exception"] and HOSTILE in second["exception"]


@pytest.mark.parametrize("log_format", ["default", "ISO8601"])
def test_text_formats_escape_messages_and_put_each_traceback_line_under_the_head(
        stream: io.StringIO, log_format: str) -> None:
    log = _configure(stream, log_format)
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        log.exception("failed for %s", HOSTILE)
    lines = stream.getvalue().splitlines()
    head = lines[0][:lines[0].index("] ") + 1]
    assert lines[0] == f"{head} failed for {escape_text(HOSTILE)}"
    assert len(lines) > 3 and all(line.startswith(head + " ") for line in lines)
    # The exception text's own line feed breaks the traceback's line too, but under the head again.
    assert lines[-2:] == [f"{head} ValueError: a\\r", f"{head} b\\x1b[2Jc\\x9bd\\u2028e\\tf"]
