"""The config sections against the oracle: the same repository on real Triton 2.51 and on pystub.

Needs the Triton that tools/compare installs (`.bench/venv`, or the venv named by
PYSTUB_TRITON_VENV); skipped without it. Compared: warmup load errors, the text of a stub that
dies in `initialize`, and what a Python-based backend's model receives. Normalized away: the
traceback tail (`At: <path>(<line>): ...`) of an exception's text, whose paths differ (each server
has its own copy of the repository).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_load_behaviours
import test_python_backends
import test_warmup
from harness import ROOT, Backend

VENV = Path(os.environ.get("PYSTUB_TRITON_VENV", ROOT / ".bench" / "venv"))
_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
DIST = VENV / "lib" / f"python{_PY}" / "site-packages" / "pytriton" / "tritonserver"
STUB = DIST / "python_backend_stubs" / _PY / "triton_python_backend_stub"

pytestmark = pytest.mark.skipif(not (DIST / "bin" / "tritonserver").exists() or not STUB.exists(),
                                reason=f"Triton 2.51 is not installed in {VENV} (tools/bench_compare.py installs it)")


def _backend_directory(tmp_path: Path) -> Path:
    """Triton's python backend plus the test's Python-based backend. The library is copied: Triton
    refuses a Python-based backend whose library resolves outside the backend directory."""
    backends = tmp_path / "backends"
    (backends / "python").mkdir(parents=True)
    shutil.copy(DIST / "backends" / "python" / "libtriton_python.so", backends / "python")
    shutil.copy(DIST / "backends" / "python" / "triton_python_backend_utils.py", backends / "python")
    (backends / "python" / "triton_python_backend_stub").symlink_to(STUB)  # finds its libraries next to it
    (backends / "scaler").mkdir()
    (backends / "scaler" / "model.py").write_text(test_python_backends.BACKEND_MODEL)
    (backends / "scaler" / "helper.py").write_text("SCALE = 3\n")
    return backends


# Samples that fail after reaching the model's execute: Triton 2.51 crashes (SIGSEGV) right after
# logging "failed to run warmup sample", most times, before it reports the load. Their texts in
# test_warmup.FAILURES were read from Triton's log on the runs where it did not crash.
_CRASHES_TRITON = ("raises", "error_response")


def _repositories(tmp_path: Path) -> tuple[Path, Path]:
    """The load failures, and the Python-based backend's model (apart: Triton 2.51 crashed with
    SIGSEGV warming up a python model after a Python-based backend had loaded in the same server)."""
    repository = tmp_path / "models"
    for name, (config, mode, files, _) in test_warmup.FAILURES.items():
        if name in _CRASHES_TRITON:
            continue
        test_warmup.write_model(repository, name, config, mode)
        for file_name, data in files.items():
            (repository / name / "warmup").mkdir(exist_ok=True)
            (repository / name / "warmup" / file_name).write_bytes(data)
    test_load_behaviours._model(repository, "exits", "", test_load_behaviours.PLAIN.format(initialize="os._exit(3)"))
    test_python_backends._model(tmp_path / "based", "scaled", "scaler", own_model=False)
    return repository, tmp_path / "based"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _triton_environment() -> dict[str, str]:
    python = VENV / "bin" / "python"
    libdir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    env = dict(os.environ, PATH=f"{VENV / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               LD_LIBRARY_PATH=":".join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p))
    env.pop("PYTHONPATH", None)
    return env


_LOAD_LINE = re.compile(r'\] "(?:failed to load \'(\w+)\' version 1: (?:Internal|Invalid argument): (.*)'
                        r'|successfully loaded \'(\w+)\')"$', re.MULTILINE)


def _load_results(log: Path) -> dict[str, str]:
    """Model -> load error as Triton's log has it ("" when it loaded). The log quotes messages
    JSON-style (a newline is `\\n`)."""
    results = {}
    for match in _LOAD_LINE.finditer(log.read_text(errors="replace")):
        if match.group(3):
            results[match.group(3)] = ""
        else:
            results[match.group(1)] = json.loads(f'"{match.group(2)}"')
    return results


def _triton_loads(repository: Path, backends: Path, log: Path, names: list[str]) -> dict[str, str]:
    """Start Triton on `repository` and read how each model's load ended from its log. Triton
    2.51 (this CPU-only build) sometimes crashes with SIGSEGV while it warms several models up at
    once (less often with verbose logging), and now and then on a loaded machine with one at a
    time, so it loads them one at a time and a crashed attempt is followed by one that loads only
    the models whose load had not ended yet: while attempts end some model's load, and at most
    three that end none."""
    results: dict[str, str] = {}
    barren, attempt = 0, 0
    while barren < 3:
        attempt += 1
        remaining = [name for name in names if name not in results]
        command, prefix = _triton_command(repository, backends, remaining)
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=_triton_environment(), start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not set(remaining) <= set(_load_results(log)) and process.poll() is None:
                assert time.monotonic() < deadline, f"Triton did not load {remaining} within 60 s:\n" \
                                                    f"{log.read_text(errors='replace')[-3000:]}"
                time.sleep(0.2)
        finally:
            _stop(process, prefix)
        ended = {name: text for name, text in _load_results(log).items() if name in remaining}
        results.update(ended)
        if set(names) <= set(results):
            return results
        barren = 0 if ended else barren + 1
        print(f"Triton exited with {process.returncode} before loading every model (attempt {attempt}); "
              f"left: {[name for name in names if name not in results]}")
    raise AssertionError(f"Triton crashed three times in a row without ending a model's load:\n"
                         f"{log.read_text(errors='replace')[-3000:]}")


def _triton_command(repository: Path, backends: Path, only: list[str] | None = None) -> tuple[list[str], str]:
    """The command line; `only`: load just these models (explicit model control)."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    prefix = f"cfgsec_triton_{os.getpid()}_{http}_"
    return [str(DIST / "bin" / "tritonserver"), f"--model-repository={repository}",
            f"--backend-directory={backends}", f"--http-port={http}", f"--grpc-port={grpc}",
            f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1", "--exit-on-error=false", "--strict-readiness=false",
            f"--backend-config=python,shm-region-prefix-name={prefix}",
            # One model loads (and warms up) at a time: the crashes came with several warmups at once
            "--model-load-thread-count=1", "--log-verbose=1",
            *(["--model-control-mode=explicit", *(f"--load-model={name}" for name in only)] if only else [])], prefix


def _stop(process: subprocess.Popen, prefix: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stubs a crashed server left behind
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
    for entry in Path("/dev/shm").glob(f"{prefix}*"):
        entry.unlink()


@contextlib.contextmanager
def _triton(repository: Path, backends: Path, log: Path) -> Iterator[int]:
    """A running Triton on `repository`; yields its HTTP port."""
    command, prefix = _triton_command(repository, backends)
    port = next(int(arg.split("=")[1]) for arg in command if arg.startswith("--http-port="))
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=_triton_environment(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _live(port):
            assert process.poll() is None and time.monotonic() < deadline, \
                f"Triton did not start within 120 s:\n{log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.2)
        yield port
    finally:
        _stop(process, prefix)


def _live(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _index(port: int) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return {row["name"]: row for row in json.load(response)}


def _scaled_facts(port: int) -> dict:
    """Infer on the Python-based backend's model over HTTP/JSON: its output and what it was given."""
    body = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/scaled/infer", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        outputs = {output["name"]: output["data"] for output in json.load(response)["outputs"]}
    facts = json.loads(outputs["FACTS"][0])
    return {"y": outputs["Y"], "args": facts["args"], "runtime": facts["config"]["runtime"], "file": facts["file"]}


def _normalized(reason: str) -> str:
    return re.sub(r"\n\nAt:\n.*?\n(?=; )", "", reason, flags=re.DOTALL)


@pytest.mark.timeout(300)
def test_load_errors_and_python_based_backends_match_triton(tmp_path: Path):
    backends = _backend_directory(tmp_path)
    repository, based = _repositories(tmp_path)
    names = [name for name in test_warmup.FAILURES if name not in _CRASHES_TRITON] + ["exits"]
    triton = _triton_loads(repository, backends, tmp_path / "triton.log", names)
    with _triton(based, backends, tmp_path / "triton_based.log") as port:
        triton_facts = _scaled_facts(port)
    with Backend(repository, "--exit-on-error=false", f"--backend-directory={backends}",
                 f"--model-repository={based}") as backend:
        pystub = _index(backend.ports["http"])
        pystub_facts = _scaled_facts(backend.ports["http"])
    for name in names:
        assert triton[name] and pystub[name]["state"] == "UNAVAILABLE", name
        assert _normalized(triton[name]) == _normalized(pystub[name]["reason"]), name
    # A Python-based backend's model: same output, same args (but the instance name), same runtime.
    assert triton_facts["y"] == pystub_facts["y"] == [3.0, 6.0]
    for facts in (triton_facts, pystub_facts):
        facts["args"].pop("model_instance_name")
    assert triton_facts["args"] == pystub_facts["args"]
    assert triton_facts["runtime"] == pystub_facts["runtime"] == "model.py"
    assert triton_facts["file"] == pystub_facts["file"] == str(backends / "scaler" / "model.py")
