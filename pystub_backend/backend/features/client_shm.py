"""The system shared memory extension (docs/reference/protocol.md#system-shared-memory-extension): the regions
clients registered, and the requests whose tensors live in them.

    register(name, key, offset, byte_size)   shm_open(key, O_RDWR), check offset+byte_size
                                               against the object's size, keep the fd (no mapping)
    resolve(request)        (Core, before      per input/output that names a region: check offset
                             validation)       and size; an input's data are read from the fd when
                                               first used (validation reads BYTES; a plain input
                                               is never read here: the stub maps it);
                                               the regions are held until the request ends
    attach_regions(...)     (StubProcess)      inputs travel as region handles, not copied into the
                                               arena; outputs' region handles ride on the request;
                                               the regions are held until the final response
    unregister(name | "")                      the name is gone at once (status, new requests);
                                               the mappings, ours and the stubs' (ClientShmForget),
                                               go when the last request holding the region ends
    cuda_unregister_closed(name | "")          a CUDA region's too, and answers once the stubs
                                               that opened its handle closed it (ClientShmForgotten),
                                               as Triton closes its handle before answering: the
                                               client may free its buffer then

The backend never maps a client's object (its owner may truncate it under us: SIGBUS): a
`Region` holds an fd and reads with preadv, see pystub_backend.backend.features.client_regions. A
stub does map regions, for zero-copy inputs and outputs; a stub that dies of a region shrinking
under it is restarted as any dead stub.

The server never creates, resizes or unlinks a client's object, and never uses
`multiprocessing.shared_memory` (its resource tracker unlinks segments it did not create).
Region names share one namespace with CUDA regions (`CudaRegion`: a client's CUDA IPC handle,
which only the stubs open). A server without a GPU registers no CUDA region, reports none, and
lets perf_analyzer unregister them all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.client_regions import CudaRegion, Region, ShmTensor
from pystub_backend.backend.inference import InferRequest, RequestedOutput, Tensor
from pystub_backend.devices.interface import IPC_HANDLE_SIZE
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages.client_shm import ClientShmForget, ClientShmForgotten
from pystub_backend.ipc.posix_shm import open_client_object, shm_name
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.response_stream import ResponseStream
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["ClientShmRegistry", "Region", "ShmTensor", "ShmOutput", "Lease", "attach_regions",
           "region_handle", "register", "REGION", "BYTE_SIZE", "OFFSET", "CLOSE_TIMEOUT_S"]

log = logging.getLogger("pystub.client_shm")

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
DISABLED = ("system shared memory is disabled: start pystub-backend with --allow-client-shm=true "
            "to register regions")
CLOSE_TIMEOUT_S = 30.0  # how long an unregister waits for a live stub to close a CUDA handle
_POLL_S = 0.25  # ... checking meanwhile that the stub is still alive
# (stub, generation) -> resolved when that stub closed its mappings of the registration
_closing: dict[tuple[StubProcess, int], asyncio.Future[None]] = {}


def _invalid(text: str) -> ServerError:
    return ServerError(text, Status.INVALID_ARG)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(eq=False)
class ShmOutput(RequestedOutput):
    """An output the client wants written into a region (`handle`, `byte_size` bytes)."""

    region: Region | None = None
    handle: list[Any] | None = None


class Lease:
    """The regions one request holds, and its inputs that live in them; `release()` (idempotent)
    or use as a context manager.

    Releasing also releases the inputs: the request object may outlive the request (a reference
    kept somewhere, a cycle not yet collected), and must not read a region it no longer holds.
    Touching a released input's data raises ValueError, never a crash.
    """

    __slots__ = ("_regions", "_inputs")

    def __init__(self, regions: list[Region], inputs: list[ShmTensor] | None = None) -> None:
        self._regions = regions
        self._inputs = inputs or []

    def release(self) -> None:
        inputs, self._inputs = self._inputs, []
        for tensor in inputs:
            tensor.release()
        regions, self._regions = self._regions, []
        for region in regions:
            region.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_NO_LEASE = Lease([])  # what requests without client shm get: releasing it does nothing


def _hold_all(regions: list[Region], inputs: list[ShmTensor] | None = None) -> Lease:
    if not regions:
        return _NO_LEASE
    for region in regions:
        region.hold()
    return Lease(regions, inputs)


class ClientShmRegistry:
    """The regions of this server. Runs on the event loop; nothing here blocks."""

    def __init__(self, enabled: bool, internal_prefix: str = "pystub", gpus: tuple[int, ...] = ()) -> None:
        self.enabled = enabled
        self.gpus = gpus  # the visible GPUs' ids: CUDA regions can be registered only with one
        self._internal_prefix = internal_prefix + "_"
        self._regions: dict[str, Region] = {}
        self._retiring: set[Region] = set()  # unregistered, still held by requests
        self._generations = itertools.count(1)
        self._sends: set[asyncio.Task[None]] = set()

    # -- the extension's calls --------------------------------------------------------------------
    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ServerError(DISABLED, Status.UNSUPPORTED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `key` as region `name`. Raises ServerError: ALREADY_EXISTS for a name in use,
        INVALID_ARG for a bad key, offset or size, UNSUPPORTED when the extension is off."""
        self._check_enabled()
        if not isinstance(name, str) or not name:
            raise _invalid("a shared memory region needs a non-empty name")
        if name in self._regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)
        if not isinstance(key, str) or not _is_int(offset) or not _is_int(byte_size):
            raise _invalid(f"failed to register shared memory region '{name}': 'key' must be a string, "
                           f"'offset' and 'byte_size' integers")
        if offset < 0 or byte_size < 0:
            raise _invalid(f"failed to register shared memory region '{name}': invalid args (offset {offset}, "
                           f"byte_size {byte_size} must not be negative)")
        inode, size, fd = self._open(name, key, offset, byte_size)
        self._regions[name] = Region(name, key, offset, byte_size, next(self._generations), inode, fd,
                                     self._retire)
        log.info("registered system shared memory region '%s' (key '%s', offset %d, %d bytes of %d)",
                 name, key, offset, byte_size, size)

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> tuple[int, int, int]:
        """(inode, size, fd) of the client's object, checked. Raises ServerError(INVALID_ARG)."""
        try:
            posix_name = shm_name(key)
        except ValueError:
            raise _invalid(f"Unable to open shared memory region: '{key}': not a POSIX shared memory name") from None
        if posix_name[1:].startswith(self._internal_prefix):
            raise _invalid(f"Unable to open shared memory region: '{key}': it is one of pystub's own objects")
        try:
            fd = open_client_object(posix_name, writable=True)  # shm_open: O_NOFOLLOW, never creates
        except OSError as exc:
            log.info("shared memory region '%s': opening '%s' failed: %s", name, key, exc.strerror)
            raise _invalid(f"Unable to open shared memory region: '{key}'") from None  # Triton's text
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _invalid(f"Unable to open shared memory region: '{key}': not a shared memory object")
            if offset + byte_size > info.st_size or info.st_size == 0:
                raise _invalid(f"failed to register shared memory region '{name}': invalid args (offset {offset} "
                               f"+ byte_size {byte_size} exceeds the {info.st_size} bytes of '{key}')")
        except BaseException:
            os.close(fd)
            raise
        # Kept open, never mapped (see the module docstring): reads are preadv on this fd.
        return info.st_ino, info.st_size, fd

    def unregister(self, name: str = "") -> None:
        """Forget one region, or all with `name == ""`; an unknown name is not an error (as in
        Triton). Regions in use stay mapped until their requests end. Raises ServerError
        UNSUPPORTED when the extension is off."""
        self._check_enabled()
        names = [name] if name else [n for n, r in self._regions.items() if not isinstance(r, CudaRegion)]
        self._unregister([n for n in names if not isinstance(self._regions.get(n), CudaRegion)])

    def _unregister(self, names: list[str]) -> None:
        for region_name in names:
            region = self._regions.pop(region_name, None)
            if region is None:
                continue
            region.registered = False
            log.info("unregistered system shared memory region '%s'%s", region_name,
                     f" ({region.holds} requests still use it)" if region.holds else "")
            if region.holds == 0:
                self._retire(region)
            else:
                self._retiring.add(region)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """`[{"name", "key", "offset", "byte_size"}]` of one region or all. Raises ServerError
        NOT_FOUND for an unknown name, UNSUPPORTED when the extension is off."""
        self._check_enabled()
        if not name:
            return [region.status() for region in self._regions.values() if not isinstance(region, CudaRegion)]
        region = self._regions.get(name)
        if region is None or isinstance(region, CudaRegion):
            raise ServerError(f"Unable to find system shared memory region: '{name}'", Status.NOT_FOUND)
        return [region.status()]

    # CUDA shared memory (docs/gpu.md#client-cuda-shared-memory); on a server without a GPU, as Triton
    # 2.51 built without one (docs/reference/protocol.md#compatibility-with-perf_analyzer).
    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        """`[{"name", "device_id", "byte_size"}]` of one CUDA region or all. Raises ServerError
        NOT_FOUND for an unknown name."""
        regions = {n: r for n, r in self._regions.items() if isinstance(r, CudaRegion)}
        if not name:
            return [region.status() for region in regions.values()]
        if name not in regions:
            raise ServerError(f"Unable to find cuda shared memory region: '{name}'", Status.NOT_FOUND)
        return [regions[name].status()]

    def cuda_register(self, name: str, ipc_handle: bytes = b"", device_id: int = 0, byte_size: int = 0) -> None:
        """Keep a client's CUDA IPC handle as region `name` (the stubs open it, on first use). Raises
        ServerError: INVALID_ARG without a GPU (Triton's answer), for an unknown device, a handle that
        is not a cudaIpcMemHandle_t or a bad size; ALREADY_EXISTS for a name in use; UNSUPPORTED
        when client shared memory is off."""
        if not self.gpus:
            raise ServerError("failed to register shared memory region: invalid args", Status.INVALID_ARG)
        self._check_enabled()
        if not isinstance(name, str) or not name:
            raise _invalid("a shared memory region needs a non-empty name")
        if name in self._regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)
        if not isinstance(ipc_handle, bytes) or len(ipc_handle) != IPC_HANDLE_SIZE:
            raise _invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        if not _is_int(device_id) or device_id not in self.gpus:
            raise _invalid(f"failed to register CUDA shared memory region '{name}': invalid device id {device_id} "
                           f"(visible GPUs: {', '.join(map(str, self.gpus))})")
        if not _is_int(byte_size) or byte_size < 0:
            raise _invalid(f"failed to register CUDA shared memory region '{name}': invalid byte_size {byte_size}")
        self._regions[name] = CudaRegion(name, device_id, byte_size, ipc_handle, next(self._generations),
                                         self._retire)
        log.info("registered CUDA shared memory region '%s' (device %d, %d bytes)", name, device_id, byte_size)

    def cuda_unregister(self, name: str = "") -> None:
        """Forget one CUDA region, or all of them; an unknown name is not an error (as in Triton).
        The stubs close their handles soon after; `cuda_unregister_closed` waits for that."""
        names = [name] if name else [n for n, r in self._regions.items() if isinstance(r, CudaRegion)]
        self._unregister([n for n in names if isinstance(self._regions.get(n), CudaRegion)])

    async def cuda_unregister_closed(self, name: str = "", timeout: float = CLOSE_TIMEOUT_S) -> None:
        """`cuda_unregister`, returning once every live stub that opened a retired region's handle
        has closed it (a region requests still use closes when the last of them ends)."""
        before = set(_closing)
        self.cuda_unregister(name)
        waits = [(key, future) for key, future in _closing.items() if key not in before]
        deadline = asyncio.get_running_loop().time() + timeout
        for key, future in waits:
            stub = key[0]
            while not future.done() and stub.alive:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    log.warning("stub '%s' did not close a CUDA shared memory handle within %.0f s",
                                stub.instance_name, timeout)
                    break
                await asyncio.wait([future], timeout=min(_POLL_S, left))
            if not future.done():  # dead, or too slow: nobody waits for its answer any more
                _closing.pop(key, None)
                future.cancel()

    # -- requests ---------------------------------------------------------------------------------
    def resolve(self, request: InferRequest) -> Lease:
        """Swap the request's shm inputs and outputs for ShmTensor/ShmOutput and hold their regions.

        Call before validation: an input's data are read from the region on first use, its byte
        sizes are checked against `shared_memory_byte_size`. Release the lease when the request
        ends. Raises ServerError(INVALID_ARG) for unknown regions and bad offsets or sizes.
        """
        used: list[Region] = []
        inputs: list[ShmTensor] = []
        for index, tensor in enumerate(request.inputs):
            if REGION in tensor.parameters:
                region, offset, size = self._reference(tensor.parameters, "input", tensor.name)
                request.inputs[index] = shm_input = ShmTensor(tensor, region, offset, size)
                inputs.append(shm_input)
                used.append(region)
        for index, output in enumerate(request.outputs):
            if REGION in output.parameters:
                region, offset, size = self._reference(output.parameters, "output", output.name)
                request.outputs[index] = ShmOutput(output.name, output.parameters, region=region,
                                                   handle=region.handle(offset, size))
                used.append(region)
        return _hold_all(used, inputs)

    def _reference(self, parameters: dict[str, Any], kind: str, tensor: str) -> tuple[Region, int, int]:
        name = parameters[REGION]
        size = parameters.get(BYTE_SIZE)
        offset = parameters.get(OFFSET, 0)
        if not isinstance(name, str):
            raise _invalid(f"'{REGION}' of {kind} '{tensor}' must be a string")
        if size is None:
            raise _invalid(f"{kind} '{tensor}' names shared memory region '{name}' but has no '{BYTE_SIZE}'")
        if not _is_int(size) or size < 0 or not _is_int(offset) or offset < 0:
            raise _invalid(f"'{BYTE_SIZE}' and '{OFFSET}' of {kind} '{tensor}' must be non-negative integers")
        region = self._regions.get(name)
        if region is None:
            raise _invalid(f"Unable to find shared memory region: '{name}'"
                           + ("" if self.enabled else f" ({DISABLED})"))
        if offset + size > region.byte_size:
            raise _invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, offset, size

    # -- retiring ---------------------------------------------------------------------------------
    def _retire(self, region: Region) -> None:
        """Unregistered and unused: unmap it here and tell the stubs that mapped it (a CUDA
        region's: noted, to wait for their answers)."""
        self._retiring.discard(region)
        region.unmap()
        forget = ClientShmForget([region.generation])
        for key in [key for key in _closing if not key[0].alive]:  # dead stubs never answer
            _closing.pop(key).cancel()
        for stub in list(region.stubs):
            if stub.alive:
                if isinstance(region, CudaRegion):
                    _closing[(stub, region.generation)] = asyncio.get_event_loop().create_future()
                task = asyncio.ensure_future(self._send(stub, forget))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)

    @staticmethod
    async def _send(stub: StubProcess, forget: ClientShmForget) -> None:
        try:
            await stub.send(forget)
        except (ChannelClosedError, ChannelTimeoutError) as exc:
            log.debug("stub '%s' did not take CLIENT_SHM_FORGET: %s", stub.instance_name, exc)
            _closed(stub, forget.generations)

    def close(self) -> None:
        """Unmap everything (at shutdown, after the stubs stopped); never unlinks."""
        for region in [*self._regions.values(), *self._retiring]:
            region.registered = False
            region.unmap()
        self._regions.clear()
        self._retiring.clear()


# -- used by StubProcess._place_request ----------------------------------------------------------------
def region_handle(tensor: Tensor) -> list[Any] | None:
    """The region handle of an input that lives in a client region, else None."""
    return tensor.handle if isinstance(tensor, ShmTensor) else None


def attach_regions(request: InferRequest, stub: StubProcess, stream: ResponseStream) -> dict[str, list[Any]]:
    """Hold the request's regions until its stream is final (the stub reads and writes them until
    then) and note that `stub` maps them. Returns {output name: region handle} for the wire."""
    regions = [t.region for t in request.inputs if isinstance(t, ShmTensor) and t.region is not None]
    outputs: dict[str, list[Any]] = {}
    for output in request.outputs:
        if isinstance(output, ShmOutput) and output.region is not None and output.handle is not None:
            regions.append(output.region)
            outputs[output.name] = output.handle
    if regions:
        for region in regions:
            region.stubs.add(stub)
        lease = _hold_all(regions)
        stream.when_final(lambda _: lease.release())
    return outputs


# -- the stubs' answers ------------------------------------------------------------------------------
def _closed(stub: StubProcess, generations: list[int]) -> None:
    for generation in generations:
        future = _closing.pop((stub, generation), None)
        if future is not None and not future.done():
            future.set_result(None)


def _on_forgotten(stub: StubProcess, message: ClientShmForgotten) -> None:
    _closed(stub, message.generations)


def register(handlers: BackendHandlers) -> None:
    """The stubs' answers to ClientShmForget: their mappings of those registrations are closed."""
    handlers.on_frame(ClientShmForgotten, _on_forgotten)
