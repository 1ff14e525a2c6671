"""`Logger` (docs/reference/model-api.md#logger, #logging).

Records carry the caller's file and line. Once the stub installs a log sink they go to the server
log through it; before that (auto-complete, stub start-up) they are written to stderr in glog
format, as the original's stub does before its log channel is up:

    I1121 17:41:00.123456 4242 model.py:17] message
    ^ level (VERBOSE prints as I), UTC month/day and time, pid, basename:line
"""

from __future__ import annotations

import enum
import os
import sys
import time

from . import _runtime
from ._binding import MODULE, STR, Arg, binding, enum_of
from ._errors import require_str

__all__ = ["Logger", "LogLevel", "format_glog"]


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_Level = LogLevel  # for annotations inside Logger, whose own `LogLevel` attribute shadows it


_LEADING_CHAR = {LogLevel.INFO: "I", LogLevel.WARNING: "W", LogLevel.ERROR: "E", LogLevel.VERBOSE: "I"}


_MESSAGE_ONLY = binding("(message: str) -> None", Arg("message", STR), method=False)


class Logger:
    """Static logging methods; raise TypeError (pybind11's text) for a message that is not a str
    or a level that is not a `Logger.LogLevel` (plain ints included, as in the original)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(f"{MODULE}.Logger: No constructor defined!")  # a pybind11 class without one

    @staticmethod
    @binding(f"(message: str, level: {MODULE}.Logger.LogLevel = <LogLevel.INFO: 0>) -> None", Arg("message", STR),
             Arg("level", enum_of(LogLevel), LogLevel.INFO), method=False)
    def log(message: str, level: _Level = LogLevel.INFO) -> None:
        _emit(message, level)

    @staticmethod
    @_MESSAGE_ONLY
    def log_info(message: str) -> None:
        _emit(message, LogLevel.INFO)

    @staticmethod
    @_MESSAGE_ONLY
    def log_warn(message: str) -> None:
        _emit(message, LogLevel.WARNING)

    @staticmethod
    @_MESSAGE_ONLY
    def log_error(message: str) -> None:
        _emit(message, LogLevel.ERROR)

    @staticmethod
    @_MESSAGE_ONLY
    def log_verbose(message: str) -> None:
        _emit(message, LogLevel.VERBOSE)


def _emit(message: object, level: int) -> None:
    text = require_str("message", message)
    log_level = LogLevel(level)
    # Three frames up: past _emit, the Logger method and its argument check, to the model code.
    caller = sys._getframe(3)
    filename, lineno = caller.f_code.co_filename, caller.f_lineno
    sink = _runtime.log_sink()
    if sink is not None:
        try:
            sink(int(log_level), text, filename, lineno)
            return
        except Exception:  # noqa: BLE001 - a broken channel must not lose the record
            pass
    _write_stderr(format_glog(log_level, text, filename, lineno))


def format_glog(level: int, message: str, filename: str, lineno: int, now: float | None = None) -> str:
    """One glog-style line (without newline) as the original's stub writes it to stderr."""
    now = time.time() if now is None else now
    seconds = int(now)
    micros = int(round((now - seconds) * 1_000_000))
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(seconds))
    leading = _LEADING_CHAR.get(LogLevel(level), "I")
    return f"{leading}{stamp}.{micros:06d} {os.getpid()} {os.path.basename(filename)}:{lineno}] {message}"


def _write_stderr(line: str) -> None:
    # One write per record so lines from several threads never interleave.
    stream = sys.stderr
    if stream is None:
        return
    stream.write(line + "\n")
    stream.flush()
