"""The asyncio load generator: tritonclient's aio clients keep C requests in flight for a time window.

One generator drives every server (pystub, Triton, MLServer) so their numbers compare. Each
worker reuses its inputs (the client still serializes every call, as a real client does) and
loops until the window closes; latencies are kept for requests that *started* inside the window,
throughput counts the requests that *finished* inside it. The window stretches until it holds at
least `min_samples` completions (slow servers at 16 MiB), up to `max_seconds`.

With `shm=True` the input lives in one client system-shared-memory region shared by all workers
and each worker gets its own output region (the KServe shared-memory extension). Regions are
unregistered and unlinked on the way out, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from compare import stopping

JSON_PROTOCOLS = ("json", "http-json")


@dataclass(frozen=True)
class Point:
    """One measurement: which model, how, and how hard."""

    model: str            # "identity_fp32" or "add_sub"
    nbytes: int           # bytes of each input tensor
    concurrency: int
    protocol: str         # "grpc", "http" (binary tensors), "json" (JSON tensors) or "http-json"
                          # (MLServer's JSON tensors in the "http" row)
    shm: bool = False     # client system shared memory for inputs and outputs


@dataclass
class Sample:
    """What one window measured."""

    throughput: float     # completed inferences per second
    p50_ms: float
    p99_ms: float
    count: int            # latency samples
    errors: int = 0
    # streaming and perf_analyzer cells: CPU microseconds per response of the server's leader
    # process, of its descendants (the stubs) and of the load generator
    cpu_server_us: float = float("nan")
    cpu_children_us: float = float("nan")
    cpu_client_us: float = float("nan")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def model_inputs(model: str, nbytes: int) -> dict[str, np.ndarray]:
    """The input tensors of one request (FP32). identity_fp32 takes [1, n]; add_sub has fixed [4] inputs."""
    if model == "add_sub":
        return {"INPUT0": np.arange(4, dtype=np.float32), "INPUT1": np.ones(4, dtype=np.float32)}
    count = max(1, nbytes // 4)
    return {"INPUT0": np.random.default_rng(7).standard_normal((1, count)).astype(np.float32)}


def expected_outputs(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a correct server answers: checked once per window so a broken peer cannot look fast."""
    if model == "add_sub":
        return {"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"], "OUTPUT1": inputs["INPUT0"] - inputs["INPUT1"]}
    return {"OUTPUT0": inputs["INPUT0"]}


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


class _Shm:
    """Client system shared memory for one window: one input region, one output region per worker."""

    def __init__(self, client: Any, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                 workers: int) -> None:
        import tritonclient.utils.shared_memory as shm

        self._shm, self._client, self._handles, self._names = shm, client, [], []
        self._registered: list[str] = []
        self._inputs, self._outputs, self._workers = inputs, outputs, workers
        # not "pystub_...": pystub refuses to map its own objects as client regions
        self._tag = f"bench_client_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        self.input_region = f"{self._tag}_in"
        self.output_regions = [f"{self._tag}_out{w}" for w in range(workers)]

    async def __aenter__(self) -> _Shm:
        try:
            await self._setup()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _setup(self) -> None:
        in_size = sum(a.nbytes for a in self._inputs.values())
        out_size = sum(a.nbytes for a in self._outputs.values())
        self._create(self.input_region, in_size)
        self._shm.set_shared_memory_region(self._handles[0], list(self._inputs.values()))
        for name in self.output_regions:
            self._create(name, out_size)
        for name in self._names:
            size = in_size if name == self.input_region else out_size
            await self._client.register_system_shared_memory(name, "/" + name, size)
            self._registered.append(name)

    def _create(self, name: str, size: int) -> None:
        self._handles.append(self._shm.create_shared_memory_region(name, "/" + name, size))
        self._names.append(name)

    async def __aexit__(self, *exc: object) -> None:
        for name in self._registered:
            with contextlib.suppress(Exception):
                await self._client.unregister_system_shared_memory(name)
        for handle in self._handles:
            with contextlib.suppress(Exception):
                self._shm.destroy_shared_memory_region(handle)

    def output_view(self, worker: int, name: str) -> np.ndarray:
        """The output tensor `name` as the server wrote it into this worker's region."""
        offset = 0
        for key, array in self._outputs.items():
            if key == name:
                return self._shm.get_contents_as_numpy(self._handles[1 + worker], array.dtype, array.shape, offset)
            offset += array.nbytes
        raise KeyError(name)


class _Requests:
    """Builds one worker's reusable inputs and outputs for a protocol, plain or through shm."""

    def __init__(self, point: Point, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self.point, self.inputs, self.outputs = point, inputs, outputs
        self._shared: tuple[list[Any], list[Any] | None] | None = None
        self.module = grpcaio if point.protocol == "grpc" else httpaio
        self.extra: dict[str, Any] = {}
        if point.protocol != "grpc":
            # aiohttp offers `gzip, deflate` by default, and pystub and Triton then compress every
            # response (tritonclient inflates it): the table would measure zlib, not the servers
            headers = {"Accept-Encoding": "identity"}
            if point.protocol in JSON_PROTOCOLS:
                # aiohttp labels a bytes body application/octet-stream, which MLServer's JSON route refuses
                headers["Content-Type"] = "application/json"
            self.extra = {"headers": headers}

    def build(self, shm: _Shm | None, worker: int) -> tuple[list[Any], list[Any] | None]:
        """Inputs and requested outputs of `worker`; without shm every worker shares one set (the
        client only reads them, and a JSON tensor of 16 MiB is a 130 MB Python list)."""
        if shm is None:
            if self._shared is None:
                self._shared = self._build(None, 0)
            return self._shared
        return self._build(shm, worker)

    def _build(self, shm: _Shm | None, worker: int) -> tuple[list[Any], list[Any] | None]:
        binary = self.point.protocol not in JSON_PROTOCOLS
        infer_inputs, offset = [], 0
        for name, array in self.inputs.items():
            tensor = self.module.InferInput(name, list(array.shape), "FP32")
            if shm is not None:
                tensor.set_shared_memory(shm.input_region, array.nbytes, offset)
                offset += array.nbytes
            elif self.point.protocol == "grpc":
                tensor.set_data_from_numpy(array)
            else:
                tensor.set_data_from_numpy(array, binary_data=binary)
            infer_inputs.append(tensor)
        if shm is None and self.point.protocol == "grpc":
            return infer_inputs, None
        requested, offset = [], 0
        for name, array in self.outputs.items():
            if self.point.protocol == "grpc":
                output = self.module.InferRequestedOutput(name)
            else:
                output = self.module.InferRequestedOutput(name, binary_data=binary)
            if shm is not None:
                output.set_shared_memory(shm.output_regions[worker], array.nbytes, offset)
                offset += array.nbytes
            requested.append(output)
        return infer_inputs, requested


def make_client(protocol: str, url: str, concurrency: int) -> Any:
    """A tritonclient aio client for `protocol` at `url` (host:port)."""
    if protocol == "grpc":
        return grpcaio.InferenceServerClient(url)
    return httpaio.InferenceServerClient(url, conn_limit=max(8, concurrency))


async def _check(client: Any, requests: _Requests, point: Point, shm: _Shm | None) -> None:
    """One call whose answer must be right; raises RuntimeError naming the mismatch."""
    inputs, outputs = requests.build(shm, 0)
    result = await client.infer(point.model, inputs, outputs=outputs, **requests.extra)
    for name, want in requests.outputs.items():
        got = shm.output_view(0, name) if shm is not None else result.as_numpy(name)
        if got is None or got.shape != want.shape or not np.array_equal(got, want):
            raise RuntimeError(f"{point.model} answered a wrong {name} over {point.protocol}")


async def measure(url: str, point: Point, warmup: float, seconds: float, min_samples: int = 5,
                  max_seconds: float = 60.0) -> Sample:
    """Drive `point` against the server at `url` (host:port of the point's protocol).

    Raises RuntimeError when the server answers wrongly or every request fails.
    """
    inputs = model_inputs(point.model, point.nbytes)
    outputs = expected_outputs(point.model, inputs)
    client = make_client(point.protocol, url, point.concurrency)
    try:
        async with contextlib.AsyncExitStack() as stack:
            shm = None
            if point.shm:
                shm = await stack.enter_async_context(_Shm(client, inputs, outputs, point.concurrency))
            requests = _Requests(point, inputs, outputs)
            await _check(client, requests, point, shm)
            return await _window(client, requests, point, shm, warmup, seconds, min_samples, max_seconds)
    finally:
        await client.close()


async def _window(client: Any, requests: _Requests, point: Point, shm: _Shm | None, warmup: float,
                  seconds: float, min_samples: int, max_seconds: float) -> Sample:
    latencies: list[float] = []
    errors: list[BaseException] = []
    clock = {"start": time.perf_counter() + warmup, "stop": float("inf"), "done": 0}

    async def worker(index: int) -> None:
        inputs, outputs = requests.build(shm, index)
        while True:
            began = time.perf_counter()
            if began >= clock["stop"]:
                return
            try:
                await client.infer(point.model, inputs, outputs=outputs, **requests.extra)
            except Exception as error:  # counted and reported; the window goes on
                errors.append(error)
                await asyncio.sleep(0.01)
                continue
            ended = time.perf_counter()
            if began >= clock["start"]:
                latencies.append(ended - began)
            if clock["start"] <= ended <= clock["stop"]:
                clock["done"] += 1

    tasks = [asyncio.ensure_future(worker(i)) for i in range(point.concurrency)]
    unfinished = 0
    try:
        window_end = clock["start"] + seconds
        while not stopping.requested() and (time.perf_counter() < window_end or (
                clock["done"] < min_samples and time.perf_counter() - clock["start"] < max_seconds)):
            await asyncio.sleep(0.05)
        clock["stop"] = time.perf_counter()
        # the requests in flight finish (their latencies count, and the next point finds the
        # server idle), within a bound: a server that queues 32 slow requests can take minutes
        drain_end = time.perf_counter() + max_seconds * 2
        while not stopping.requested() and time.perf_counter() < drain_end and not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=0.2)
        unfinished = sum(not t.done() for t in tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    stopping.check()
    if unfinished:
        print(f"    note: {unfinished} request(s) still in flight {max_seconds * 2:.0f} s after the window were "
              "abandoned", file=sys.stderr, flush=True)
    if not latencies and errors:
        raise RuntimeError(f"every request failed: {errors[0]!r}")
    latencies.sort()
    elapsed = clock["stop"] - clock["start"]
    return Sample(throughput=clock["done"] / elapsed, p50_ms=1000 * percentile(latencies, 0.5),
                  p99_ms=1000 * percentile(latencies, 0.99), count=len(latencies), errors=len(errors))
