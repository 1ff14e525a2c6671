"""Faults injected while the soak's load runs (tools/soak.py --chaos).

The schedule runs one fault after another (so every error can be traced to the fault that was
active), with the load running throughout and abrupt clients closing connections all along:

    kill -9       SIGKILL a random stub, three times (different models when possible); its
                  in-flight requests fail with `Stub process '<instance>' is not healthy.`, the
                  supervisor restarts it
    SIGSTOP       freeze a stub for twice the heartbeat timeout; the supervisor sees no heartbeat,
                  kills and restarts it (SIGCONT afterwards is a no-op on the dead process)
    fill shm      fill the backend's /dev/shm (a private tmpfs: see tools/soak.py) but for a few
                  MiB, while large requests make arenas grow: those fail with `Failed to increase
                  the shared memory pool size`; then free it
    shrink shm    a client registers a system shm region, serves requests from it, then truncates
                  it: requests naming it fail with INVALID_ARGUMENT, the backend lives (a server
                  that mapped the region would die of SIGBUS); grown back, it serves again
    unread        50 gRPC streams ask `flood` for 16 KiB responses without end and never read, for
                  3 s, then leave: the RSS growth of the backend and stubs, and how many requests
                  the model saw cancelled (all of them, within seconds)
    vanish        a client process with five requests on one gRPC stream, and one with five SSE
                  streams, is SIGKILLed mid-stream: the model must see all ten cancelled
    reload        unload a model and load it again (explicit model control): its queued and
                  in-flight requests fail with "is unloading"/"was unloaded", and requests meanwhile
                  with "Request for unknown model ... has no available versions"
    bad reload    replace a model's model.py in the repository by one whose initialize raises and
                  load the model again: the load fails and the old version serves on; then SIGKILL
                  its stub: the restart runs the version's own files, not the broken one (only
                  its in-flight requests fail); the file is put back afterwards
    abrupt close  (all along) HTTP requests cut mid-body or closed before the answer, gRPC streams
                  and sequences whose channel closes mid-way, and slow clients that send their
                  request head or body a piece at a time (the server must close them at
                  SLOW_CLIENT_TIMEOUT, tools/soak.py's --http-*-timeout-secs); each is entered in the
                  ledger as sent and closed by the client (a slow client left open is a wrong answer)

Each fault is recorded with its start and end time in `events`, for the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from soak_traffic import TIMEOUT_S, Ledger, WrongAnswer
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stream_clients import GrpcStream, Memory, client_process, flood_request, notes, wait_until  # noqa: E402

__all__ = ["Chaos", "ChaosOptions"]

MIB = 1 << 20
SLOW_CLIENT_TIMEOUT = 2.0  # the backend's header and body read timeouts under chaos (tools/soak.py)
BROKEN_MODEL = b"""
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("a broken model.py (the chaos's bad reload)")

    def execute(self, requests):
        return []
"""


@dataclass
class ChaosOptions:
    kills: int = 3
    heartbeat_timeout: float = 2.0
    fill_seconds: float = 4.0
    pause: float = 2.5  # between faults: the server recovers, the load goes on
    reload_model: str = "add_sub"
    bad_reload_model: str = "identity_fp32"


@dataclass
class Chaos:
    """Runs the fault schedule against the backend `pid` serving on `http_url`/`grpc_url`."""

    pid: int
    http_url: str
    grpc_url: str
    ledger: Ledger
    options: ChaosOptions = field(default_factory=ChaosOptions)
    shm_dir: str = ""  # the backend's /dev/shm as seen from here; "" = /proc/<pid>/root/dev/shm
    repository: str = ""  # the backend's model repository (the bad reload edits a model.py in it)
    events: list[dict[str, Any]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    _killed: set[str] = field(default_factory=set)  # models whose stub was killed already

    # -- the schedule ---------------------------------------------------------------------------
    def start_abrupt_clients(self, stop: threading.Event) -> threading.Thread:
        """Clients that close abruptly, until `stop` is set (the caller joins the thread)."""
        closer = threading.Thread(target=self._abrupt_clients, args=(stop,), name="soak-abrupt", daemon=True)
        closer.start()
        return closer

    def run(self, stop: threading.Event) -> None:
        """The fault schedule; returns when the last fault is over and the stubs are healthy."""
        faults: list[tuple[str, Callable[[], str]]] = [("kill -9", self._kill) for _ in range(self.options.kills)]
        faults += [("SIGSTOP", self._freeze), ("fill shm", self._fill_shm), ("shrink shm", self._shrink_client_shm),
                   ("unread", self._unread_streams), ("vanish", self._vanishing_clients), ("reload", self._reload),
                   ("bad reload", self._bad_reload)]
        for name, fault in faults:
            if stop.wait(self.options.pause):
                break
            started = time.monotonic()
            try:
                detail = fault()
            except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is reported
                detail = f"could not apply: {type(exc).__name__}: {exc}"
            self.events.append({"fault": name, "detail": detail, "start": started, "end": time.monotonic()})
            self._wait_all_healthy(stop)

    # -- faults ---------------------------------------------------------------------------------
    def _stubs(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://{self.http_url}/v2/pystub/stubs", timeout=10) as response:
            return json.loads(response.read())["stubs"]

    def _wait_all_healthy(self, stop: threading.Event, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set():
            rows = self._stubs()
            if rows and all(row["healthy"] for row in rows):
                return
            time.sleep(0.1)

    def _victim(self, exclude: set[str]) -> dict[str, Any]:
        rows = [row for row in self._stubs() if row["healthy"] and row["pid"]]
        fresh = [row for row in rows if row["model"] not in exclude] or rows
        return self.rng.choice(fresh)

    def _kill(self) -> str:
        row = self._victim(self._killed)
        self._killed.add(row["model"])
        os.kill(row["pid"], signal.SIGKILL)
        return f"SIGKILL {row['instance']} (pid {row['pid']})"

    def _freeze(self) -> str:
        row = self._victim(self._killed)
        os.kill(row["pid"], signal.SIGSTOP)
        # Stopped until the supervisor kills it: on a loaded machine the hang judge discounts its own
        # scheduling delay, so the kill can come later than twice the heartbeat timeout.
        started = time.monotonic()
        deadline = started + self.options.heartbeat_timeout * 2 + 30
        while time.monotonic() < deadline and _alive(row["pid"]):
            time.sleep(0.1)
        try:
            os.kill(row["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
        return f"SIGSTOP {row['instance']} (pid {row['pid']}) for {time.monotonic() - started:.1f} s"

    def _fill_shm(self) -> str:
        directory = self.shm_dir or f"/proc/{self.pid}/root/dev/shm"
        usage = os.statvfs(directory)
        free = usage.f_bavail * usage.f_frsize
        if free > 4 << 30:
            return f"skipped: {directory} has {free // MIB} MiB free (run the backend on a small tmpfs)"
        filler = os.path.join(directory, f"soak_filler_{os.getpid()}")
        size = max(0, free - 3 * MIB)  # room for what already fits, none for an arena to grow much
        fd = os.open(filler, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            # Larger than the warm-up's requests: the arenas grew to fit those, so these must grow
            # them again, whichever stubs the kills restarted (a restarted stub's arenas start small).
            growth = threading.Thread(target=self._large_requests, args=(self.options.fill_seconds,),
                                      kwargs={"mib": 12}, daemon=True)
            growth.start()
            growth.join(self.options.fill_seconds + TIMEOUT_S)
        finally:
            os.close(fd)
            os.unlink(filler)
        return f"filled {size // MIB} MiB of {directory} for {self.options.fill_seconds:g} s"

    def _shrink_client_shm(self, rounds: int = 10) -> str:
        """Raises AssertionError (reported as the fault's detail) for any outcome but the expected."""
        directory = self.shm_dir or f"/proc/{self.pid}/root/dev/shm"
        key = f"soak_client_{os.getpid()}"
        data = np.arange(1024, dtype=np.float32).reshape(1, -1)
        fd = os.open(os.path.join(directory, key), os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            os.write(fd, data.tobytes())
            client.register_system_shared_memory("soak_shrink", "/" + key, data.nbytes)
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_shared_memory("soak_shrink", data.nbytes)
            for size, expected in ((data.nbytes, "ok"), (0, "INVALID_ARGUMENT"), (data.nbytes, "ok")):
                os.ftruncate(fd, size)
                for _ in range(rounds):
                    try:
                        answer = client.infer("identity_fp32", [tensor], client_timeout=TIMEOUT_S).as_numpy("OUTPUT0")
                        outcome = "ok" if answer is not None and answer.shape == data.shape else "wrong answer"
                    except InferenceServerException as exc:
                        outcome = "INVALID_ARGUMENT" if "INVALID_ARGUMENT" in str(exc.status()) else str(exc)
                    assert outcome == expected, f"region of {size} bytes: expected {expected}, got {outcome}"
        finally:
            with contextlib.suppress(Exception):
                client.unregister_system_shared_memory("soak_shrink")
            client.close()
            os.close(fd)
            os.unlink(os.path.join(directory, key))
        return (f"{rounds} requests each from a region of {data.nbytes} bytes, truncated to 0 (all "
                f"INVALID_ARGUMENT), grown back")

    def warm_up(self, count: int = 12) -> None:
        """Large requests before the baseline sample, so that the memory the allocator keeps after
        serving (and failing) them is in the baseline, not counted as growth."""
        self._large_requests(float("inf"), count)

    def _large_requests(self, seconds: float, count: int | None = None, mib: int = 8) -> None:
        """`mib` MiB requests (larger than the other traffic makes arenas grow to); while /dev/shm
        is full they fail with the pool-size error."""
        client = grpcclient.InferenceServerClient(self.grpc_url)
        deadline = time.monotonic() + seconds
        sent = 0
        try:
            while time.monotonic() < deadline and (count is None or sent < count):
                sent += 1
                data = np.ones((1, mib * MIB // 4), np.float32)
                tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                self.ledger.send("large")
                started = time.monotonic()
                try:
                    result = client.infer("identity_fp32", [tensor], client_timeout=TIMEOUT_S)
                    if not np.array_equal(result.as_numpy("OUTPUT0"), data):
                        raise AssertionError("wrong answer: identity_fp32 (large)")
                except Exception as exc:  # noqa: BLE001 - recorded
                    text = exc.message() if hasattr(exc, "message") else str(exc)
                    self.ledger.failure("large", text)
                    continue
                self.ledger.success("large", time.monotonic() - started)
        finally:
            client.close()

    def _unread_streams(self, streams: int = 50) -> str:
        with tempfile.TemporaryDirectory(prefix="soak-unread-") as directory:
            record, before = Path(directory), Memory.of(self.pid)
            clients = [GrpcStream(self.grpc_url, [flood_request(f"u{k}", record, 16 << 10)]) for k in range(streams)]
            try:
                wait_until(lambda: len(notes(record, "started")) == streams, 30, f"{streams} unread streams started")
                peak = before
                for _ in range(12):  # held 3 s
                    peak = peak.peak(Memory.of(self.pid))
                    time.sleep(0.25)
            finally:
                for client in clients:
                    client.leave()
            took = wait_until(lambda: len(notes(record, "cancelled") | notes(record, "refused")) == streams, 10,
                              f"the {streams} unread streams' requests to end")
            grown = peak.growth(before)
            return (f"{streams} unread streams: backend +{grown.backend:.0f} MiB, stubs +{grown.stubs:.0f} MiB; "
                    f"{len(notes(record, 'cancelled'))} cancelled within {took:.2f} s of leaving")

    def _vanishing_clients(self) -> str:
        with tempfile.TemporaryDirectory(prefix="soak-vanish-") as directory:
            record = Path(directory)
            killed = [client_process(kind, url, record, kind, 5) for kind, url in
                      (("grpc", self.grpc_url), ("sse", self.http_url))]
            try:
                wait_until(lambda: len(notes(record, "started")) == 10, 30, "the vanishing clients' requests started")
            finally:
                for process in killed:
                    process.kill()
                    process.wait(10)
                    if process.stdout is not None:
                        process.stdout.close()
            took = wait_until(lambda: len(notes(record, "cancelled")) == 10, 10,
                              "the killed clients' requests cancelled")
            return f"two clients SIGKILLed mid-stream: their 10 requests cancelled within {took:.2f} s"

    def _reload(self) -> str:
        model = self.options.reload_model
        self._post(f"/v2/repository/models/{model}/unload", {})
        time.sleep(1.0)
        self._post(f"/v2/repository/models/{model}/load", {})
        return f"unloaded '{model}' for 1 s, loaded it again"

    def _bad_reload(self) -> str:
        model = self.options.bad_reload_model
        path = os.path.join(self.repository, model, "1", "model.py")
        with open(path, "rb") as file:
            original = file.read()
        try:
            with open(path, "wb") as file:
                file.write(BROKEN_MODEL)
            try:
                self._post(f"/v2/repository/models/{model}/load", {})
                raise RuntimeError(f"loading the broken model.py of '{model}' succeeded")
            except urllib.error.HTTPError as exc:
                if exc.code != 400:
                    raise
            [row] = [row for row in self._stubs() if row["model"] == model]
            os.kill(row["pid"], signal.SIGKILL)
            deadline = time.monotonic() + TIMEOUT_S
            while not any(r["model"] == model and r["healthy"] and r["pid"] != row["pid"] for r in self._stubs()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"'{model}' did not restart within {TIMEOUT_S:g} s of its stub's SIGKILL")
                time.sleep(0.1)
        finally:
            with open(path, "wb") as file:
                file.write(original)
        return f"loading a broken model.py of '{model}' failed; its old stub killed, restarted from its own files"

    def _post(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(f"http://{self.http_url}{path}", data=json.dumps(body).encode(),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()

    # -- abrupt clients -------------------------------------------------------------------------
    def _abrupt_clients(self, stop: threading.Event) -> None:
        ways = [self._cut_http_body, self._close_before_answer, self._close_grpc_stream, self._close_sequence_stream,
                self._slow_head, self._slow_body]
        while not stop.wait(0.2):
            way = self.rng.choice(ways)
            self.ledger.send("abrupt")
            try:
                way()
            except WrongAnswer as exc:
                self.ledger.failure("abrupt", str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - the way a client goes is not the server's error
                self.ledger.failure("abrupt", f"client closed (and the attempt failed: {type(exc).__name__}: {exc})")
                continue
            self.ledger.failure("abrupt", f"client closed ({way.__name__.strip('_')})")

    def _http_socket(self) -> socket.socket:
        host, port = self.http_url.split(":")
        return socket.create_connection((host, int(port)), timeout=10)

    def _cut_http_body(self) -> None:
        body = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
        with self._http_socket() as sock:
            sock.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body) * 4).encode() + b"\r\n\r\n" + body[: len(body) // 2])

    def _slow_head(self) -> None:
        self._trickle(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")

    def _slow_body(self) -> None:
        self._trickle(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", b" ")

    def _trickle(self, start: bytes, piece: bytes) -> None:
        """Send `start`, then `piece` every 0.5 s until the server closes the connection, which it
        does at SLOW_CLIENT_TIMEOUT on its own clock: its timer starts when its event loop accepts
        the connection and fires when the loop gets to it, both late on a loaded machine (8 s
        late was seen at load 8). Open longer than any request may take to be answered
        (TIMEOUT_S, the soak's bound for a hang) is a slow client the server kept."""
        with self._http_socket() as sock:
            sock.sendall(start)
            sock.settimeout(0.5)
            deadline = time.monotonic() + SLOW_CLIENT_TIMEOUT + TIMEOUT_S
            while time.monotonic() < deadline:
                try:
                    sock.sendall(piece)
                    if sock.recv(1) == b"":
                        return
                except TimeoutError:
                    continue
                except OSError:  # reset by the server: closed too
                    return
        raise WrongAnswer(f"a slow client was still open {SLOW_CLIENT_TIMEOUT + TIMEOUT_S:g} s after connecting")

    def _close_before_answer(self) -> None:
        body = b'{"inputs":[{"name":"COUNT","shape":[1],"datatype":"INT32","data":[3]},' \
               b'{"name":"DELAY_MS","shape":[1],"datatype":"INT32","data":[50]}]}'
        with self._http_socket() as sock:
            sock.sendall(b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            sock.recv(64)  # the stream has started: leave in the middle of it

    def _close_grpc_stream(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            started = threading.Event()
            client.start_stream(lambda result, error: started.set())
            inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_MS", [1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([50], np.int32))
            inputs[1].set_data_from_numpy(np.array([20], np.int32))
            client.async_stream_infer("repeat", inputs)
            started.wait(5)
        finally:
            client.close()  # the channel goes with the stream still running

    def _close_sequence_stream(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            answered = threading.Event()
            client.start_stream(lambda result, error: answered.set())
            tensor = grpcclient.InferInput("VALUE", [1, 1], "INT64")
            tensor.set_data_from_numpy(np.array([[1]], np.int64))
            client.async_stream_infer("accumulate", [tensor], sequence_id=90_000_000 + self.rng.randrange(10**6),
                                      sequence_start=True)
            answered.wait(5)
        finally:
            client.close()  # the sequence never gets its END: the server evicts it


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
