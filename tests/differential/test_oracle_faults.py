"""The tier's handling of an oracle that cannot answer (oracle_faults.py, calls.ask_triton).

Two halves, neither needing Triton itself:

- `ask_triton` against a stand-in oracle: a real process that serves HTTP and, for its first
  `aborts` starts, answers its first request by logging Triton 2.51's fault line and aborting
  (SIGABRT), as Triton does under load. One abort: restarted and asked again, the answer counts
  (also when the call had returned the dying oracle's error as its answer);
  two in a row: OracleUnavailable; a death without the fault, or an answer that is an error: the
  case's, exactly as before.
- the plugin in pytest runs of its own (pytester, in a subprocess, serially and under xdist):
  a case whose oracle failed is a skip with the reason, counted in the summary line, retried once
  after the others; a retry that passes counts as a pass only; a failure where the oracle answered
  is never retried.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from calls import ORACLE_LOAD_FAULT, Reply, ask_triton, raw
from oracle import Endpoint, Pair
from oracle_faults import ORACLE_SKIP, OracleUnavailable, wait_until_quieter

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
_START_TIMEOUT = 60.0

_STAND_IN = r'''
import http.server, os, pathlib, resource, signal, sys
port, starts_file, aborts, fault = int(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
starts = int(starts_file.read_text()) if starts_file.exists() else 0
starts_file.write_text(str(starts + 1))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if starts < aborts:
            print(f"terminate called after throwing an instance of '{fault}'", flush=True)
            os.kill(os.getpid(), signal.SIGABRT)
        self.send_response(200 if self.path == "/ok" else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


class _StandInOracle:
    """What ask_triton needs of oracle.TritonServer (log_tail, died, restart), around a real process."""

    def __init__(self, directory: Path, aborts: int, fault: str = ORACLE_LOAD_FAULT) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log_path, self.starts = directory / "oracle.log", directory / "starts"
        self._command = [sys.executable, "-c", _STAND_IN, str(self.port), str(self.starts), str(aborts), fault]
        self.process: subprocess.Popen[bytes] | None = None
        self.restart()

    @property
    def start_count(self) -> int:
        return int(self.starts.read_text())

    def restart(self) -> None:
        self.stop()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the stand-in oracle did not listen on {self.port} within {_START_TIMEOUT} s")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")

    def died(self, within: float = 0.0) -> str | None:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(within)
        return None if self.process.poll() is None else f"exited with {self.process.returncode}:\n{self.log_tail()}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(30)


@contextlib.contextmanager
def _pair(tmp_path: Path, aborts: int, fault: str = ORACLE_LOAD_FAULT):
    oracle = _StandInOracle(tmp_path, aborts, fault)
    try:
        endpoint = Endpoint("triton", oracle.port, 0, 0)
        yield Pair(endpoint, endpoint, None, oracle), oracle  # type: ignore[arg-type]  # pystub is not asked
    finally:
        oracle.stop()


def _ask(pair: Pair, path: str = "/ok") -> Reply:
    return ask_triton(pair, raw, "GET", path)


def test_one_abort_is_retried_and_the_answer_counts(tmp_path: Path) -> None:
    with _pair(tmp_path, aborts=1) as (pair, oracle):
        assert _ask(pair).status == 200
        assert oracle.start_count == 2


def test_an_error_collected_while_the_oracle_aborted_is_not_its_answer(tmp_path: Path) -> None:
    def status_or_error(endpoint: Endpoint, method: str, path: str) -> object:
        try:  # as the stream helpers do: a failed call is an answer to compare
            return raw(endpoint, method, path).status
        except Exception as error:  # noqa: BLE001
            return f"error: {error!r}"

    with _pair(tmp_path, aborts=1) as (pair, oracle):
        assert ask_triton(pair, status_or_error, "GET", "/ok") == 200
        assert oracle.start_count == 2


def test_two_aborts_in_a_row_make_the_case_the_oracles(tmp_path: Path) -> None:
    with _pair(tmp_path, aborts=2) as (pair, oracle):
        with pytest.raises(OracleUnavailable, match="aborted on its own lock timeout .* twice in a row"):
            _ask(pair)
        assert oracle.start_count == 3  # restarted again for the next case
        assert _ask(pair).status == 200


def test_any_other_death_is_the_cases(tmp_path: Path) -> None:
    with _pair(tmp_path, aborts=1, fault="std::bad_alloc") as (pair, oracle):
        with pytest.raises(ConnectionError):
            _ask(pair)
        assert oracle.start_count == 1  # not restarted, not asked again


def test_an_answer_is_compared_even_when_it_is_an_error(tmp_path: Path) -> None:
    with _pair(tmp_path, aborts=0) as (pair, oracle):
        assert _ask(pair, "/refused").status == 400
        assert oracle.start_count == 1


def test_the_wait_for_a_quieter_machine_is_bounded() -> None:
    started = time.monotonic()
    said = wait_until_quieter(0.0, limit_s=0.3)  # the target is the number of cores: met or not
    assert time.monotonic() - started < 5.3
    assert "quieter" in said or "still loaded after the 0 s limit" in said, said
    assert "quieter, waited 0 s" in wait_until_quieter(1e9, limit_s=60)  # half of 1e9 is met at once


# -- the plugin, in pytest runs of its own ----------------------------------------------------------

_CONFTEST = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from oracle_faults import OracleFaults

def pytest_configure(config):
    config.pluginmanager.register(OracleFaults(Path(__file__).resolve().parent, wait=lambda load: "no wait"))
"""

# Each case appends its name to runs.txt; `oracle_fails` holds how many runs the oracle fails.
_CASES = """
import pytest
from pathlib import Path
from oracle_faults import OracleUnavailable

RUNS = Path(__file__).parent / "runs.txt"

def _run(name):
    with RUNS.open("a") as runs:
        runs.write(name + "\\n")
    return RUNS.read_text().split().count(name)

@pytest.fixture()
def dying_oracle():
    yield
    if _run("teardown_fault") == 1:
        raise OracleUnavailable("stand-in: died after the answers")

def test_fails_once():
    if _run("fails_once") == 1:
        raise OracleUnavailable("stand-in: lock timeout")

def test_fails_always():
    _run("fails_always")
    raise OracleUnavailable("stand-in: lock timeout, again")

def test_differs():
    _run("differs")
    assert "triton" == "pystub"

def test_passes():
    _run("passes")

def test_dies_in_teardown(dying_oracle):
    pass
"""


@pytest.fixture()
def cases(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_cases=_CASES)
    return pytester


def _runs(pytester: pytest.Pytester) -> list[str]:
    return (pytester.path / "runs.txt").read_text().split()


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["serial", "xdist"])
def test_oracle_cases_are_retried_once_and_counted_as_skips(cases: pytest.Pytester, workers: list[str]) -> None:
    result = cases.runpytest_subprocess("-rs", "-p", "no:cacheprovider", "-p", "no:randomly", *workers,
                                        timeout=120)
    result.assert_outcomes(passed=3, failed=1, skipped=1)  # fails_once and the teardown case pass on retry
    result.stdout.fnmatch_lines([f"SKIPPED *{ORACLE_SKIP}: stand-in: lock timeout, again*"])
    runs = _runs(cases)
    assert runs.count("fails_once") == runs.count("fails_always") == 2
    assert runs.count("differs") == runs.count("passes") == 1  # answered: never retried
    assert runs.count("teardown_fault") == 2
    if not workers:  # one process: the retries come after every other case
        assert runs.index("passes") < len(runs) - 3 and runs[-3:] == ["fails_once", "fails_always", "teardown_fault"]


def test_no_retry_after_exitfirst(cases: pytest.Pytester) -> None:
    result = cases.runpytest_subprocess("-x", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly", timeout=120)
    result.assert_outcomes(failed=1, skipped=2)  # differs stops the run; the oracle's cases say so, once
    runs = _runs(cases)
    assert runs.count("fails_always") == runs.count("fails_once") == 1
