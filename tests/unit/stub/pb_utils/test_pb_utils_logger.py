"""pb_utils.Logger: glog format on stderr before the stub's sink is set, the sink after."""

from __future__ import annotations

import calendar
import os
import re
import time

import pytest

from pystub_backend.stub.pb_utils import Logger, _runtime
from pystub_backend.stub.pb_utils._logger import format_glog

GLOG = re.compile(r"^([IWE])(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) (\d+) ([^ :]+):(\d+)\] (.*)$")


@pytest.fixture(autouse=True)
def _reset_runtime():
    yield
    _runtime.set_log_sink(None)


def _line_of(marker: str) -> int:
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if marker in line and "_line_of" not in line:
                return number
    raise AssertionError(marker)


def test_glog_lines_on_stderr(capfd):
    before = time.time()
    Logger.log_info("info message")  # MARK-INFO
    Logger.log_warn("warn message")  # MARK-WARN
    Logger.log_error("error message")  # MARK-ERROR
    Logger.log_verbose("verbose message")  # MARK-VERBOSE
    Logger.log("default level")  # MARK-DEFAULT
    Logger.log("explicit", Logger.WARNING)  # MARK-EXPLICIT
    Logger.log("enum", level=Logger.LogLevel.ERROR)  # MARK-ENUM
    out, err = capfd.readouterr()
    assert out == ""
    lines = err.splitlines()
    expected = [("I", "info message", "MARK-INFO"), ("W", "warn message", "MARK-WARN"),
                ("E", "error message", "MARK-ERROR"), ("I", "verbose message", "MARK-VERBOSE"),
                ("I", "default level", "MARK-DEFAULT"), ("W", "explicit", "MARK-EXPLICIT"),
                ("E", "enum", "MARK-ENUM")]
    assert len(lines) == len(expected)
    for line, (char, message, marker) in zip(lines, expected, strict=False):
        match = GLOG.match(line)
        assert match, line
        assert match.group(1) == char
        assert int(match.group(8)) == os.getpid()
        assert match.group(9) == os.path.basename(__file__)
        assert int(match.group(10)) == _line_of(marker)
        assert match.group(11) == message
    month, day, hour, minute, second = (int(g) for g in GLOG.match(lines[0]).group(2, 3, 4, 5, 6))
    stamp = calendar.timegm((time.gmtime(before).tm_year, month, day, hour, minute, second))
    assert abs(stamp - before) < 5  # UTC, like the original's gmtime_r


def test_format_glog_fields():
    now = calendar.timegm((2024, 3, 7, 9, 5, 2)) + 0.000042
    line = format_glog(int(Logger.VERBOSE), "hello world", "/models/m/1/model.py", 17, now=now)
    assert line == f"I0307 09:05:02.000042 {os.getpid()} model.py:17] hello world"
    assert format_glog(1, "x", "f.py", 1, now=now).startswith("W0307 ")
    assert format_glog(2, "x", "f.py", 1, now=now).startswith("E0307 ")


def test_sink_receives_level_message_and_caller_location(capfd):
    records = []
    _runtime.set_log_sink(lambda level, message, filename, lineno: records.append((level, message, filename, lineno)))
    Logger.log_warn("to the server")  # MARK-SINK-WARN
    Logger.log("verbose", Logger.VERBOSE)  # MARK-SINK-VERBOSE
    assert records == [
        (1, "to the server", __file__, _line_of("MARK-SINK-WARN")),
        (3, "verbose", __file__, _line_of("MARK-SINK-VERBOSE")),
    ]
    assert all(type(level) is int for level, *_ in records)
    assert capfd.readouterr().err == ""  # exactly once: not also on stderr


def test_broken_sink_falls_back_to_stderr(capfd):
    def broken(*args):
        raise OSError("channel down")

    _runtime.set_log_sink(broken)
    Logger.log_error("still logged")
    err = capfd.readouterr().err
    assert GLOG.match(err.strip()).group(11) == "still logged"


def test_bad_arguments():
    with pytest.raises(TypeError):
        Logger.log_info(None)
    with pytest.raises(TypeError):
        Logger.log("x", 9)
    with pytest.raises(TypeError):
        Logger.log("x", "INFO")
