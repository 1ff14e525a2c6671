"""Chaos under load: while tools/soak.py's mixed traffic runs, kill -9 three stubs,
SIGSTOP one until the supervisor kills it, fill /dev/shm (which, since arenas are anonymous
memfds, must fail nothing), truncate a client's registered shm region under the server
(its requests fail with INVALID_ARGUMENT, the backend lives), open 50 streams that never
read and leave (every request cancelled), SIGKILL clients mid-stream (every request cancelled),
unload and reload a model, load a broken model.py over a serving one, and close clients abruptly
all along
(tools/soak_chaos.py).

Every request is accounted for (sent == ok + errors), every error names a cause a fault explains
(stub died, BLS target not ready, shm full, model unloaded, sequence evicted, client closed: no
timeout, wrong answer or unexplained error), and afterwards one request of every kind succeeds,
every stub is healthy, no /dev/shm entry belongs to a dead stub, arenas hold nothing and memory
and fds are within the soak's tolerances. The backend runs in a private mount namespace whose
/dev/shm is a small tmpfs (tools/soak.py TMPFS_WRAPPER), as tests/integration/test_arena_limits.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness import ROOT, Backend

sys.path.insert(0, str(ROOT / "tools"))
import soak  # noqa: E402
from soak_chaos import ChaosOptions  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_faults_under_load_lose_nothing_and_the_server_recovers(tmp_path: Path) -> None:
    if not soak.tmpfs_wrapper_works():
        pytest.skip("cannot mount a private tmpfs on /dev/shm (needs unshare and CAP_SYS_ADMIN)")
    options = ChaosOptions()
    flags = soak.backend_flags(chaos=True, heartbeat=options.heartbeat_timeout)
    with Backend(soak.make_repository(tmp_path), *flags, wrapper=soak.TMPFS_WRAPPER) as backend:
        report = soak.run(backend, soak.Options(seconds=20, warmup=4, chaos=True, chaos_options=options))
        log = backend.log()
    print("\n" + soak.format_report(report))
    assert not report["failures"], "\n".join(report["failures"])
    totals = report["totals"]
    assert totals["sent"] == totals["ok"] + totals["errors"] and totals["lost"] == 0, totals
    faults = [fault["fault"] for fault in report["faults"]]
    expected = ["kill -9"] * options.kills + ["SIGSTOP", "fill shm", "shrink shm", "unread", "vanish", "reload",
                                              "bad reload"]
    assert faults == expected, report["faults"]
    assert not any(fault["detail"].startswith(("could not", "skipped")) for fault in report["faults"])
    causes = totals["by_cause"]
    # Arenas are anonymous memfds: filling /dev/shm no longer makes any request fail.
    assert causes.get("shm full", 0) == 0, causes
    assert causes.get("model unloaded", 0) > 0, causes  # the reload failed the model's requests meanwhile
    assert causes.get("client closed", 0) > 0, causes
    assert log.count("restarted (restart") >= options.kills + 2, "every killed or frozen stub came back"
    assert "no heartbeat for" in log, "the frozen stub was caught by its heartbeat"
    assert all(result == "ok" for result in report["verification"].values()), report["verification"]
