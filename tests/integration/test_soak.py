"""The soak: a minute of mixed traffic against a real backend (tools/soak.py: HTTP
JSON and binary, BYTES, gRPC, gRPC streams of a decoupled model, dynamic batching, sequences,
BLS). Fails on any request without an outcome, any error, a wrong answer, or growth beyond the
tolerances tools/soak.py states: backend and stub RSS (max(24 MiB, 10 %)), /dev/shm entries
(none), arena bytes still used (none), fds (backend +8, stubs none).

`PYSTUB_SOAK_SECONDS` changes the duration (a minute keeps the suite's time; growth per request
shows within it, as each kind runs thousands of requests); the documented long run is
`tools/soak.py --seconds N`.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import pytest
from harness import ROOT, Backend

sys.path.insert(0, str(ROOT / "tools"))
import soak  # noqa: E402

SECONDS = float(os.environ.get("PYSTUB_SOAK_SECONDS", "60"))


@pytest.mark.slow
@pytest.mark.timeout(SECONDS + 180)
def test_a_minute_of_mixed_traffic_lose_and_leak_nothing(tmp_path: Path) -> None:
    faulthandler.cancel_dump_traceback_later()  # a long test by design; keep a dump for a real hang
    faulthandler.dump_traceback_later(SECONDS + 150, exit=False)
    with Backend(soak.make_repository(tmp_path)) as backend:
        report = soak.run(backend, soak.Options(seconds=SECONDS))
    print("\n" + soak.format_report(report))
    assert not report["failures"], "\n".join(report["failures"])
    totals = report["totals"]
    assert totals["sent"] == totals["ok"] and totals["sent"] > 20 * SECONDS, totals
    assert set(report["kinds"]) == set(soak.KINDS), report["kinds"].keys()
    assert all(row["ok"] > 0 for row in report["kinds"].values()), report["kinds"]
    assert report["restarts"] == 0
