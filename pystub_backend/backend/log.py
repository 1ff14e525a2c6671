"""The backend's log: Triton's glog-style lines, with settings changeable at run time.

    I1121 17:45:00.123456 4242 core.py:77] successfully loaded 'add_sub' version 1

`LogSettings` mirrors the logging extension (PROTOCOL.md section 9); the filter consults it on
every record, so a change through `/v2/logging` takes effect at once.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pystub_backend.backend.errors import ServerError, Status

__all__ = ["LogSettings", "configure_logging", "settings", "update_settings", "LOG_FORMATS"]

LOG_FORMATS = ("default", "ISO8601")


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
    """Apply a logging-extension update (PROTOCOL.md section 9) and return every setting.

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


class _GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "I")
        seconds = int(record.created)
        micros = int((record.created - seconds) * 1_000_000)
        if settings.log_format == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
            head = f"{stamp} {letter} {record.process} {record.filename}:{record.lineno}]"
        else:
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(seconds))
            head = f"{letter}{stamp}.{micros:06d} {record.process} {record.filename}:{record.lineno}]"
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{head} {text}"


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
    handler.setFormatter(_GlogFormatter())
    handler.addFilter(_SettingsFilter())
    logger = logging.getLogger("pystub")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
