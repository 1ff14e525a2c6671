"""Client system shared memory inside the stub (docs/reference/protocol.md#system-shared-memory-extension).

Inputs a client put in a registered region reach the model as views of the region itself (no
copy anywhere); outputs the client asked for in a region are written straight into it.

    region handle (pystub_backend.ipc.tensors) ──▶ ClientRegions.view ──▶ memoryview of this stub's mapping
        inputs:  a read-only mapping (a model cannot write into the client's data)
        outputs: a writable mapping, used by translate.response_to_wire

Mappings are cached per registration (`generation`), since mapping and faulting in a large region
again for every request would cost as much as copying it. The backend sends ClientShmForget once a
region is unregistered and no request uses it any more: the cached mappings are dropped (an array
a model still holds keeps its pages mapped until it is collected) and later references to that
generation are refused, so the stub never maps a client's object after it was unregistered.

The objects are opened with `shm_open` (pystub_backend.ipc.posix_shm) + `mmap`, never
`multiprocessing.shared_memory` (whose resource tracker unlinks what it did not create). Nothing here creates or
unlinks anything.

Which outputs go to a region is per request: `expect_outputs` records them under the request id
for as long as the request's response sender lives (decoupled models send after `execute`).
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import weakref
from typing import Any

from pystub_backend.devices.interface import DeviceError
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages.client_shm import ClientShmForget, ClientShmForgotten
from pystub_backend.ipc.posix_shm import open_client_object
from pystub_backend.ipc.tensors import cuda_region_device
from pystub_backend.stub.features import cuda_regions
from pystub_backend.stub.handlers import StubHandlers

__all__ = ["ClientRegions", "RegionError", "REGIONS", "expect_outputs", "output_targets", "register"]


class RegionError(ValueError):
    """A region handle that cannot be served; the message names the region's key."""


def _open(key: str, inode: int, writable: bool) -> mmap.mmap:
    try:
        fd = open_client_object(key, writable)  # shm_open: O_NOFOLLOW, never creates
    except ValueError:
        raise RegionError(f"invalid shared memory key '{key}'") from None
    except OSError as exc:
        raise RegionError(f"Unable to open shared memory region: '{key}': {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != inode:
            raise RegionError(f"shared memory region '{key}' was replaced after it was registered")
        if info.st_size == 0:
            raise RegionError(f"shared memory region '{key}' is empty")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, prot)
    except OSError as exc:
        raise RegionError(f"cannot map shared memory region '{key}': {exc}") from None
    finally:
        os.close(fd)


class ClientRegions:
    """This stub's mappings of client regions, by (generation, writable). Thread-safe: the main
    thread, response senders on model threads and the receiver thread (forget) all use it."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, bool], mmap.mmap] = {}
        self._forgotten: set[int] = set()
        self._lock = threading.Lock()

    def view(self, handle: list[Any], writable: bool = False) -> memoryview:
        """The bytes a region handle names (a host copy for a CUDA region's input). Raises RegionError."""
        if cuda_region_device(handle) is not None:
            if writable:  # outputs to CUDA regions go through cuda_regions.write
                raise RegionError("a CUDA shared memory region has no host view")
            try:
                return cuda_regions.read(handle)
            except DeviceError as exc:
                raise RegionError(str(exc)) from None
        generation, offset, nbytes, key, inode = handle
        with self._lock:
            if generation in self._forgotten:
                raise RegionError(f"shared memory region '{key}' was unregistered")
            mapping = self._maps.get((generation, writable))
            if mapping is None:
                mapping = self._maps[(generation, writable)] = _open(key, inode, writable)
        if offset < 0 or nbytes < 0 or offset + nbytes > len(mapping):
            raise RegionError(f"bytes [{offset}, {offset + nbytes}) lie outside shared memory region '{key}' "
                              f"of {len(mapping)} bytes")
        # The owner may have truncated the object since we mapped it: touching a page past its end
        # is SIGBUS. mmap.size() is an fstat of the mapping's own fd; this catches a region that
        # shrank before the request (INVALID_ARG). One that shrinks while the model reads it can
        # still kill this stub, which the backend then restarts; the backend itself never maps it.
        size = mapping.size()
        if offset + nbytes > size:
            raise RegionError(f"shared memory region '{key}' is {size} bytes now, shorter than the "
                              f"{offset + nbytes} bytes the request uses: it was truncated")
        return memoryview(mapping)[offset : offset + nbytes]

    def forget(self, generations: list[int]) -> None:
        with self._lock:
            self._forgotten.update(generations)
            dropped = [self._maps.pop(k) for k in list(self._maps) if k[0] in self._forgotten]
        for mapping in dropped:
            _close(mapping)

    @property
    def mapped(self) -> int:
        return len(self._maps)

    def close(self) -> None:
        with self._lock:
            dropped, self._maps = list(self._maps.values()), {}
        for mapping in dropped:
            _close(mapping)


def _close(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        pass  # a model still holds a view: the mapping goes when the last view is collected


REGIONS = ClientRegions()

# request id -> (registration token, {output name: region handle}), while the request's sender lives.
_OUTPUTS: dict[int, tuple[object, dict[str, list[Any]]]] = {}


def expect_outputs(rid: int, owner: Any, targets: dict[str, list[Any]]) -> None:
    """Remember where request `rid` wants outputs written, until `owner` (the request's state,
    which its request and its sender hold) is collected.

    A request that runs again under the same rid with a new owner must not lose its registration
    when the old owner is collected: the token keeps the old owner's collection from dropping it.
    """
    token = object()
    _OUTPUTS[rid] = (token, targets)
    if owner is not None:
        weakref.finalize(owner, _forget_outputs, rid, token).atexit = False


def _forget_outputs(rid: int, token: object) -> None:
    entry = _OUTPUTS.get(rid)
    if entry is not None and entry[0] is token:
        del _OUTPUTS[rid]


def output_targets(rid: int) -> dict[str, list[Any]] | None:
    entry = _OUTPUTS.get(rid)
    return None if entry is None else entry[1]


def _on_forget(stub: Any, message: ClientShmForget) -> None:  # noqa: ANN401 - the stub
    # Off the receiver thread: closing CUDA handles and answering are not its work to wait on.
    threading.Thread(target=_forget_and_answer, args=(stub, message.generations), name="pystub-shm-forget",
                     daemon=True).start()


def _forget_and_answer(stub: Any, generations: list[int]) -> None:  # noqa: ANN401
    REGIONS.forget(generations)
    try:
        cuda_regions.forget(generations)
    finally:  # the backend answers the client's unregister once this arrives
        try:
            stub.send(ClientShmForgotten(generations))
        except (ChannelClosedError, ChannelTimeoutError, OSError):
            pass  # the backend is gone or stuck: nobody waits for the answer


def register(handlers: StubHandlers) -> None:
    """Wire client shared memory into a stub: drop mappings of registrations that are gone."""
    handlers.on_receiver(ClientShmForget, _on_forget)
