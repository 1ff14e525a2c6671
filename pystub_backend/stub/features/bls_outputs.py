"""BLS responses inside the stub: outputs that view the p2s arena, and the cleanup frames that give
that memory back.

The backend writes a BLS call's outputs into this stub's p2s arena; the model gets numpy arrays
that view those bytes (no copy). Each numeric output is a `_Lease`: the arrays' memory owner, so
numpy's base chain of every array derived from it ends there, and a `weakref.finalize` on it runs
when the last of them is gone. The finalizer only queues the handle: `Cleanup` sends the queued
handles (and decoupled calls' credits and cancels) from a thread of its own, because finalizers
run wherever the garbage collector happens to run (the receiver thread included) and must never
block on the channel.

BYTES outputs are decoded into object arrays (a copy, the form models expect), so their bytes are
given back at once. A small output (at most `tensors.INLINE_BYTES`) travels inline in the response
frame: its array views the frame's bytes, and nothing is leased or given back.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pystub_backend.devices.interface import DeviceError
from pystub_backend.ipc import tensors
from pystub_backend.ipc.arena import ArenaReader
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.dtypes import numpy_dtype
from pystub_backend.ipc.messages.bls import BlsCancel, BlsCleanup, DeviceCleanup
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireResponse, WireTensor
from pystub_backend.ipc.status import Status
from pystub_backend.stub import pb_utils
from pystub_backend.stub.features import device_ipc

__all__ = ["Cleanup", "response_from_wire", "error_response"]

_CHUNK = 2048  # entries per frame: frames stay far below the frame limit


class _Lease:
    """Owns the memory of one output: numpy reads `__array_interface__`, the view keeps it mapped."""

    __slots__ = ("__array_interface__", "_view", "__weakref__")

    def __init__(self, view: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        address = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
        self._view = view
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (address, True), "version": 3}


class Cleanup:
    """Queues p2s handles, credits and cancels; a daemon thread sends them as BlsCleanup/BlsCancel."""

    def __init__(self, send: Callable[[Any], None]) -> None:
        self._send = send
        # Reentrant: a finalizer may run (garbage collection) while this thread holds the lock.
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._handles: list[list[int]] = []
        self._credits: list[int] = []
        self._cancels: list[int] = []
        self._claims: list[int] = []  # GPU outputs by CUDA IPC whose mapping was closed
        self._thread: threading.Thread | None = None
        self._closed = False
        self.leased = 0  # outputs whose memory the model still holds (diagnostics)

    def release(self, handle: list[int]) -> None:
        self._queue(self._handles, handle)

    def lease_ended(self, handle: list[int]) -> None:
        with self._lock:
            self.leased -= 1
        self.release(handle)

    def release_claim(self, claim_id: int) -> None:
        self._queue(self._claims, claim_id)

    def release_output(self, wire_tensor: WireTensor) -> None:
        """Give back an output the model never saw: its p2s bytes, or its claim on a GPU export."""
        handle = wire_tensor[3]
        if handle[0] == DEVICE_HANDLE_TAG:
            self.release_claim(handle[2])
        elif handle[0] >= 0:
            self.release(handle)

    def credit(self, call_id: int) -> None:
        self._queue(self._credits, call_id)

    def cancel(self, call_id: int) -> None:
        self._queue(self._cancels, call_id)

    def _queue(self, items: list[Any], item: Any) -> None:
        with self._lock:
            if self._closed:
                return
            items.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pystub-bls-cleanup", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                handles, self._handles = self._handles, []
                credits, self._credits = self._credits, []
                cancels, self._cancels = self._cancels, []
                claims, self._claims = self._claims, []
            try:
                for start in range(0, len(claims), _CHUNK):
                    self._send(DeviceCleanup(claims[start:start + _CHUNK]))
                if cancels:
                    self._send(BlsCancel(cancels))
                for start in range(0, max(len(handles), len(credits)), _CHUNK):
                    self._send(BlsCleanup(handles[start:start + _CHUNK], credits[start:start + _CHUNK]))
            except (ChannelClosedError, ChannelTimeoutError, OSError):
                with self._lock:  # the backend is gone or stuck: nobody to give memory back to
                    self._closed = True
                return

    def lease(self, reader: ArenaReader, wire_tensor: WireTensor) -> np.ndarray:
        """A read-only array viewing the output's p2s bytes; they go back when it is collected."""
        name, datatype, shape, handle = wire_tensor
        dtype = np.dtype("<u2") if datatype == "BF16" else np.dtype(numpy_dtype(datatype))
        view = reader.view(handle)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dtype.itemsize != view.nbytes:
            self.release(handle)
            raise ValueError(f"output '{name}' holds {view.nbytes} bytes, its shape {shape} needs "
                             f"{count * dtype.itemsize}")
        owner = _Lease(view, dtype, tuple(int(d) for d in shape))
        with self._lock:
            self.leased += 1
        weakref.finalize(owner, self.lease_ended, list(handle)).atexit = False
        return np.asarray(owner)


def _output(cleanup: Cleanup, reader: ArenaReader, wire_tensor: WireTensor, device: int | None) -> Any:
    name, datatype, shape, handle = wire_tensor
    if handle[0] == DEVICE_HANDLE_TAG:  # the target's GPU memory, mapped here (no copy)
        return device_ipc.open_output(wire_tensor, cleanup.release_claim)
    tensor = _host_output(cleanup, reader, wire_tensor)
    return tensor if device is None else device_ipc.to_device(tensor, device)


def _host_output(cleanup: Cleanup, reader: ArenaReader, wire_tensor: WireTensor) -> Any:
    name, datatype, shape, handle = wire_tensor
    if handle[0] == tensors.INLINE_TAG:  # a small output's bytes, in the frame: nothing to give back
        array = tensors.to_array(reader, wire_tensor)
    elif handle[0] < 0:  # empty tensor: nothing stored
        dtype = np.object_ if datatype == "BYTES" else ("<u2" if datatype == "BF16" else numpy_dtype(datatype))
        array = np.empty(shape, dtype=dtype)
    elif datatype == "BYTES":
        try:
            array = tensors.to_array(reader, wire_tensor)  # decoded: a copy
        finally:
            cleanup.release(handle)
    else:
        array = cleanup.lease(reader, wire_tensor)
    return pb_utils.Tensor._from_array(name, array, "BF16" if datatype == "BF16" else None)


def error_response(code: int, message: str) -> Any:
    return pb_utils.InferenceResponse._create([], pb_utils.TritonError(message, Status.coerce(code)))


def response_from_wire(cleanup: Cleanup, reader: ArenaReader, wire: WireResponse,
                       device: int | None = None) -> Any | None:
    """The pb_utils response of a wire response, or None for a flags-only final. `device`: the GPU
    the caller prefers its outputs on (host outputs are copied there), None for the CPU."""
    _, _, error, outputs, parameters_json = wire
    if parameters_json is None:
        return None
    if error is not None:
        return pb_utils.InferenceResponse._create([], pb_utils.TritonError(error[1], Status.coerce(error[0])),
                                                  parameters_json or "{}")
    tensors_out: list[Any] = []
    try:
        for wire_tensor in outputs:
            tensors_out.append(_output(cleanup, reader, wire_tensor, device))
    except (ValueError, OSError, DeviceError) as exc:
        for wire_tensor in outputs[len(tensors_out) + 1:]:  # the failed one released its own handle
            cleanup.release_output(wire_tensor)
        text = str(exc) if isinstance(exc, DeviceError) else f"corrupt BLS output: {exc}"
        return error_response(Status.INTERNAL, text)
    return pb_utils.InferenceResponse._create(tensors_out, None, parameters_json or "{}")
