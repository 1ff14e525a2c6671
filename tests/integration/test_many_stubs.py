"""64 stubs under default OS limits, as an unprivileged user.

The design sets the bar (docs/design.md#the-channel-a-socket-pair-not-message-queues): 64 stubs start under default
limits as non-root. (Kernel message queues would not get there: about ten queues fit in the default
RLIMIT_MSGQUEUE.) The backend runs as `nobody` with the default soft file limit (1024) and message-queue limit (800
KiB); every one of its 64 stubs starts, executes at least one request, and a SIGTERM ends the whole tree with exit
status 0 and nothing left in /dev/shm.

As root the test switches user with setpriv. The project's interpreter may live under a
directory `nobody` cannot enter (pyenv under /root, mode 0700): then the backend runs in a private
mount namespace where that directory is replaced by a world-readable shim holding bind mounts of
just the entries the interpreter needs. Nothing on the host changes.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from harness import ROOT, Backend

INSTANCES = 64
NOBODY = 65534
DEFAULT_LIMITS = ["prlimit", "--nofile=1024:", "--msgqueue=819200"]  # soft nofile; mqueue bytes

RELEASE_NAME = "release"
# execute holds each request until the test creates the release file (next to the repository), so
# the scheduler must spread the requests over every instance whatever the load (a fixed sleep did
# not: on a loaded machine the first instances finished before the later requests arrived).
MODEL = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = os.path.join(args["model_repository"], "..", "..", "release")

    def execute(self, requests):
        deadline = time.monotonic() + 300
        while not os.path.exists(self.release):
            if time.monotonic() > deadline:
                raise RuntimeError("timed out after 300 s waiting for the test's release file")
            time.sleep(0.05)
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''
CONFIG = f'''
name: "many"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ count: {INSTANCES}, kind: KIND_CPU }} ]
'''


# -- running as nobody -------------------------------------------------------------------------
def _needed_paths() -> list[Path]:
    """What the unprivileged backend and its stubs must reach: interpreter, stdlib, venv, checkout."""
    return [Path(os.path.realpath(sys.executable)), Path(sys.base_prefix), Path(sys.prefix), ROOT]


def _closed_directories(paths: list[Path]) -> dict[Path, set[str]]:
    """Directories on the way to `paths` that others cannot enter, each with the entries below it
    that the paths go through."""
    closed: dict[Path, set[str]] = {}
    for path in paths:
        parts = path.parts
        for depth in range(1, len(parts)):
            directory = Path(*parts[:depth])
            if not directory.stat().st_mode & stat.S_IXOTH:
                closed.setdefault(directory, set()).add(parts[depth])
    return closed


def _nobody_wrapper(shim: Path) -> list[str]:
    """The command prefix that runs the backend as nobody under default limits, or skips."""
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", *DEFAULT_LIMITS]
    for tool in ("setpriv", "prlimit"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool}(1) is not installed; it is needed to run the backend as nobody")
    closed = _closed_directories(_needed_paths())
    if not closed:
        return drop
    if any(parent != directory and parent in directory.parents for directory in closed for parent in closed):
        pytest.skip(f"the interpreter lies below nested directories nobody cannot enter: {sorted(closed)}")
    if shutil.which("unshare") is None:
        pytest.skip(f"{sorted(closed)} cannot be entered by nobody and unshare(1) is missing to shim them")
    script = []
    for number, (directory, entries) in enumerate(sorted(closed.items())):
        layer = shim / str(number)
        layer.mkdir(mode=0o755)
        layer.chmod(0o755)
        for entry in sorted(entries):
            (layer / entry).mkdir(mode=0o755)
            script.append(f"mount --bind '{directory / entry}' '{layer / entry}'")
        script.append(f"mount --rbind '{layer}' '{directory}'")
    script.append('exec "$@"')
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(script), "sh", *drop]
    probe = subprocess.run(wrapper + [sys.executable, "-c", "import numpy, msgpack, posix_ipc"],
                           capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    if probe.returncode != 0:
        pytest.skip(f"cannot run the project's interpreter as nobody (closed directories {sorted(closed)}; "
                    f"shimming them in a private mount namespace failed): {probe.stderr.strip()[-500:]}")
    return wrapper


@pytest.fixture()
def unprivileged() -> Iterator[tuple[list[str], Path]]:
    """(command prefix, a world-readable scratch directory) for a backend that runs as non-root."""
    scratch = Path(tempfile.mkdtemp(prefix="pystub-many-"))
    scratch.chmod(0o755)
    try:
        if os.geteuid() != 0:
            yield DEFAULT_LIMITS if shutil.which("prlimit") else [], scratch  # already unprivileged
        else:
            shim = scratch / "shim"
            shim.mkdir()
            yield _nobody_wrapper(shim), scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- the test ----------------------------------------------------------------------------------
def _repository(scratch: Path) -> Path:
    model = scratch / "models" / "many"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    for directory in (scratch / "models", model, model / "1"):
        directory.chmod(0o755)
    return scratch / "models"


def _stubs(backend: Backend) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return json.loads(response.read())["stubs"]


def _soft_nofile(pid: int) -> int:
    """The soft RLIMIT_NOFILE of `pid` (/proc, since prlimit(2) on another user needs privileges)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def _infer(backend: Backend, index: int) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [index, 1]}]})
    request = urllib.request.Request(f"http://{backend.http_url}/v2/models/many/infer", data=body.encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:  # held in execute until released
        outputs = json.loads(response.read())["outputs"]
    assert outputs[0]["data"] == [index, 1]


# 64 stubs importing numpy take minutes on 2 loaded cores: the test is bounded by its own waits.
@pytest.mark.timeout(900)
def test_64_stubs_start_and_serve_as_nobody(unprivileged: tuple[list[str], Path]) -> None:
    wrapper, scratch = unprivileged
    backend = Backend(_repository(scratch), "--allow-grpc=false", "--allow-metrics=false", wrapper=wrapper)
    backend.start(timeout=300)
    try:
        # Non-root, with the default soft file limit, and all 64 stubs up.
        process = psutil.Process(backend.pid)
        assert process.uids().effective != 0 and _soft_nofile(backend.pid) <= 1024
        rows = _stubs(backend)
        assert len(rows) == INSTANCES and all(row["healthy"] for row in rows), rows
        stubs = backend.stub_processes()
        assert len(stubs) == INSTANCES and all(p.uids().effective != 0 for p in stubs)
        assert len({row["pid"] for row in rows}) == INSTANCES
        _every_instance_executes(backend, scratch / RELEASE_NAME)
        stub_pids = [p.pid for p in stubs]
    except BaseException:
        backend.stop(check=False)
        raise
    backend.stop()  # SIGTERM; checks exit status 0 and an empty /dev/shm
    assert not [pid for pid in stub_pids if psutil.pid_exists(pid)]


def _every_instance_executes(backend: Backend, release: Path) -> None:
    """Two requests per instance (each instance pipelines two), held in execute until every
    instance has one; then released, every instance has executed and nothing failed."""
    with concurrent.futures.ThreadPoolExecutor(2 * INSTANCES) as pool:
        answers = [pool.submit(_infer, backend, i) for i in range(2 * INSTANCES)]
        try:
            deadline = time.monotonic() + 300
            while idle := [row["instance"] for row in _stubs(backend) if row["in_flight"] < 1]:
                assert time.monotonic() < deadline, f"timed out after 300 s waiting for requests on {idle}"
                time.sleep(0.2)
        finally:
            release.touch()
        for answer in answers:
            answer.result()
    rows = _stubs(backend)
    assert all(row["served"] >= 1 for row in rows) and sum(row["failed"] for row in rows) == 0, rows
