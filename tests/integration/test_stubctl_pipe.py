"""`stubctl` whose reader stops reading ends quietly: no "cannot reach the backend ... Broken pipe",
no traceback, exit status 141 (128 + SIGPIPE, as a shell reports a writer killed by a closed pipe).
Both ways a reader goes away: before stubctl writes (a pipe whose read end is already closed), and
while it writes (`stubctl --watch | head -1`), against a real backend."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import EXAMPLES, ROOT, Backend

STUBCTL = [sys.executable, str(ROOT / "tools" / "stubctl")]
CLOSED_PIPE_STATUS = 141


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    with Backend(EXAMPLES) as running:
        yield running


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "table"])
def test_a_reader_gone_before_the_output_ends_stubctl_quietly(backend: Backend, flags: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader from the start: stubctl's first write fails with EPIPE
    try:
        result = subprocess.run([*STUBCTL, "--url", backend.http_url, *flags], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == CLOSED_PIPE_STATUS


@pytest.mark.skipif(shutil.which("head") is None, reason="needs head(1)")
def test_watch_into_head_ends_quietly_when_head_exits(backend: Backend, tmp_path: Path) -> None:
    """`--watch` prints until its reader leaves; head leaves after one line."""
    with open(tmp_path / "stderr", "w+") as stderr:
        watch = subprocess.Popen([*STUBCTL, "--url", backend.http_url, "--watch", "0.05"], stdout=subprocess.PIPE,
                                 stderr=stderr, text=True)
        try:
            assert watch.stdout is not None
            head = subprocess.run(["head", "-1"], stdin=watch.stdout, capture_output=True, text=True, timeout=60)
            watch.stdout.close()  # head was the only other reader
            status = watch.wait(timeout=60)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait(timeout=10)
        stderr.seek(0)
        assert stderr.read() == ""
    assert head.stdout.startswith("MODEL"), head.stdout
    assert status == CLOSED_PIPE_STATUS
