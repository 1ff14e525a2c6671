"""`stubctl`'s CPU% is measured: the backend keeps each stub's process object
across calls, so a stub spinning in `execute` shows its share of a core and an idle one about 0
(before: 0.0 for every stub, a new psutil.Process per call)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient
from harness import ROOT, Backend, make_repository

from pystub_backend.backend.telemetry.process_cpu import ProcessSampler


def _stubctl_rows(backend: Backend) -> dict[str, dict[str, object]]:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "stubctl"), "--url", backend.http_url, "--json"],
                            capture_output=True, text=True, timeout=60, check=True)
    return {row["model"]: row for row in json.loads(result.stdout)}


def _spin(backend: Backend, milliseconds: int) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("SPIN_MS", [1], "INT32")
        tensor.set_data_from_numpy(np.array([milliseconds], dtype=np.int32))
        client.infer("cpu_spin", [tensor], timeout=60)
    finally:
        client.close()


def test_stubctl_shows_the_cpu_a_busy_stub_uses(tmp_path: Path) -> None:
    """Compared with psutil measuring the same stub over the same interval (the machine's load
    decides how much of a core the spinning stub gets, so no absolute share is asserted)."""
    with Backend(make_repository(tmp_path, "cpu_spin", "slow")) as backend:
        first = _stubctl_rows(backend)  # the backend's first look at each stub
        oracle = psutil.Process(int(str(first["cpu_spin"]["pid"])))
        spinner = threading.Thread(target=_spin, args=(backend, 5000))
        spinner.start()
        try:
            time.sleep(0.5)
            _stubctl_rows(backend)
            oracle.cpu_percent(interval=None)
            time.sleep(2.5)  # the stub spins through this whole interval
            busy = _stubctl_rows(backend)
            expected = oracle.cpu_percent(interval=None)
        finally:
            spinner.join(60)
        time.sleep(1.0)
        _stubctl_rows(backend)
        time.sleep(1.0)
        idle = _stubctl_rows(backend)
    shown = float(str(busy["cpu_spin"]["cpu_percent"]))
    assert expected > 1.0, expected  # the stub did run
    assert abs(shown - expected) <= max(0.35 * expected, 2.0), (shown, expected)
    assert shown > 3 * float(str(busy["slow"]["cpu_percent"])), busy  # the idle stub beside it
    assert float(str(idle["cpu_spin"]["cpu_percent"])) < shown / 3, idle  # and the same stub once idle


def test_the_sampler_measures_real_processes_between_samples() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rest = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sampler, oracle = ProcessSampler(), psutil.Process(spin.pid)
        for process in (spin, rest):
            assert sampler.sample(process.pid) is not None
        oracle.cpu_percent(interval=None)
        time.sleep(1.5)
        busy, idle = sampler.sample(spin.pid), sampler.sample(rest.pid)
        expected = oracle.cpu_percent(interval=None)
        assert busy is not None and idle is not None
        assert abs(busy.cpu_percent - expected) <= max(0.25 * expected, 1.0), (busy, expected)
        assert busy.cpu_percent > 1.0 and busy.cpu_percent > 5 * idle.cpu_percent, (busy, idle)
        assert busy.rss_bytes > 0
        spin.kill()
        spin.wait(10)
        assert sampler.sample(spin.pid) is None  # gone: no row, no stale object
    finally:
        for process in (spin, rest):
            process.kill()
            process.wait(10)
