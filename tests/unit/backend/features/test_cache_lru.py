"""The response cache's pieces without a server: its key, its byte-bounded LRU, the config it
accepts (`--cache-config`) and the models it refuses, and how hits and misses are counted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.features.response_cache import (
    ENTRY_OVERHEAD,
    THREAD_HASH_BYTES,
    CacheConfigError,
    ResponseCache,
    cache_from_config,
    cache_refusal,
    cached_infer,
)
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.telemetry.statistics import ModelStatistics


def request(data: bytes = b"\x01\x02\x03\x04", name: str = "X", model: str = "m", version: str = "1",
            **extra: object) -> InferRequest:
    return InferRequest(model, version, inputs=[Tensor(name, "FP32", (1,), data)], **extra)  # type: ignore[arg-type]


def response(size: int, tag: int = 0) -> InferResponse:
    return InferResponse("m", "1", outputs=[Tensor("Y", "UINT8", (size,), bytes([tag]) * size)])


def entry_size(size: int) -> int:
    return ENTRY_OVERHEAD + size + len("Y") + 16 + 8


def test_key_is_model_version_and_input_names_and_bytes() -> None:
    key = ResponseCache.key
    assert key(request()) == key(request(parameters={"p": 1}, id="other"))  # parameters and id: not in it
    assert key(request()) != key(request(data=b"\x01\x02\x03\x05"))
    assert key(request()) != key(request(name="Z"))
    assert key(request()) != key(request(model="n"))
    assert key(request()) != key(request(version="2"))
    two = InferRequest("m", "1", inputs=[Tensor("A", "FP32", (1,), b"aaaa"), Tensor("B", "FP32", (1,), b"bbbb")])
    swapped = InferRequest("m", "1", inputs=[Tensor("B", "FP32", (1,), b"bbbb"), Tensor("A", "FP32", (1,), b"aaaa")])
    assert key(two) == key(swapped)  # input order does not matter
    moved = InferRequest("m", "1", inputs=[Tensor("A", "FP32", (1,), b"aaaab"), Tensor("B", "FP32", (1,), b"bbb")])
    assert key(two) != key(moved)  # bytes cannot slide from one input to the next
    as_array = InferRequest("m", "1", inputs=[Tensor("X", "FP32", (1,), np.frombuffer(b"\x01\x02\x03\x04", np.uint8))])
    assert key(as_array) == key(request())


def test_lru_evicts_the_least_recently_used_within_the_byte_size() -> None:
    cache = ResponseCache(2 * entry_size(100) + 10)
    for tag in (1, 2):
        assert cache.insert(bytes([tag]), response(100, tag))
    assert cache.lookup(b"\x01") is not None  # 1 is now the most recent
    assert cache.insert(b"\x03", response(100, 3))
    assert cache.lookup(b"\x02") is None and cache.evictions == 1
    assert cache.entries == 2 and cache.used == 2 * entry_size(100)
    found = cache.lookup(b"\x01")
    assert found is not None and found.outputs[0].data == bytes([1]) * 100
    assert (cache.hits, cache.misses) == (2, 1)


def test_an_entry_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(entry_size(100) - 1)
    assert not cache.insert(b"k", response(100))
    assert cache.entries == 0 and cache.used == 0


def test_stored_outputs_are_copies() -> None:
    buffer = bytearray(b"abcd")
    cache = ResponseCache(1 << 20)
    cache.insert(b"k", InferResponse("m", "1", outputs=[Tensor("Y", "UINT8", (4,), memoryview(buffer))]))
    buffer[:] = b"zzzz"  # the arena is reused once the response is released
    entry = cache.lookup(b"k")
    assert entry is not None and entry.outputs[0].data == b"abcd"


@pytest.mark.parametrize(("config", "text"), [
    ({"redis": {"host": "x"}}, "unable to find cache 'redis'"),
    ({"local": {}}, "Failed to initialize LocalCache: config didn't contain a valid 'size' field."),
    ({"local": {"size": "abc"}}, "Failed to initialize LocalCache: size 'abc' is not a number of bytes"),
    ({"local": {"size": "0"}}, "size must be positive"),
])
def test_bad_cache_configs_are_refused(config: dict[str, dict[str, str]], text: str) -> None:
    with pytest.raises(CacheConfigError, match=text):
        cache_from_config(config)


def test_no_cache_config_means_no_cache() -> None:
    assert cache_from_config({}) is None
    cache = cache_from_config({"local": {"size": "4096"}})
    assert cache is not None and cache.byte_size == 4096


def test_refusals_have_tritons_texts() -> None:
    config = model_config_pb2.ModelConfig(name="m")
    assert cache_refusal(config, decoupled=True) is None  # the cache is not enabled
    config.response_cache.enable = True
    assert cache_refusal(config, decoupled=False) is None
    assert cache_refusal(config, decoupled=True) == (
        "Response Cache does not currently support model m with 'decoupled' transaction policy. Please disable the "
        "response cache.")
    config.sequence_batching.SetInParent()
    assert cache_refusal(config, decoupled=False) == (
        "Response Cache does not currently support model m with sequence batching scheduler. Please disable the "
        "response cache.")


def test_hits_and_misses_are_counted_as_triton_counts_them() -> None:
    cache, stats, runs = ResponseCache(1 << 20), ModelStatistics("m", "1"), []

    async def run() -> InferResponse:
        runs.append(1)
        return response(4, len(runs))

    async def script() -> list[InferResponse]:
        return [await cached_infer(cache, stats, request(), run) for _ in range(3)]

    answers = asyncio.run(script())
    assert len(runs) == 1 and [a.outputs[0].data for a in answers] == [b"\x01" * 4] * 3
    assert (stats.cache_hit.count, stats.cache_miss.count) == (2, 1)
    assert stats.success.count == 2 and stats.queue.count == 2  # the miss is counted by its scheduler
    row = stats.as_dict()["inference_stats"]
    assert row["cache_hit"]["count"] == 2 and row["cache_miss"]["count"] == 1


def test_error_responses_are_not_stored() -> None:
    from pystub_backend.backend.errors import ServerError
    cache, stats = ResponseCache(1 << 20), ModelStatistics("m", "1")

    async def failing() -> InferResponse:
        return InferResponse("m", "1", error=ServerError("no"))

    asyncio.run(cached_infer(cache, stats, request(), failing))
    assert cache.entries == 0 and stats.cache_miss.count == 1


def test_large_inputs_are_hashed_off_the_loop_to_the_same_key() -> None:
    cache, stats, runs = ResponseCache(1 << 20), ModelStatistics("m", "1"), []
    big = InferRequest("m", "1", inputs=[Tensor("X", "UINT8", (THREAD_HASH_BYTES,), bytes(THREAD_HASH_BYTES))])

    async def run() -> InferResponse:
        runs.append(1)
        return response(4)

    async def twice() -> None:
        for _ in range(2):
            await cached_infer(cache, stats, big, run)

    asyncio.run(twice())
    assert len(runs) == 1 and stats.cache_hit.count == 1
    assert cache.lookup(ResponseCache.key(big)) is not None
