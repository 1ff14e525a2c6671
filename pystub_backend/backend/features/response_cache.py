"""The response cache: `response_cache { enable: true }` answers a repeated request from memory.

    --cache-config=local,size=N ──▶ ResponseCache (one per server, an LRU bounded to N bytes)
    ModelVersion.infer ──▶ cached_infer: key = hash(model, version, every input's name and bytes)
        hit  ──▶ a copy of the stored response; statistics `success`, `queue`, `cache_hit`
        miss ──▶ the scheduler runs it; a successful response is copied in; `cache_miss`
                 counts the lookup plus the insertion

What Triton 2.51 does, and so pystub (checked against it):
- the key is the model name, its version and each input's name and data, nothing else: neither
  request parameters nor the outputs asked for (Triton then answers a hit with every output the
  cached response had, asked for or not; pystub's frontends send only the outputs asked for);
- without a cache configured, `response_cache { enable: true }` loads and does nothing; the
  per-model `nv_cache_*_per_model` counters are still printed (zero) for such a model;
- a decoupled model or one with a sequence batcher and `response_cache { enable: true }` fails to
  load, with the texts of `cache_refusal`, whether or not a cache is configured;
- only successful responses are stored; an entry larger than the whole cache is not stored.

Entry size is what the outputs' bytes, names and shapes take, plus a fixed per-entry overhead.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import Buffer, InferRequest, InferResponse, ParameterValue, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.telemetry.statistics import ModelStatistics

__all__ = ["ResponseCache", "CacheConfigError", "cache_from_config", "cache_enabled",
           "cache_refusal", "cached_infer", "THREAD_HASH_BYTES", "cached_stream", "version_cache", "ENTRY_OVERHEAD"]

ENTRY_OVERHEAD = 64  # bytes an entry costs beyond its tensors: key, list, bookkeeping
# Inputs at least this large are hashed on a worker thread, so the event loop serves the other
# requests meanwhile (hashing 64 MiB took 0.4 s on a busy two-core machine).
THREAD_HASH_BYTES = 1 << 20
_TENSOR_OVERHEAD = 16


class CacheConfigError(ValueError):
    """A `--cache-config` pystub cannot honour; the message is Triton's text where it has one."""


def cache_from_config(cache_config: dict[str, dict[str, str]]) -> ResponseCache | None:
    """The server's cache for `ServerOptions.cache_config`, or None when none is configured.
    Raises CacheConfigError."""
    if not cache_config:
        return None
    unknown = sorted(set(cache_config) - {"local"})
    if unknown:
        raise CacheConfigError(f"unable to find cache '{unknown[0]}': pystub has only the 'local' cache")
    size = cache_config["local"].get("size", "")
    if not size:
        raise CacheConfigError("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
    try:
        byte_size = int(size)
    except ValueError:
        raise CacheConfigError(f"Failed to initialize LocalCache: size '{size}' is not a number of bytes") from None
    if byte_size <= 0:
        raise CacheConfigError(f"Failed to initialize LocalCache: size must be positive, got {byte_size}")
    return ResponseCache(byte_size)


def cache_enabled(config: object) -> bool:
    """Whether the model config asks for the response cache."""
    return bool(getattr(getattr(config, "response_cache", None), "enable", False))


def cache_refusal(config: object, decoupled: bool) -> str | None:
    """Why the model may not use the response cache (Triton's texts), or None."""
    if not cache_enabled(config):
        return None
    name = getattr(config, "name", "")
    if decoupled:
        return (f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
                f"Please disable the response cache.")
    if getattr(config, "WhichOneof", lambda _: None)("scheduling_choice") == "sequence_batching":
        return (f"Response Cache does not currently support model {name} with sequence batching scheduler. "
                f"Please disable the response cache.")
    return None


def _byte_view(data: Buffer) -> memoryview:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).data.cast("B")
    return memoryview(data).cast("B")


@dataclass
class _Entry:
    outputs: list[Tensor]
    parameters: dict[str, ParameterValue]
    nbytes: int


class ResponseCache:
    """A byte-bounded LRU of responses (the `local` cache). Event-loop only: no locking."""

    def __init__(self, byte_size: int) -> None:
        self.byte_size = byte_size
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insertion_ns = 0
        self._entries: collections.OrderedDict[bytes, _Entry] = collections.OrderedDict()

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def utilization(self) -> float:
        return self.used / self.byte_size

    @staticmethod
    def key(request: InferRequest) -> bytes:
        """Model name, version and every input's name and bytes, inputs in name order."""
        digest = hashlib.blake2b(digest_size=32)
        for part in (request.model_name, request.model_version):
            digest.update(len(part).to_bytes(8, "little") + part.encode())
        for tensor in sorted(request.inputs, key=lambda t: t.name):
            name = tensor.name.encode()
            data = _byte_view(tensor.data)
            # lengths go in too, so no two different inputs hash the same bytes
            digest.update(len(name).to_bytes(8, "little") + name + data.nbytes.to_bytes(8, "little"))
            digest.update(data)
        return digest.digest()

    def lookup(self, key: bytes) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def insert(self, key: bytes, response: InferResponse) -> bool:
        """Store a copy of `response` (its outputs may view shared memory); evict the least recently
        used entries to make room. False when the entry is larger than the whole cache."""
        outputs = [Tensor(t.name, t.datatype, tuple(t.shape), bytes(_byte_view(t.data)),
                          dict(t.parameters)) for t in response.outputs]
        nbytes = ENTRY_OVERHEAD + sum(len(t.data) + len(t.name) + _TENSOR_OVERHEAD + 8 * len(t.shape)
                                      for t in outputs)
        if nbytes > self.byte_size:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        while self.used + nbytes > self.byte_size:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = _Entry(outputs, dict(response.parameters), nbytes)
        self.used += nbytes
        return True

    @staticmethod
    def response(entry: _Entry, request: InferRequest) -> InferResponse:
        """A response for `request` built from a stored entry (the tensors' bytes are shared:
        nothing writes into them)."""
        return InferResponse(request.model_name, request.model_version, request.id,
                             outputs=[Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters))
                                      for t in entry.outputs], parameters=dict(entry.parameters))


def version_cache(config: object, server: object) -> ResponseCache | None:
    """The cache a model version uses: the server's (`server.response_cache`), if its config enables it."""
    cache = getattr(server, "response_cache", None)
    return cache if isinstance(cache, ResponseCache) and cache_enabled(config) else None


async def cached_infer(cache: ResponseCache, stats: ModelStatistics, request: InferRequest,
                       run: Callable[[], Awaitable[InferResponse]]) -> InferResponse:
    """Answer `request` from the cache, or `run()` it and store its response. Raises what `run` raises."""
    started = time.monotonic_ns()
    if sum(_byte_view(tensor.data).nbytes for tensor in request.inputs) >= THREAD_HASH_BYTES:
        key = await asyncio.to_thread(cache.key, request)  # the input buffers are not written meanwhile
    else:
        key = cache.key(request)
    entry = cache.lookup(key)
    looked_up = time.monotonic_ns()
    cache.lookup_ns += looked_up - started
    if entry is not None:
        stats.cache_hit.add(looked_up - started)
        # As Triton counts a hit: a successful request with (almost) no queueing and no compute.
        stats.last_inference_ms = int(time.time() * 1000)
        stats.success.add(time.monotonic_ns() - started)
        stats.queue.add(looked_up - started)
        return cache.response(entry, request)
    response = await run()
    inserting = time.monotonic_ns()
    if response.error is None:
        cache.insert(key, response)
    inserted = time.monotonic_ns()
    cache.insertion_ns += inserted - inserting
    stats.cache_miss.add((looked_up - started) + (inserted - inserting))
    return response


async def cached_stream(cache: ResponseCache, stats: ModelStatistics, request: InferRequest,
                        run: Callable[[], Awaitable[InferResponse]]) -> ResponseStream:
    """`cached_infer` for a streaming caller (a default-mode model: one response), as a finished stream."""
    stream = ResponseStream(request.id, request.model_name, lambda: None)
    stream.model_version = request.model_version
    try:
        stream.put(await cached_infer(cache, stats, request, run), final=True)
    except ServerError as error:
        stream.fail(error)
    return stream
