"""The fake device's memory keeps CUDA IPC's rules across real processes: an importer maps the
exporter's very pages, a free while another process maps them is refused, a dead importer's
mapping no longer counts, and a handle whose exporter freed it or exited cannot be opened."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from pystub_backend.devices import DeviceError, FakeMemory, fake_device_array
from pystub_backend.devices.fake_memory import freed_while_mapped

_IMPORTER = '''
import ctypes, sys
from pystub_backend.devices import FakeMemory
memory = FakeMemory()
handle, offset, device = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    base = memory.open_handle(device, handle)
except Exception as exc:
    print("error", exc, flush=True)
    sys.exit(0)
values = (ctypes.c_float * 4).from_address(base + offset)
print("read", list(values), flush=True)
values[0] = 42.0
print("wrote", flush=True)
sys.stdin.readline()  # hold the mapping until told
memory.close_handle(device, base)
print("closed", memory.live(), flush=True)
'''


class _Importer:
    """A second process that opens a handle, reads and writes through it, and holds it."""

    def __init__(self, handle: bytes, offset: int, device: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _IMPORTER, handle.hex(), str(offset), str(device)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()  # the child exits, closing it, if anything fails

    def finish(self) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        last = self.process.stdout.read().strip()
        self.process.wait(timeout=30)
        self.process.stdin.close()
        self.process.stdout.close()
        return last


@pytest.fixture
def memory() -> Iterator[FakeMemory]:
    fake = FakeMemory()
    yield fake
    gc.collect()
    assert fake.live() == (0, 0)


def test_an_importer_maps_the_exporters_pages_and_a_free_waits_for_its_close(memory: FakeMemory) -> None:
    array = fake_device_array(np.arange(8, dtype=np.float32), 1)
    handle, offset = memory.export_handle(1, int(array.ctypes.data) + 8)  # inside the allocation
    assert offset == 8 and len(handle) == 64
    importer = _Importer(handle, offset, 1)
    assert importer.line() == "read [2.0, 3.0, 4.0, 5.0]"
    assert importer.line() == "wrote"
    assert array[2] == 42.0  # the same memory
    pointer = memory.alloc(1, 16)
    memory.free(1, pointer)  # an allocation nobody maps frees
    with pytest.raises(DeviceError, match="while another process maps it"):
        memory.free(1, int(array.ctypes.data))
    assert importer.finish() == "closed (0, 0)"
    before = freed_while_mapped()
    del array
    gc.collect()
    assert freed_while_mapped() == before  # collected after the importer closed: no lifetime error


def test_a_killed_importer_no_longer_holds_the_memory(memory: FakeMemory) -> None:
    pointer = memory.alloc(0, 32)
    handle, _ = memory.export_handle(0, pointer)
    importer = _Importer(handle, 0, 0)
    assert importer.line().startswith("read")
    with pytest.raises(DeviceError, match="while another process maps it"):
        memory.free(0, pointer)
    importer.process.kill()
    importer.process.wait(timeout=30)
    assert importer.process.stdin is not None and importer.process.stdout is not None
    importer.process.stdin.close()
    importer.process.stdout.close()
    memory.free(0, pointer)  # the kernel dropped the dead importer's lock with its mapping


def test_a_freed_allocations_handle_cannot_be_opened_and_bad_handles_are_refused(memory: FakeMemory) -> None:
    pointer = memory.alloc(0, 16)
    handle, _ = memory.export_handle(0, pointer)
    with pytest.raises(DeviceError, match=r"the memory is on device 0, not 1"):
        memory.open_handle(1, handle)
    memory.free(0, pointer)
    importer = _Importer(handle, 0, 0)
    assert importer.line() == ("error cudaIpcOpenMemHandle failed: invalid argument "
                               "(the exporting process freed the memory or exited)")
    importer.process.wait(timeout=30)
    assert importer.process.stdin is not None and importer.process.stdout is not None
    importer.process.stdin.close()
    importer.process.stdout.close()
    with pytest.raises(DeviceError, match="not an IPC memory handle"):
        memory.open_handle(0, bytes(64))
    with pytest.raises(DeviceError, match="invalid device pointer"):
        memory.export_handle(0, 12345)
