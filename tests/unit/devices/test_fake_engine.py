"""The fake device is as asynchronous and strict as CUDA: queued work lands only at a
synchronization (a reader that did not synchronize sees the old bytes, in this process or
another), the legacy stream and blocking streams order each other and non-blocking ones order
nothing, synchronous cudaMemcpy returns before a host-to-device copy lands; IPC handles cross real
processes with CUDA's lifetime rules, the exporting process cannot open its own handle, NULL and
pool memory cannot be exported, and a mapping still used by queued work cannot be closed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from device_peer import Peer

from pystub_backend.devices import DeviceError, fake_device_array, fake_engine, fake_memory, fake_write_later
from pystub_backend.devices.fake import fake_side_stream
from pystub_backend.devices.fake_bindings import bindings


def _raw(pointer: int, count: int = 4) -> list[float]:
    """The bytes as they are in memory now: what any process mapping them sees, without CUDA."""
    return list((ctypes.c_float * count).from_address(pointer))


def test_a_kernel_lands_only_when_its_stream_is_synchronized() -> None:
    runtime, _ = bindings("13")
    out = fake_device_array(np.zeros(4, np.float32), 0)
    fake_write_later(out, np.ones(4), 0)
    assert _raw(out.ctypes.data) == [0.0] * 4  # queued on the legacy stream, not run
    assert int(runtime.cudaStreamSynchronize(runtime.cudaStreamLegacy)[0]) == 0
    assert _raw(out.ctypes.data) == [1.0] * 4


def test_blocking_streams_wait_for_the_legacy_stream_and_non_blocking_ones_do_not() -> None:
    runtime, _ = bindings("13")
    runtime.cudaSetDevice(0)
    out = fake_device_array(np.zeros(4, np.float32), 0)
    fake_write_later(out, np.full(4, 2.0), 0)  # the model's kernel, on the legacy stream
    _, free = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking)
    runtime.cudaStreamSynchronize(free)
    assert _raw(out.ctypes.data) == [0.0] * 4  # a non-blocking stream waited for nothing
    _, blocking = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamDefault)
    host = np.empty(4, np.float32)
    runtime.cudaMemcpyAsync(host.ctypes.data, out.ctypes.data, 16, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                            blocking)
    runtime.cudaStreamSynchronize(blocking)
    assert host.tolist() == [2.0] * 4  # the blocking stream's copy ran after the legacy stream's kernel
    with fake_side_stream(0):
        fake_write_later(out, np.full(4, 3.0), 0)  # on a non-blocking side stream
    runtime.cudaStreamSynchronize(blocking)
    assert _raw(out.ctypes.data) == [2.0] * 4
    runtime.cudaDeviceSynchronize()
    assert _raw(out.ctypes.data) == [3.0] * 4
    for stream in (free, blocking):
        runtime.cudaStreamDestroy(stream)


def test_synchronous_cudamemcpy_returns_before_a_host_to_device_copy_lands() -> None:
    runtime, _ = bindings("13")
    _, pointer = runtime.cudaMalloc(16)
    host = np.arange(4, dtype=np.float32)
    assert int(runtime.cudaMemcpy(pointer, host.ctypes.data, 16, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)[0]) == 0
    host[:] = 9.0  # the source was staged when the call returned
    assert _raw(pointer) == [0.0] * 4  # ... but the DMA has not landed
    back = np.empty(4, np.float32)
    runtime.cudaMemcpy(back.ctypes.data, pointer, 16, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)
    assert back.tolist() == [0.0, 1.0, 2.0, 3.0]  # device-to-host returns once done, after the earlier copy
    runtime.cudaFree(pointer)


def test_cudafree_synchronizes_the_device_and_an_empty_allocation_is_null() -> None:
    runtime, _ = bindings("13")
    before = fake_engine.counters()["device_syncs"]
    _, pointer = runtime.cudaMalloc(64)
    runtime.cudaFree(pointer)
    assert fake_engine.counters()["device_syncs"] == before + 1
    assert runtime.cudaMalloc(0)[1] == 0
    assert fake_device_array(np.empty((0, 3), np.float32), 1).shape == (0, 3)


def test_a_copy_between_two_devices_needs_the_peer_call() -> None:
    runtime, _ = bindings("13")
    (_, first), (_, second) = runtime.cudaMalloc(16), (runtime.cudaSetDevice(1), runtime.cudaMalloc(16))[1]
    error, = runtime.cudaMemcpy(second, first, 16, runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice)
    assert error == runtime.cudaError_t.cudaErrorInvalidValue
    assert int(runtime.cudaMemcpyPeerAsync(second, 1, first, 0, 16, 0)[0]) == 0
    for pointer in (first, second):
        runtime.cudaFree(pointer)
    runtime.cudaSetDevice(0)


def test_an_importer_maps_the_exporters_pages_and_a_free_waits_for_its_close() -> None:
    memory = fake_memory()
    array = fake_device_array(np.arange(8, dtype=np.float32), 1)
    handle, offset = memory.export_handle(1, int(array.ctypes.data) + 8)  # inside the allocation
    assert offset == 8 and len(handle) == 64
    peer = Peer(handle, offset, 1)
    assert peer.line() == "raw [2.0, 3.0, 4.0, 5.0]"
    assert peer.line() == "wrote"
    assert array[2] == 42.0  # the same memory
    with pytest.raises(DeviceError, match="cudaFree failed"):
        memory.free(1, int(array.ctypes.data))
    assert fake_engine.last_refusal().endswith("while another process maps it")
    assert peer.finish() == "closed (0, 0)"
    before = fake_engine.freed_while_mapped()
    del array
    assert fake_engine.freed_while_mapped() == before  # collected after the importer closed


def test_an_importer_sees_nothing_the_exporter_did_not_synchronize() -> None:
    memory = fake_memory()
    out = fake_device_array(np.zeros(4, np.float32), 0)
    fake_write_later(out, np.ones(4), 0)  # written by a kernel this process never waited for
    handle, _ = memory.export_handle(0, int(out.ctypes.data))
    peer = Peer(handle, 0, 0)
    assert peer.line() == "raw [0.0, 0.0, 0.0, 0.0]"
    assert peer.line() == "wrote"
    assert peer.finish() == "closed (0, 0)"
    memory.synchronize(0)
    del out


def test_a_killed_importer_no_longer_holds_the_memory() -> None:
    memory = fake_memory()
    pointer = memory.alloc(0, 32)
    handle, _ = memory.export_handle(0, pointer)
    peer = Peer(handle, 0, 0)
    assert peer.line().startswith("raw")
    with pytest.raises(DeviceError, match="cudaFree failed"):
        memory.free(0, pointer)
    assert fake_engine.last_refusal().endswith("while another process maps it")
    peer.kill()
    memory.free(0, pointer)  # the kernel dropped the dead importer's lock with its mapping


def test_what_cuda_refuses_to_export_or_open_is_refused() -> None:
    runtime, _ = bindings("13")
    memory = fake_memory()
    pointer = memory.alloc(0, 16)
    handle, _ = memory.export_handle(0, pointer)
    native = runtime.cudaIpcMemHandle_t()
    ctypes.memmove(native.getPtr(), handle, 64)
    error, _ = runtime.cudaIpcOpenMemHandle(native, runtime.cudaIpcMemLazyEnablePeerAccess)
    assert error == runtime.cudaError_t.cudaErrorDeviceUninitialized  # its own handle, in the exporting process
    assert Peer(handle, 0, 1).finish() == ("error cudaIpcOpenMemHandle failed: invalid argument "
                                           "(cudaErrorInvalidValue)")  # on another device than its memory's
    with pytest.raises(DeviceError, match=r"cudaIpcOpenMemHandle failed: invalid argument"):
        memory.open_handle(0, bytes(64))
    memory.free(0, pointer)
    assert Peer(handle, 0, 0).finish() == ("error cudaIpcOpenMemHandle failed: invalid argument "
                                           "(cudaErrorInvalidValue)")  # the exporter freed it
    pool = fake_device_array(np.ones(4, np.float32), 0, exportable=False)  # a caching pool's memory
    for pointer in (0, int(pool.ctypes.data), 12345):
        with pytest.raises(DeviceError, match="cudaIpcGetMemHandle failed|cuMemGetAddressRange failed"):
            memory.export_handle(0, pointer)
    del pool


_READ_WITHOUT_WAITING = '''
import numpy as np
from pystub_backend.devices import fake_engine, fake_memory
from pystub_backend.devices.fake_bindings import bindings
runtime, _ = bindings("13")
memory = fake_memory()
base = memory.open_handle(DEVICE, HANDLE)
host = np.empty(4, np.float32)
runtime.cudaSetDevice(DEVICE)
runtime.cudaMemcpyAsync(host.ctypes.data, base, 16, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost, 0)
try:
    memory.close_handle(DEVICE, base)
except Exception as exc:
    print(exc)
memory.synchronize(DEVICE)
memory.close_handle(DEVICE, base)
print(fake_engine.live())
'''


def test_a_mapping_still_used_by_queued_work_cannot_be_closed_until_synchronized() -> None:
    memory = fake_memory()
    pointer = memory.alloc(1, 16)
    handle, _ = memory.export_handle(1, pointer)
    said = Peer(handle, 0, 1, script=_READ_WITHOUT_WAITING).finish()
    assert said.splitlines() == ["cudaIpcCloseMemHandle failed: an illegal memory access was encountered "
                                 "(cudaErrorIllegalAddress)", "(0, 0)"], said
    memory.free(1, pointer)
