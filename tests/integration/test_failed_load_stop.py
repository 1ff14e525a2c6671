"""A failed load stops its stub without waiting on a signal the stub ignores.

Stubs ignore SIGTERM by design (they stop on FINALIZE). A stub whose initialize passed its
deadline was never told to exit: the old ladder waited 2 s for an exit, sent SIGTERM, waited 1 s
more and only then sent SIGKILL. Now it is killed at once; a stub that reported its failure exits
by itself and is only reaped."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from harness import Backend, make_repository

_STAMP = re.compile(r"^[IWE](\d{4} \d\d:\d\d:\d\d\.\d{6}) \d+ \S+\] (.*)$", re.M)


def _times(log_text: str, pattern: str) -> list[datetime]:
    return [datetime.strptime(stamp, "%m%d %H:%M:%S.%f") for stamp, message in _STAMP.findall(log_text)
            if re.search(pattern, message)]


def test_an_initialize_past_its_deadline_is_killed_at_once(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "slow_init", "init_raises")
    config = repository / "slow_init" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "6"', 'string_value: "60"'))
    with Backend(repository, "--exit-on-error=false", "--backend-config=python,stub-init-timeout-seconds=3") as backend:
        log_text = backend.log()
    started = _times(log_text, r"^loading 'slow_init' version 1$")[0]
    failed = _times(log_text, r"^failed to load 'slow_init' version 1: .*timed out after 3 s waiting for initialize")[0]
    assert "sending SIGTERM to stub 'slow_init_0'" not in log_text
    assert "sending SIGKILL to stub 'slow_init_0'" in log_text
    took = (failed - started).total_seconds()
    # The 3 s deadline and a kill; the old ladder's wait + SIGTERM + wait made it at least 6 s.
    assert 3.0 <= took < 5.5, log_text
    # init_raises reported its error and exited by itself: reaped, never signalled.
    assert re.search(r"failed to load 'init_raises' version 1: Internal: NameError", log_text), log_text
    assert "to stub 'init_raises_0'" not in log_text
