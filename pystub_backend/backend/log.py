"""The backend's log: Triton's glog-style lines, with settings changeable at run time.

    default  I1121 17:45:00.123456 4242 core.py:77] successfully loaded 'add_sub' version 1
    ISO8601  2026-11-21T17:45:00Z I 4242 core.py:77] successfully loaded 'add_sub' version 1
    json     {"time": "2026-11-21T17:45:00.123456Z", "level": "INFO", "pid": 4242,
              "file": "core.py:77", "message": "successfully loaded 'add_sub' version 1", "model": "add_sub"}

`json` is a pystub extension (`--log-format json`): one object per line, with the record's
context fields (`model`, `version`, `instance`, `request_id`, ... passed as `extra=`) as keys;
the text formats leave them out (the message names what matters, as Triton's lines do).

Nothing a client sends reaches a line unescaped: every formatter escapes control characters (CR,
LF, ESC, the C1 range, DEL, U+2028/2029) in the message and in context fields, so a model name or
request id cannot forge a line or drive the terminal. Text formats write `\n`, `\r`, `\t`,
`\x1b` ...; a traceback keeps its own line breaks, each continuation line under the record's head,
so every physical line starts with a true head. JSON escapes them as JSON does.

`LogSettings` mirrors the logging extension (docs/reference/protocol.md#logging-extension); the filter consults it on
every record, so a change through `/v2/logging` takes effect at once. The extension accepts only
Triton's two formats (as Triton does); `json` is chosen on the command line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pystub_backend.backend.errors import ServerError, Status

__all__ = ["LogSettings", "configure_logging", "settings", "update_settings", "LOG_FORMATS", "CLI_LOG_FORMATS",
           "CONTEXT_FIELDS", "escape_text", "verbose"]

LOG_FORMATS = ("default", "ISO8601")  # what the logging extension accepts (Triton's)
CLI_LOG_FORMATS = (*LOG_FORMATS, "json")  # what --log-format accepts
# Context a record may carry (`log.info(..., extra={"model": name})`): keys of the JSON format.
CONTEXT_FIELDS = ("model", "version", "instance", "request_id", "peer", "method", "path", "status",
                  "duration_ms")


@dataclass
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def allows(self, level: int) -> bool:
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0


settings = LogSettings()


def verbose(level: int = 1) -> bool:
    """Whether verbose lines of `level` are printed now (a cheap check before building one)."""
    return settings.log_verbose_level >= level

_BOOLEAN_KEYS = ("log_info", "log_warning", "log_error")


def _checked(key: str, value: Any) -> Any:
    """The value if it suits `key`; raises ServerError (INVALID_ARG) otherwise."""
    if key in _BOOLEAN_KEYS:
        if not isinstance(value, bool):
            raise ServerError(f"log setting '{key}' must be a boolean, got {value!r}", Status.INVALID_ARG)
    elif key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServerError(f"log setting 'log_verbose_level' must be an integer >= 0, got {value!r}",
                              Status.INVALID_ARG)
    elif key == "log_format" and value not in LOG_FORMATS:
        raise ServerError(f"invalid argument for --log_format, got: {value}", Status.INVALID_ARG)  # Triton's text
    return value


def update_settings(updates: Mapping[str, Any]) -> dict[str, object]:
    """Apply a logging-extension update (docs/reference/protocol.md#logging-extension) and return every setting.

    All or nothing: every value is checked before any is applied. Omitted keys stay as they are;
    unknown keys are ignored, as Triton does. Raises ServerError: UNSUPPORTED for `log_file`,
    INVALID_ARG for a value of the wrong type or range.
    """
    if "log_file" in updates:
        raise ServerError("log file location can not be updated through network protocol", Status.UNSUPPORTED)
    checked = {key: _checked(key, value) for key, value in updates.items() if hasattr(settings, key)}
    for key, value in checked.items():
        setattr(settings, key, value)
    return settings.as_dict()

_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}
_LEVEL_NAME = {logging.DEBUG: "VERBOSE", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
               logging.CRITICAL: "ERROR"}
# C0 controls, DEL, C1 controls and the Unicode line/paragraph separators a terminal or a log
# viewer may treat as a line break.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# What json.dumps(ensure_ascii=False) leaves raw: only inside strings, so \u escapes stay valid JSON.
_JSON_RAW = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_text(text: str) -> str:
    """`text` with every control character written as an escape (`\\n`, `\\x1b`, ...)."""
    return _CONTROL.sub(_escape_one, text) if _CONTROL.search(text) else text


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {key: record.__dict__[key] for key in CONTEXT_FIELDS if key in record.__dict__}


class _TextFormatter(logging.Formatter):
    """Triton's glog-style lines (`default`) or its ISO8601 variant, escaped."""

    def __init__(self, iso8601: bool) -> None:
        super().__init__()
        self.iso8601 = iso8601

    def _head(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "I")
        seconds = int(record.created)
        micros = int((record.created - seconds) * 1_000_000)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
            return f"{stamp} {letter} {record.process} {record.filename}:{record.lineno}]"
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(seconds))
        return f"{letter}{stamp}.{micros:06d} {record.process} {record.filename}:{record.lineno}]"

    def format(self, record: logging.LogRecord) -> str:
        head = self._head(record)
        text = escape_text(record.getMessage())
        if record.exc_info:
            # The traceback's own line breaks stay, each continuation under this record's head.
            lines = self.formatException(record.exc_info).split("\n")
            text += "".join(f"\n{head} {escape_text(line)}" for line in lines)
        return f"{head} {text}"


class _JsonFormatter(logging.Formatter):
    """One JSON object per line (pystub's `--log-format json`)."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        micros = int((record.created - seconds) * 1_000_000)
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z",
            "level": _LEVEL_NAME.get(record.levelno, "INFO"), "pid": record.process,
            "file": f"{record.filename}:{record.lineno}", "message": record.getMessage()}
        for key, value in _context(record).items():
            entry[key] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False).translate(_JSON_RAW)


_FORMATTERS: dict[str, logging.Formatter] = {"default": _TextFormatter(False), "ISO8601": _TextFormatter(True),
                                             "json": _JsonFormatter()}


class _SettingsFormatter(logging.Formatter):
    """The formatter `settings.log_format` names now (it changes through the logging extension)."""

    def format(self, record: logging.LogRecord) -> str:
        return _FORMATTERS.get(settings.log_format, _FORMATTERS["default"]).format(record)


class _SettingsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return settings.allows(record.levelno)


def configure_logging(log_settings: LogSettings) -> None:
    """Install the formatter and filter on the `pystub` logger tree."""
    for field_name, value in asdict(log_settings).items():
        setattr(settings, field_name, value)
    handler: logging.Handler
    if log_settings.log_file:
        handler = logging.FileHandler(os.path.abspath(log_settings.log_file))
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_SettingsFormatter())
    handler.addFilter(_SettingsFilter())
    logger = logging.getLogger("pystub")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
