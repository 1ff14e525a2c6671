"""The soak's traffic: request kinds, the client workers that send them, and the ledger that
accounts for every request (tools/soak.py).

Every request a worker sends is entered in the `Ledger` before it goes out and gets exactly one
outcome when it ends: "ok" (the answer was checked against what was sent), or an error whose
message is classified by cause (`classify`). A worker that never got an outcome shows up as
sent > ok + errors, which the soak reports as lost requests.

    kind          protocol            model            what is checked
    http_json     HTTP, JSON          add_sub          OUTPUT0/1 = a+b, a-b
    http_binary   HTTP, binary        identity_fp32    echo of 16 B .. 256 KiB
    http_bytes    HTTP, binary        string_identity  echo of BYTES elements (not UTF-8 too)
    grpc          gRPC                identity_fp32    echo of 16 B .. 1 MiB
    grpc_stream   gRPC stream         repeat           n decoupled responses 0..n-1, then final
    batched       gRPC                batch_identity   echo (dynamic batching: concurrent workers)
    sequence      gRPC                accumulate       running sums of a 2..5 step sequence
    bls           gRPC                soak_bls         OUT = IN + 1, computed by soak_leaf via BLS
    hostile_json  HTTP, raw           (several)        JSON nested 200..100,000 deep is a 400 parse error
"""

from __future__ import annotations

import itertools
import queue
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

__all__ = ["KINDS", "REQUESTS", "Ledger", "Worker", "Clients", "classify", "CAUSES", "EXPECTED_UNDER_FAULTS",
           "WrongAnswer", "TIMEOUT_S"]

TIMEOUT_S = 30.0  # per request: more than any fault should delay an answer; a timeout is a hang

# Error causes, in match order. "client closed" is what the chaos's abrupt clients record.
CAUSES: list[tuple[str, re.Pattern[str]]] = [(name, re.compile(pattern)) for name, pattern in [
    # a killed stub fails its in-flight requests, and the sequences it held are lost with it
    ("stub died", r"Stub process '[^']+' is not healthy|was lost: the stub process that held its"),
    ("BLS target not ready", r"Failed for execute the inference request\. Model '[^']+' is not ready"),
    ("shm full", r"Failed to increase the shared memory pool size"),
    ("model unloaded", r"is unloading|was unloaded|Request for unknown model|has no available versions|"
                       r"is not at ready state"),
    ("sequence evicted", r"sequence \S+ of model '[^']+' was evicted|must specify the START flag"),
    ("client closed", r"^client closed"),
    ("timeout (hang)", r"Deadline ?Exceeded|timed out|[Tt]imeout"),
    ("wrong answer", r"^wrong answer"),
]]
# Causes a fault may legitimately produce; anything else (or "other") is a failure of the soak.
EXPECTED_UNDER_FAULTS = {"stub died", "BLS target not ready", "shm full", "model unloaded", "sequence evicted",
                         "client closed"}


def classify(message: str) -> str:
    """The cause an error message names, or "other"."""
    for name, pattern in CAUSES:
        if pattern.search(message):
            return name
    return "other"


class WrongAnswer(AssertionError):
    def __init__(self, what: str) -> None:
        super().__init__(f"wrong answer: {what}")


@dataclass
class Ledger:
    """Requests sent and their outcomes, per kind; latencies of the successful ones."""

    sent: dict[str, int] = field(default_factory=dict)
    ok: dict[str, int] = field(default_factory=dict)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> cause -> count
    samples: dict[str, list[str]] = field(default_factory=dict)  # cause -> a few messages
    latencies: dict[str, list[float]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)  # the failures' times count from here
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self.sent[kind] = self.sent.get(kind, 0) + count

    def success(self, kind: str, seconds: float, count: int = 1) -> None:
        with self._lock:
            self.ok[kind] = self.ok.get(kind, 0) + count
            self.latencies.setdefault(kind, []).extend([seconds / count] * count)

    def failure(self, kind: str, message: str, count: int = 1) -> None:
        cause = classify(message)
        with self._lock:
            by_cause = self.errors.setdefault(kind, {})
            by_cause[cause] = by_cause.get(cause, 0) + count
            examples = self.samples.setdefault(cause, [])
            if len(examples) < 3:
                examples.append(f"{kind} at {time.monotonic() - self.started:.1f} s: {message[:300]}")

    def totals(self) -> dict[str, Any]:
        with self._lock:
            sent = sum(self.sent.values())
            ok = sum(self.ok.values())
            causes: dict[str, int] = {}
            for by_cause in self.errors.values():
                for cause, count in by_cause.items():
                    causes[cause] = causes.get(cause, 0) + count
            return {"sent": sent, "ok": ok, "errors": sum(causes.values()), "by_cause": causes,
                    "lost": sent - ok - sum(causes.values())}


def _message(exc: BaseException) -> str:
    text = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return text or type(exc).__name__


# -- the request kinds -----------------------------------------------------------------------------
class Clients:
    """One worker's clients (tritonclient HTTP and gRPC); reopened after a fault closed them."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.http_url, self.grpc_url = http_url, grpc_url
        self.http = httpclient.InferenceServerClient(http_url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S)
        self.grpc = grpcclient.InferenceServerClient(grpc_url)

    def close(self) -> None:
        self.http.close()
        self.grpc.close()


def _floats(rng: random.Random, sizes: tuple[int, ...]) -> np.ndarray:
    count = rng.choice(sizes) // 4
    return (np.arange(count, dtype=np.float32) + rng.randrange(1000)).reshape(1, count)


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise WrongAnswer(what)


def _mismatch(got: np.ndarray | None, expected: np.ndarray) -> str:
    """How `got` differs from `expected` (a wrong answer's report must say what came back)."""
    if got is None:
        return "no such output in the response"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"{got.dtype}{list(got.shape)} where {expected.dtype}{list(expected.shape)} was sent"
    wrong = np.flatnonzero(got.ravel() != expected.ravel())
    first = int(wrong[0])
    return (f"{wrong.size} of {expected.size} values differ, the first at {first}: "
            f"{got.ravel()[first]!r} for {expected.ravel()[first]!r}; got starts {got.ravel()[:4].tolist()}, "
            f"sent {expected.ravel()[:4].tolist()}")


def _check_equal(got: np.ndarray | None, expected: np.ndarray, what: str) -> None:
    if got is None or not np.array_equal(got, expected):
        raise WrongAnswer(f"{what}: {_mismatch(got, expected)}")


def http_json(clients: Clients, rng: random.Random) -> int:
    a, b = (np.array([rng.uniform(-9, 9) for _ in range(4)], np.float32) for _ in range(2))
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=False)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
    result = clients.http.infer("add_sub", inputs, outputs=outputs, timeout=int(TIMEOUT_S))
    _check(np.allclose(result.as_numpy("OUTPUT0"), a + b) and np.allclose(result.as_numpy("OUTPUT1"), a - b), "add_sub")
    return 1


def http_binary(clients: Clients, rng: random.Random) -> int:
    data = _floats(rng, (16, 4096, 65536, 262144))
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = clients.http.infer("identity_fp32", [tensor], timeout=int(TIMEOUT_S))
    _check_equal(result.as_numpy("OUTPUT0"), data, "identity_fp32 over HTTP")
    return 1


def http_bytes(clients: Clients, rng: random.Random) -> int:
    items = np.array([bytes(rng.randrange(256) for _ in range(rng.randrange(12))) for _ in range(rng.randrange(1, 6))],
                     dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [len(items)], "BYTES")
    tensor.set_data_from_numpy(items)
    result = clients.http.infer("string_identity", [tensor], timeout=int(TIMEOUT_S))
    _check(result.as_numpy("OUTPUT0").tolist() == items.tolist(), "string_identity")
    return 1


def grpc_unary(clients: Clients, rng: random.Random, model: str = "identity_fp32",
               sizes: tuple[int, ...] = (16, 4096, 65536, 1 << 20)) -> int:
    data = _floats(rng, sizes)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = clients.grpc.infer(model, [tensor], client_timeout=TIMEOUT_S)
    _check_equal(result.as_numpy("OUTPUT0"), data, f"{model} over gRPC")
    return 1


def batched(clients: Clients, rng: random.Random) -> int:
    return grpc_unary(clients, rng, "batch_identity", (16, 256, 4096))


def big_metadata(clients: Clients, rng: random.Random) -> int:
    """Metadata over the 128 KiB control frame: a 140 KB id or 200 KB of parameters,
    through the dynamic batcher among ordinary requests; it travels spilled into the arena and must
    neither fail nor fail the requests batched with it."""
    data = _floats(rng, (16, 256))
    use_http = rng.random() < 0.5
    module: Any = httpclient if use_http else grpcclient
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    big_id = rng.random() < 0.5
    request_id = f"{rng.randrange(1 << 30)}-" + "i" * 140_000 if big_id else "big-parameters"
    parameters = None if big_id else {"note": "p" * 200_000}
    if use_http:
        result = clients.http.infer("batch_identity", [tensor], request_id=request_id, parameters=parameters,
                                    timeout=int(TIMEOUT_S))
        answered_id = result.get_response()["id"]
    else:
        result = clients.grpc.infer("batch_identity", [tensor], request_id=request_id, parameters=parameters,
                                    client_timeout=TIMEOUT_S)
        answered_id = result.get_response().id
    _check(np.array_equal(result.as_numpy("OUTPUT0"), data) and answered_id == request_id,
           "batch_identity with oversize metadata")
    return 1


def grpc_stream(clients: Clients, rng: random.Random) -> int:
    count = rng.randrange(1, 6)
    answers: queue.Queue[Any] = queue.Queue()
    clients.grpc.start_stream(lambda result, error: answers.put(error if error is not None else result))
    try:
        inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_MS", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([count], np.int32))
        inputs[1].set_data_from_numpy(np.array([rng.choice((0, 0, 2))], np.int32))
        clients.grpc.async_stream_infer("repeat", inputs, enable_empty_final_response=True)
        values = []
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                answer = answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"timed out after {TIMEOUT_S:g} s waiting for the stream's final response") from None
            if isinstance(answer, Exception):
                raise answer
            response = answer.get_response()
            if response.outputs:
                values.append(int(answer.as_numpy("OUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
        _check(values == list(range(count)), f"repeat streamed {values}, expected 0..{count - 1}")
    finally:
        clients.grpc.stop_stream(cancel_requests=True)
    return 1


_SEQUENCE_IDS = itertools.count(1)  # sequences are sent by Worker._sequence, step by step


def bls(clients: Clients, rng: random.Random) -> int:
    data = _floats(rng, (16, 4096, 65536))
    tensor = grpcclient.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = clients.grpc.infer("soak_bls", [tensor], client_timeout=TIMEOUT_S)
    _check_equal(result.as_numpy("OUT"), data + 1, "soak_bls (BLS to soak_leaf)")
    return 1


_JSON_PATHS = ("/v2/models/identity_fp32/infer", "/v2/models/identity_fp32/generate", "/v2/repository/index",
               "/v2/logging")


def hostile_json(clients: Clients, rng: random.Random) -> int:
    """JSON nested deeper than the parser allows is a 400 naming the parse failure (it was
    a 500 and a logged traceback), whatever else the server is doing."""
    path, depth = rng.choice(_JSON_PATHS), rng.choice((200, 5_000, 100_000))
    body = b"[" * depth + (b"]" * depth if rng.random() < 0.5 else b"")
    request = urllib.request.Request(f"http://{clients.http_url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    _check(status == 400 and b"failed to parse the request JSON buffer" in text,
           f"{depth}-deep JSON to {path}: {status} {text[:120]!r}")
    return 1


# One request per call; "sequence" (several requests) is Worker._sequence.
REQUESTS: dict[str, Callable[[Clients, random.Random], int]] = {
    "http_json": http_json, "http_binary": http_binary, "http_bytes": http_bytes, "grpc": grpc_unary,
    "grpc_stream": grpc_stream, "batched": batched, "bls": bls, "big_metadata": big_metadata,
    "hostile_json": hostile_json,
}
# kind -> weight in the mix
KINDS: dict[str, int] = {"http_json": 2, "http_binary": 2, "http_bytes": 1, "grpc": 3, "grpc_stream": 2,
                         "batched": 3, "sequence": 1, "bls": 2, "big_metadata": 1, "hostile_json": 1}


class Worker(threading.Thread):
    """Sends requests of random kinds until stopped, entering each in the ledger."""

    def __init__(self, index: int, http_url: str, grpc_url: str, ledger: Ledger, stop: threading.Event,
                 kinds: dict[str, int] | None = None) -> None:
        super().__init__(name=f"soak-worker-{index}", daemon=True)
        self.rng = random.Random(index)
        self.urls = (http_url, grpc_url)
        self.ledger = ledger
        self.stop_event = stop
        self.kinds = kinds or KINDS

    def run(self) -> None:
        names = list(self.kinds)
        weights = [self.kinds[name] for name in names]
        clients = Clients(*self.urls)
        try:
            while not self.stop_event.is_set():
                kind = self.rng.choices(names, weights)[0]
                clients = self.one(kind, clients)
        finally:
            clients.close()

    def one(self, kind: str, clients: Clients) -> Clients:
        if kind == "sequence":
            return self._sequence(clients)
        function = REQUESTS[kind]
        self.ledger.send(kind)
        started = time.monotonic()
        try:
            function(clients, self.rng)
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded
            self.ledger.failure(kind, _message(exc))
            return self._fresh(clients)
        self.ledger.success(kind, time.monotonic() - started)
        return clients

    def _sequence(self, clients: Clients) -> Clients:
        """Steps are entered one by one, so a step that fails accounts for itself and the sequence
        ends there (its later steps are never sent)."""
        correlation = 10_000_000 + next(_SEQUENCE_IDS)
        steps = self.rng.randrange(2, 6)
        total = 0
        for step in range(steps):
            value = self.rng.randrange(100)
            total += value
            self.ledger.send("sequence")
            started = time.monotonic()
            try:
                tensor = grpcclient.InferInput("VALUE", [1, 1], "INT64")
                tensor.set_data_from_numpy(np.array([[value]], np.int64))
                result = clients.grpc.infer("accumulate", [tensor], sequence_id=correlation,
                                            sequence_start=step == 0, sequence_end=step == steps - 1,
                                            client_timeout=TIMEOUT_S)
                _check(int(result.as_numpy("SUM")[0][0]) == total, f"sequence {correlation} step {step}")
            except Exception as exc:  # noqa: BLE001 - every outcome is recorded
                self.ledger.failure("sequence", _message(exc))
                return self._fresh(clients)
            self.ledger.success("sequence", time.monotonic() - started)
        return clients

    def _fresh(self, clients: Clients) -> Clients:
        """After an error, new clients: a fault may have left the old ones' connections broken."""
        clients.close()
        return Clients(*self.urls)
