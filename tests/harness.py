"""Test harness: a real `pystub-backend` process on ephemeral ports, and leak snapshots.

`Backend` starts the server as a subprocess (its own process group) with ports 0, learns the
bound ports from its log, and on `stop()` sends SIGTERM and checks that it exits 0 and leaves
nothing of its own in /dev/shm. `LeakSnapshot` records this test process's /dev/shm entries,
child processes, file descriptors and the temporary files of the backends it started, so a test
that leaves any behind fails. Backend logs go to one directory per test process, removed when the
session ends (`remove_backend_logs`; PYSTUB_KEEP_TEST_LOGS=1 keeps it and says where it is).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
SHM_DIR = "/dev/shm"
SHM_MARK = "pystub"

_PORT_LINE = re.compile(r"Started (HTTPService|GRPCInferenceService|Metrics Service|OpenAIService) at ([\d.]+):(\d+)")
# Processes and fds that outlive one test on purpose (module-scoped backends).
LONG_LIVED_PIDS: set[int] = set()
# Every backend this test session started: their shm entries are ours to account for, while
# entries of other processes on the machine (another test run, a developer's server) are not.
STARTED_PIDS: set[int] = set()
LONG_LIVED_FDS: set[int] = set()
# The gRPC stack the tests run over (--grpc-server), empty: the server's default.
GRPC_STACK = os.environ.get("PYSTUB_TEST_GRPC_SERVER", "")


class BackendError(AssertionError):
    pass


class Backend:
    """A `pystub-backend` subprocess. Use as a context manager or call start()/stop()."""

    def __init__(self, repository: str | Path = EXAMPLES, *args: str, env: dict[str, str] | None = None,
                 expect_exit: bool = False, wrapper: Sequence[str] = ()) -> None:
        """`wrapper` is a command prefix that must end by exec'ing the backend command appended to it
        (so `pid` stays the backend's), e.g. `unshare ... sh -c '... && exec "$@"' sh`."""
        self.repository = str(repository)
        self.args = list(args)
        self.env = env
        self.expect_exit = expect_exit
        self.wrapper = list(wrapper)
        self.process: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        # Kept open for the backend's lifetime (it is the backend's stdout); closed in stop().
        self._log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="pystub-backend-", suffix=".log", delete=False, dir=backend_log_dir())
        self.log_path = Path(self._log_file.name)

    # -- life cycle ----------------------------------------------------------------------------
    def command(self) -> list[str]:
        ports = [] if self.expect_exit else ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
        # PYSTUB_TEST_BACKEND_ARGS (e.g. "--frontend-workers=2") runs a test file's backends with more flags.
        extra = os.environ.get("PYSTUB_TEST_BACKEND_ARGS", "").split() if not self.expect_exit else []
        if not self.expect_exit and GRPC_STACK:  # PYSTUB_TEST_GRPC_SERVER=h2|aio: the gRPC stack under test
            extra.append(f"--grpc-server={GRPC_STACK}")
        return [*self.wrapper, sys.executable, "-m", "pystub_backend.backend", "--model-repository", self.repository,
                *ports, *self.args, *extra]

    def start(self, timeout: float = 90.0) -> Backend:
        env = dict(os.environ, **(self.env or {}))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=str(ROOT), env=env,
                                        start_new_session=True)
        STARTED_PIDS.add(self.process.pid)
        if not self.expect_exit:
            self._wait_for_ports(timeout)
        return self

    def _wait_for_ports(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        wanted = {"HTTPService", "GRPCInferenceService", "Metrics Service"}
        for flag, label in (("--allow-http=false", "HTTPService"), ("--allow-grpc=false", "GRPCInferenceService"),
                            ("--allow-metrics=false", "Metrics Service")):
            if flag in self.args:
                wanted.discard(label)
        if any(arg.startswith("--openai-port") for arg in self.args):
            wanted.add("OpenAIService")
        while time.monotonic() < deadline:
            found = {m.group(1): int(m.group(3)) for m in _PORT_LINE.finditer(self.log())}
            if wanted <= set(found):
                self.ports = {"http": found.get("HTTPService", 0), "grpc": found.get("GRPCInferenceService", 0),
                              "metrics": found.get("Metrics Service", 0)}
                if "OpenAIService" in found:  # only when asked for: port 0 would name no listener
                    self.ports["openai"] = found["OpenAIService"]
                return
            if self.process is not None and self.process.poll() is not None:
                raise BackendError(f"backend exited with {self.process.returncode} before listening:\n{self.log()}")
            time.sleep(0.05)
        raise BackendError(f"timed out after {timeout} s waiting for the backend's listeners:\n{self.log()}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BackendError(f"backend did not exit within {timeout} s:\n{self.log()}") from None

    def stop(self, timeout: float = 60.0, check: bool = True, sig: int = signal.SIGTERM) -> int:
        """Send `sig`, wait; with `check`, assert exit status 0 and no shm left behind."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.wait_exit(timeout)
        self.kill()  # anything left in its process group
        self._log_file.close()
        if check:
            if code != 0:
                raise BackendError(f"backend exited with {code}:\n{self.log()}")
            left = self.shm_entries()
            if left:
                raise BackendError(f"backend left shared memory behind: {left}\n{self.log()}")
        return code

    def kill(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> Backend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(check=exc[0] is None)

    # -- observation -----------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, pattern: str, timeout: float = 30.0, count: int = 1) -> re.Match:
        """The first match of `pattern` in the log, once it matches `count` times (stub output
        reaches the log asynchronously)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            matches = list(regex.finditer(self.log()))
            if len(matches) >= count:
                return matches[0]
            time.sleep(0.05)
        raise BackendError(f"timed out after {timeout} s waiting for {count} log line(s) /{pattern}/:\n"
                           f"{self.log()}")

    def shm_entries(self) -> list[str]:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SHM_MARK}_{self.pid}_")]

    def stub_processes(self) -> list[psutil.Process]:
        stubs = []
        for child in _children(self.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                if "triton_python_backend_stub" in " ".join(child.cmdline()):
                    stubs.append(child)
        return stubs

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['openai']}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"


_LOG_DIRS: list[Path] = []  # at most one: this process's backend logs
# Temporary files and directories the server names after its pid (model overrides, the frontend
# workers' sockets): `pystub_override_<pid>_...`, `pystub-frontend-<pid>-...`.
_PID_NAMED_TEMP = re.compile(r"^pystub[-_][a-z]+[-_](\d+)[-_]")


def backend_log_dir() -> Path:
    """The directory of this test process's backend logs, made on first use."""
    if not _LOG_DIRS:
        _LOG_DIRS.append(Path(tempfile.mkdtemp(prefix="pystub-test-logs-")))
    return _LOG_DIRS[0]


def remove_backend_logs() -> None:
    """Remove the backend logs of this test process (at the end of the session; a failing test has
    already shown the log in its error)."""
    while _LOG_DIRS:
        directory = _LOG_DIRS.pop()
        if os.environ.get("PYSTUB_KEEP_TEST_LOGS") == "1":
            print(f"backend logs kept in {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)


def _temp_entries(owners: set[int]) -> set[str]:
    """Entries of the temporary directory that a process in `owners` named after its pid."""
    entries = set()
    for name in os.listdir(tempfile.gettempdir()):
        match = _PID_NAMED_TEMP.match(name)
        if match and int(match.group(1)) in owners:
            entries.add(name)
    return entries


# gRPC-core starts and retires its pollers (an epoll fd and an eventfd) lazily, on its own schedule,
# whatever the test did; they are not ours. A leaked asyncio loop still shows, by its socket pair.
_GRPC_POLLER_FDS = ("anon_inode:[eventpoll]", "anon_inode:[eventfd]")


def _fd_targets() -> dict[int, str]:
    targets = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target not in _GRPC_POLLER_FDS:
            targets[int(name)] = target
    return targets


def _descendants(pid: int, pruned: set[int]) -> set[int]:
    """The pids below `pid`, leaving out those in `pruned` and everything below them."""
    found: set[int] = set()
    parents = [pid]
    while parents:
        children = [child for child in _child_pids(parents.pop()) if child not in pruned]
        found.update(children)
        parents.extend(children)
    return found


def _children(pid: int) -> list[psutil.Process]:
    children = []
    for child in _child_pids(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            children.append(psutil.Process(child))
    return children


def _child_pids(pid: int) -> list[int]:
    """`pid`'s children, from its threads' /proc children lists: psutil's children() reads every
    process of the machine, 15 ms on a quiet one and 100 ms and more on a loaded one (the leak check
    around each of thousands of tests, and tests that look at the stubs after each of hundreds of
    requests, spent much of their time there)."""
    tasks = Path(f"/proc/{pid}/task")
    if not (tasks / str(pid) / "children").exists():  # it exited, or the kernel lacks CONFIG_PROC_CHILDREN
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except psutil.NoSuchProcess:
            return []
    pids: set[int] = set()
    for listing in tasks.glob("*/children"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            pids.update(int(child) for child in listing.read_text().split())
    return sorted(pids)


@dataclass
class LeakSnapshot:
    shm: set[str] = field(default_factory=set)
    children: set[int] = field(default_factory=set)
    fds: dict[int, str] = field(default_factory=dict)
    temp: set[str] = field(default_factory=set)

    @classmethod
    def take(cls) -> LeakSnapshot:
        owners = (STARTED_PIDS | {os.getpid()}) - LONG_LIVED_PIDS
        prefixes = tuple(f"{SHM_MARK}_{pid}_" for pid in owners)
        shm = {n for n in os.listdir(SHM_DIR) if n.startswith(prefixes)}
        children = _descendants(os.getpid(), pruned=LONG_LIVED_PIDS)
        fds = {fd: t for fd, t in _fd_targets().items() if fd not in LONG_LIVED_FDS}
        return cls(shm, children, fds, _temp_entries(owners - {os.getpid()}))

    def leaks_since(self, before: LeakSnapshot) -> list[str]:
        problems = []
        if self.shm - before.shm:
            problems.append(f"/dev/shm entries left: {sorted(self.shm - before.shm)}")
        if self.temp - before.temp:
            problems.append(f"temporary files left in {tempfile.gettempdir()}: {sorted(self.temp - before.temp)}")
        if self.children - before.children:
            described = []
            for pid in sorted(self.children - before.children):
                try:
                    described.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())}")
                except psutil.NoSuchProcess:
                    continue
            if described:
                problems.append(f"child processes left: {described}")
        new_fds = {fd: t for fd, t in self.fds.items() if before.fds.get(fd) != t}
        if len(self.fds) > len(before.fds) and new_fds:
            problems.append(f"file descriptors left: {new_fds}")
        return problems


def check_no_leaks(before: LeakSnapshot, settle: float = 5.0) -> list[str]:
    """Leaks since `before`, after giving asynchronous cleanup up to `settle` seconds. A full
    garbage collection (30-200 ms, after every one of thousands of tests) runs only once something
    looks left: an unreachable client may still hold a descriptor until it is collected."""
    problems = LeakSnapshot.take().leaks_since(before)
    if not problems:
        return problems
    deadline = time.monotonic() + settle
    while True:
        gc.collect()
        problems = LeakSnapshot.take().leaks_since(before)
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.1)


TEST_MODELS = ROOT / "tests" / "models"


def make_repository(directory: Path, *names: str) -> Path:
    """A repository in `directory` holding copies of the named models from tests/models or
    examples/models (tests/models wins)."""
    import shutil

    repository = directory / "models"
    repository.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = TEST_MODELS / name if (TEST_MODELS / name).is_dir() else EXAMPLES / name
        if not source.is_dir():
            raise FileNotFoundError(f"no test or example model named '{name}'")
        shutil.copytree(source, repository / name)
    return repository


def assert_busy_port_refused(repository: Path, listener: str, port: int) -> None:
    """A backend asked for `listener`'s (http, grpc) busy `port` without --reuse-*-port exits 1."""
    others = [f"--{name}-port=0" for name in ("http", "grpc", "metrics") if name != listener]
    refused = Backend(repository, f"--{listener}-port", str(port), expect_exit=True)
    refused.args += others
    refused.start()
    try:
        assert refused.wait_exit() == 1  # without the flag a busy port is an error
        assert "failed to start a listener" in refused.log()
    finally:
        refused.stop(check=False)


@contextlib.contextmanager
def module_backend(backend: Backend) -> Iterator[Backend]:
    """Start a backend that outlives single tests (their leak checks ignore it); stop and check it
    at the end."""
    backend.start()
    fd = backend._log_file.fileno()
    LONG_LIVED_PIDS.add(backend.pid)
    LONG_LIVED_FDS.add(fd)
    try:
        yield backend
    finally:
        try:
            backend.stop()
        finally:
            LONG_LIVED_PIDS.discard(backend.pid)
            LONG_LIVED_FDS.discard(fd)
