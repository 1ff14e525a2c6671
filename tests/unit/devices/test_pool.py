"""The stub's pool of device buffers: a block given back is taken again instead of a cudaFree
(which would synchronize the device) and a cudaMalloc; past its cap blocks are freed."""

from __future__ import annotations

from pystub_backend.devices import BufferPool, fake_engine, fake_memory


def test_blocks_are_reused_without_cudafree_or_cudamalloc() -> None:
    pool = BufferPool(fake_memory())
    counters = fake_engine.counters()
    mallocs, frees, syncs = counters["mallocs"], counters["frees"], counters["device_syncs"]
    for _ in range(50):
        pointer = pool.take(1, 1000)
        pool.give(1, pointer)
    assert (counters["mallocs"] - mallocs, counters["frees"] - frees, counters["device_syncs"] - syncs) == (1, 0, 0)
    assert pool.take(1, 0) == 0
    pool.close()
    assert counters["frees"] - frees == 1


def test_past_its_cap_a_block_is_freed() -> None:
    pool = BufferPool(fake_memory(), keep_bytes=4096)
    first, second = pool.take(0, 4096), pool.take(0, 4096)
    pool.give(0, first)
    frees = fake_engine.counters()["frees"]
    pool.give(0, second)  # over the cap
    assert fake_engine.counters()["frees"] == frees + 1 and pool.cached_bytes(0) == 4096
    pool.close()
