"""The fake device's engine, per process: its memory, its IPC handles, its streams of queued work.

Memory. An allocation is a memfd mapped into the allocating process; its device pointer is the
mapping's host address. Its IPC handle names the memfd through the exporting process's fd table:

    handle (64 bytes) = b"PYSTUBFK" | pid u32 | fd u32 | size u64 | device u32 | token 16 bytes | zeros
                        open: /proc/<pid>/fd/<fd>, checked to be the memfd "pystub-fake-<pid>-<device>-<token>"

which keeps CUDA's rules honest across real processes:

- an importer maps the very same pages; it holds a shared `flock` on the memfd while it maps it,
  so an exporter that frees what another process maps is caught (`release` refuses, a collected
  one is counted in `freed_while_mapped()`); the kernel drops the lock of an importer that dies;
- once the exporter freed the allocation or exited, opening its handle fails;
- opening a handle in the process that exported it fails (cudaErrorDeviceUninitialized, as CUDA
  refuses it), and so does exporting memory that is not a cudaMalloc block of this process (an
  opened handle, `exportable=False` memory: a caching pool's, expandable segments), or NULL;
- an empty allocation is NULL, as cudaMalloc(0) gives.

Streams. Work never runs when it is queued; it lands only when this process synchronizes:

    enqueue(stream, op)     op joins the stream's queue: on a legacy stream it waits for the work
                            so far of every blocking stream of its device, on a blocking stream for
                            the legacy stream's (CUDA's implicit synchronization); a non-blocking
                            stream waits for nobody
    wait(waiter, producer)  the waiter's later work waits for the producer's work so far (an event)
    synchronize(stream)     runs the stream's queue, and what it waits for, to its end
    synchronize_device(d)   every stream of device d (cudaDeviceSynchronize, cudaFree)

So a reader that did not synchronize with the writer sees the bytes from before the queued work,
however long it waits: an importer in another process never sees a write the exporter's process
has not synchronized. Device ids here are physical; the stand-in runtime (fake_bindings) maps
CUDA ordinals through CUDA_VISIBLE_DEVICES. Each process that used device d also holds a fake
context there (a mapped sparse memfd of CONTEXT_BYTES), counted like an allocation by the fake NVML.

Imported only under PYSTUB_FAKE_GPUS (tests and the device check's --fake run).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import itertools
import mmap
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pystub_backend.devices.visible import visible_physical

__all__ = ["FAKE_VARIABLE", "fake_uuid", "visible_devices", "contexts", "FakeCudaError", "last_refusal",
           "Stream", "CONTEXT_BYTES", "HANDLE_SIZE", "MEMFD_PREFIX", "allocate", "release", "locate", "export",
           "open_handle", "close_handle", "enqueue", "wait", "synchronize", "synchronize_device",
           "legacy_stream", "create_stream", "destroy_stream", "stream_by_id", "touch_context", "live",
           "freed_while_mapped", "mapped_elsewhere", "counters", "copy_op", "LEGACY_STREAM_ID"]

FAKE_VARIABLE = "PYSTUB_FAKE_GPUS"  # the fake machine's GPU count; a deployment never sets it
HANDLE_SIZE = 64
CONTEXT_BYTES = 4 << 20
MEMFD_PREFIX = "pystub-fake-"
LEGACY_STREAM_ID = 1  # DLPack's and CUDA's name for the legacy default stream (cudaStreamLegacy)
_HANDLE = struct.Struct("<8sIIQI16s")
_MAGIC = b"PYSTUBFK"

# cudaError_t values (the stand-in runtime turns them into its enum)
INVALID_VALUE, INVALID_DEVICE_POINTER, DEVICE_UNINITIALIZED, INVALID_HANDLE, ILLEGAL_ADDRESS = 1, 17, 201, 400, 700


class FakeCudaError(Exception):
    """A fake CUDA call failed with cudaError_t `code`; the text says why. CUDA returns only the
    code; the why is kept for tests (`last_refusal`)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code
        global _last_refusal
        _last_refusal = why


_last_refusal = ""


def last_refusal() -> str:
    """Why the last fake CUDA call of this process that failed was refused."""
    return _last_refusal


@dataclass
class _Allocation:
    device: int
    fd: int
    size: int
    token: bytes
    mapping: mmap.mmap
    address: int
    exportable: bool


@dataclass
class _Mapping:
    device: int
    fd: int
    mapping: mmap.mmap
    address: int
    size: int
    handle: bytes
    opens: int = 1  # CUDA counts repeated opens of one handle in one context


@dataclass
class _Op:
    seq: int
    after: list[tuple[Stream, int]]  # (stream, seq): that stream's work up to seq lands first
    run: Callable[[], None]
    touches: tuple[tuple[int, int], ...]  # (address, size) of the memory it reads or writes


@dataclass(eq=False)
class Stream:
    """A queue of work on one (physical) device; `id` is what the runtime hands out as its handle."""

    id: int
    device: int
    blocking: bool
    legacy: bool = False
    ops: collections.deque[_Op] = field(default_factory=collections.deque)
    landed: int = 0  # the seq of the last op that ran


# Process-wide, as a CUDA context's state is: every caller sees one table. Reentrant: an op that
# lands may itself call into the engine (a kernel reading device memory).
_lock = threading.RLock()
_allocations: dict[int, _Allocation] = {}  # by address
_mappings: dict[int, _Mapping] = {}  # by address, opened handles
_by_handle: dict[bytes, int] = {}  # handle -> address of its mapping here
_legacy: dict[int, Stream] = {}  # by device
_streams: dict[int, Stream] = {}  # by id, created streams
_contexts: dict[int, int] = {}  # device -> the address of its fake context
_seq = itertools.count(1)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_stream_ids = itertools.count(0x1000)
_freed_while_mapped = 0
_counters: collections.Counter[str] = collections.Counter()


def fake_uuid(physical: int) -> str:
    """The UUID (NVML's "GPU-...") of physical fake GPU `physical`."""
    return f"GPU-fa4e0000-0000-0000-0000-{physical:012d}"


_visible: dict[tuple[str | None, str | None], list[int]] = {}


def visible_devices() -> list[int]:
    """The physical fake GPUs this process's CUDA enumerates, in ordinal order. CUDA reads
    CUDA_VISIBLE_DEVICES once; the fake reads it again only when a test changed it."""
    key = (os.environ.get(FAKE_VARIABLE), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if key not in _visible:
        count = int(key[0] or 0)
        _visible[key] = visible_physical([fake_uuid(i) for i in range(count)], os.environ)
    return _visible[key]


def contexts() -> set[int]:
    """The devices this process holds a context on."""
    with _lock:
        return set(_contexts)


def counters() -> collections.Counter[str]:
    """Calls of interest so far in this process: "device_syncs", "mallocs", "frees"."""
    return _counters


def _address_of(mapping: mmap.mmap) -> int:
    view = np.frombuffer(mapping, dtype=np.uint8)
    address = int(view.ctypes.data)
    del view  # no buffer export may outlive this, or the mapping could not be closed
    return address


def _name(device: int, what: str) -> str:
    return f"{MEMFD_PREFIX}{os.getpid()}-{device}-{what}"


# -- memory ---------------------------------------------------------------------------------------
def touch_context(device: int) -> None:
    """This process uses `device`: it holds a context there from now on (as CUDA's primary context).
    The context is a mapping of a sparse memfd (no descriptor stays open): it costs no memory, and
    the fake NVML counts it from /proc/<pid>/maps, as it counts allocations."""
    with _lock:
        if device in _contexts:
            return
        fd = os.memfd_create(_name(device, "context"), os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, CONTEXT_BYTES)
            # libc's mmap, not Python's: mmap.mmap keeps a duplicate of the descriptor open
            address = _libc.mmap(None, CONTEXT_BYTES, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        _contexts[device] = address  # mapped for the process's lifetime, as a CUDA context is


def allocate(device: int, size: int, exportable: bool = True) -> int:
    """A new allocation's address; 0 (NULL) for an empty one, as cudaMalloc(0) gives."""
    touch_context(device)
    if size == 0:
        return 0
    token = os.urandom(16)
    fd = os.memfd_create(_name(device, token.hex()), os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    allocation = _Allocation(device, fd, size, token, mapping, _address_of(mapping), exportable)
    with _lock:
        _allocations[allocation.address] = allocation
        _counters["mallocs"] += 1
    return allocation.address


def _mapped_elsewhere(allocation: _Allocation) -> bool:
    try:
        fcntl.flock(allocation.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(allocation.fd, fcntl.LOCK_UN)
    return False


def _drop(allocation: _Allocation) -> None:
    allocation.mapping.close()
    os.close(allocation.fd)


def release(address: int, device: int, collected: bool = False) -> None:
    """Free an allocation (cudaFree: the device is synchronized first). A `collected` one (its
    owner was garbage-collected) that another process still maps is counted, not refused."""
    global _freed_while_mapped
    if address == 0:
        return
    synchronize_device(device)
    with _lock:
        allocation = _allocations.get(address)
        if allocation is not None:  # work of another device's streams on it (a peer copy) lands too,
            _land_touching(address, allocation.size)  # or it would read unmapped memory later
        if allocation is None or allocation.device != device:
            raise FakeCudaError(INVALID_VALUE, f"{address:#x} is not an allocation on device {device}")
        if _mapped_elsewhere(allocation):
            if not collected:
                raise FakeCudaError(INVALID_VALUE, f"cudaFree of {address:#x} while another process maps it")
            _freed_while_mapped += 1
        del _allocations[address]
        _counters["frees"] += 1
    _drop(allocation)


def mapped_elsewhere(address: int) -> bool:
    """Whether another process maps the allocation at `address` now (what makes a free unsafe)."""
    with _lock:
        allocation = _allocations.get(address)
        return allocation is not None and _mapped_elsewhere(allocation)


def freed_while_mapped() -> int:
    """How many collected allocations were still mapped by another process (a lifetime bug)."""
    return _freed_while_mapped


def locate(pointer: int) -> tuple[str, int, int, int] | None:
    """("allocation" | "mapping", device, base, size) of the device memory holding `pointer`, or None."""
    with _lock:
        for table, kind in ((_allocations, "allocation"), (_mappings, "mapping")):
            for entry in table.values():
                if entry.address <= pointer < entry.address + entry.size:
                    return kind, entry.device, entry.address, entry.size
    return None


def export(pointer: int) -> tuple[bytes, int]:
    """(IPC handle, base) of the cudaMalloc block holding `pointer`. Raises FakeCudaError as
    cudaIpcGetMemHandle does: NULL, host memory, an opened handle or pool memory cannot be exported."""
    with _lock:
        found = locate(pointer)
        if found is None or found[0] != "allocation":
            what = "an opened IPC handle" if found else "not device memory from cudaMalloc"
            raise FakeCudaError(INVALID_VALUE, f"{pointer:#x}: {what}")
        allocation = _allocations[found[2]]
        if not allocation.exportable:
            raise FakeCudaError(INVALID_VALUE, f"{pointer:#x}: memory of an allocator's pool, not a cudaMalloc block")
    handle = _HANDLE.pack(_MAGIC, os.getpid(), allocation.fd, allocation.size, allocation.device, allocation.token)
    return handle.ljust(HANDLE_SIZE, b"\0"), allocation.address


def open_handle(handle: bytes, device: int) -> int:
    """Map an exported allocation; returns its address here. Raises FakeCudaError as
    cudaIpcOpenMemHandle does (including in the process that exported it)."""
    touch_context(device)
    if len(handle) != HANDLE_SIZE or not handle.startswith(_MAGIC):
        raise FakeCudaError(INVALID_VALUE, "not an IPC memory handle")
    _, pid, fd, size, exported_on, token = _HANDLE.unpack_from(handle)
    if pid == os.getpid():
        raise FakeCudaError(DEVICE_UNINITIALIZED, "a process cannot open its own IPC handle")
    if exported_on != device:
        raise FakeCudaError(INVALID_VALUE, f"the memory is on device {exported_on}, not {device}")
    with _lock:
        known = _by_handle.get(bytes(handle))
        if known is not None:
            _mappings[known].opens += 1
            return known
    path = f"/proc/{pid}/fd/{fd}"
    try:  # the exporter's fd: gone once it freed the allocation or exited
        if not os.readlink(path).startswith(f"/memfd:{MEMFD_PREFIX}{pid}-{device}-{token.hex()}"):
            raise FileNotFoundError(path)
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        raise FakeCudaError(INVALID_VALUE, "the exporting process freed the memory or exited") from None
    try:
        fcntl.flock(own, fcntl.LOCK_SH)  # held while mapped: the exporter's free sees it
        mapping = mmap.mmap(own, size)
    except BaseException:
        os.close(own)
        raise
    entry = _Mapping(device, own, mapping, _address_of(mapping), size, bytes(handle))
    with _lock:
        _mappings[entry.address] = entry
        _by_handle[entry.handle] = entry.address
    return entry.address


def close_handle(address: int) -> None:
    """Unmap what `open_handle` mapped (once per open). Raises FakeCudaError for an address that is
    not mapped, and when queued work still uses the mapping (on a GPU: an illegal address later)."""
    with _lock:
        entry = _mappings.get(address)
        if entry is None:
            raise FakeCudaError(INVALID_VALUE, f"{address:#x} is not mapped")
        if _pending_on(entry.address, entry.size):
            raise FakeCudaError(ILLEGAL_ADDRESS, f"{address:#x} is unmapped while queued work still uses it")
        entry.opens -= 1
        if entry.opens:
            return
        del _mappings[address], _by_handle[entry.handle]
    entry.mapping.close()
    os.close(entry.fd)  # drops the shared lock


def live() -> tuple[int, int]:
    """(allocations, mappings) still open in this process."""
    with _lock:
        return len(_allocations), len(_mappings)


# -- streams --------------------------------------------------------------------------------------
def legacy_stream(device: int) -> Stream:
    with _lock:
        stream = _legacy.get(device)
        if stream is None:
            stream = _legacy[device] = Stream(LEGACY_STREAM_ID, device, blocking=True, legacy=True)
        return stream


def create_stream(device: int, blocking: bool) -> Stream:
    touch_context(device)
    with _lock:
        stream = Stream(next(_stream_ids), device, blocking)
        _streams[stream.id] = stream
        return stream


def destroy_stream(stream: Stream) -> None:
    """As cudaStreamDestroy: the handle goes, its queued work still lands at a device synchronization."""
    with _lock:
        _streams.pop(stream.id, None)
        _orphans.append(stream)


_orphans: list[Stream] = []  # destroyed streams whose work may still be queued


def stream_by_id(stream_id: int, device: int) -> Stream:
    """The stream a handle names; 0, 1 (legacy) and 2 (per-thread, treated as legacy) are device's."""
    if stream_id in (0, LEGACY_STREAM_ID, 2):
        return legacy_stream(device)
    with _lock:
        stream = _streams.get(stream_id)
    if stream is None:
        raise FakeCudaError(INVALID_HANDLE, f"stream {stream_id:#x} does not exist")
    return stream


def _tail(stream: Stream) -> int:
    return stream.ops[-1].seq if stream.ops else stream.landed


def _implicit(stream: Stream) -> list[tuple[Stream, int]]:
    """What new work on `stream` waits for besides its own queue (the legacy stream's rules)."""
    if not stream.blocking:
        return []
    if stream.legacy:
        return [(other, _tail(other)) for other in _streams.values()
                if other.device == stream.device and other.blocking]
    legacy = legacy_stream(stream.device)
    return [(legacy, _tail(legacy))]


def enqueue(stream: Stream, run: Callable[[], None], touches: tuple[tuple[int, int], ...] = ()) -> None:
    """Queue `run` on `stream`, which reads or writes the (address, size) ranges `touches`; it runs
    when the stream is synchronized (see the module docstring)."""
    with _lock:
        stream.ops.append(_Op(next(_seq), _implicit(stream), run, touches))


def wait(waiter: Stream, producer: Stream) -> None:
    """The waiter's later work waits for the producer's work so far (cudaStreamWaitEvent)."""
    with _lock:
        waiter.ops.append(_Op(next(_seq), [(producer, _tail(producer))], _nothing, ()))


def _land(stream: Stream, until: int) -> None:
    while stream.ops and stream.ops[0].seq <= until:
        op = stream.ops.popleft()
        for other, seq in op.after:
            _land(other, seq)
        op.run()
        stream.landed = op.seq


def synchronize(stream: Stream) -> None:
    """Run the stream's queued work (and what it waits for) to its end."""
    with _lock:
        _land(stream, _tail(stream))


def synchronize_device(device: int) -> None:
    """Run every stream's queued work on `device`."""
    with _lock:
        _counters["device_syncs"] += 1
        streams = [s for s in (*_streams.values(), *_orphans) if s.device == device]
        legacy = _legacy.get(device)
        for stream in (*streams, *([legacy] if legacy is not None else [])):
            synchronize(stream)
        _orphans[:] = [s for s in _orphans if s.ops]


def _land_touching(address: int, size: int) -> None:
    for stream in (*_streams.values(), *_legacy.values(), *_orphans):
        if any(any(start < address + size and address < start + length for start, length in op.touches)
               for op in stream.ops):
            synchronize(stream)


def _pending_on(address: int, size: int) -> bool:
    for stream in (*_streams.values(), *_legacy.values(), *_orphans):
        for op in stream.ops:
            if any(start < address + size and address < start + length for start, length in op.touches):
                return True
    return False


def _nothing() -> None:
    return None


def copy_op(destination: int, source: int, size: int) -> Callable[[], None]:
    """A copy that reads its source when it lands, not when it was queued."""
    def run() -> None:
        ctypes.memmove(destination, source, size)
    return run
