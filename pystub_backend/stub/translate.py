"""Between wire frames and pb_utils objects, inside the stub.

Inputs become `pb_utils.Tensor`s over read-only views of the p2s arena, or of a client's shared
memory region (no copy either way); a response's outputs are written once into the s2p arena, or
straight into the client's region when the request asked for that, or exported by CUDA IPC when
a BLS caller asked for GPU outputs on their device (features.device_ipc), pruned to the outputs
the client asked for.

Requests arrive as `WireRequest`s and responses leave as `WireResponse`s (pystub_backend.ipc.records);
a request's `output_regions` is set only when some output goes to a client region.
"""

from __future__ import annotations

from typing import Any, Protocol

from pystub_backend.ipc import tensors
from pystub_backend.ipc.arena import ArenaFullError, ArenaReader, ArenaWriter
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireRequest, WireResponse, WireTensor, error_to_wire
from pystub_backend.ipc.status import Status
from pystub_backend.ipc.tensors import RegionTooSmallError
from pystub_backend.stub import device_outputs, output_buffers, pb_utils
from pystub_backend.stub.features import client_shm, cuda_regions, device_ipc
from pystub_backend.stub.pb_utils._request import SenderSource

__all__ = ["build_request", "response_to_wire", "OpenRequest"]


class OpenRequest(SenderSource, Protocol):
    """A request in flight as its `pb_utils.InferenceRequest` is built (senders.RequestState, which
    imports this module): the outputs it asked for, and the source of its sender."""

    requested: set[str]

def build_request(wire: WireRequest, reader: ArenaReader, model_name: str, model_version: int,
                  state: OpenRequest) -> Any:
    """A `pb_utils.InferenceRequest` for the wire request; its sender comes from `state` when the
    model first asks for it. Raises ValueError for a corrupt one."""
    if wire.output_regions:
        client_shm.expect_outputs(wire.rid, state, wire.output_regions)
    if wire.device_outputs is not None:  # a BLS caller that prefers its outputs on this GPU
        device_ipc.expect(wire.rid, state, wire.device_outputs)
    # BF16 arrives as its raw uint16 bits; the datatype keeps it BF16 (as_numpy refuses it, DLPack
    # exports bfloat16), as on Triton.
    inputs = [device_ipc.open_input(t) if t.handle and t.handle[0] == DEVICE_HANDLE_TAG  # a BLS GPU input
              else pb_utils.Tensor._from_array(t.name, tensors.to_array(reader, t, client_shm.REGIONS),
                                               "BF16" if t.datatype == "BF16" else None)
              for t in wire.inputs]
    return pb_utils.InferenceRequest._from_server(
        inputs=inputs, request_id=wire.id, correlation_id=wire.correlation_id, flags=wire.flags,
        timeout=wire.timeout_us, parameters_json=wire.parameters_json,
        requested_output_names=set(state.requested),
        model_name=model_name, model_version=model_version, sender_source=state,
        trace_context=wire.trace_context)


def _response_parameters(response: Any) -> str:
    parameters = response.parameters()
    return parameters if isinstance(parameters, str) else "{}"


def _place_device(rid: int, writer: ArenaWriter, name: str, datatype: str, shape: list[int],
                  buffer: device_outputs.DeviceBuffer, target: list[Any] | None) -> WireTensor:
    if target is None and device_ipc.export_device(rid) == buffer.device_id:  # stays on the GPU
        exported = device_ipc.export(name, datatype, shape, buffer)
        if exported is not None:  # else (empty, or CUDA refused): through the host, as to any caller
            return exported
    if target is not None:
        return device_outputs.place_in_region(client_shm.REGIONS, name, datatype, shape, buffer, target)
    return device_outputs.place(writer, name, datatype, shape, buffer)


def response_to_wire(rid: int, response: Any, flags: int, requested: set[str],
                     writer: ArenaWriter, budget: tensors.InlineBudget | None = None) -> WireResponse:
    """The wire response for a pb_utils response (or None for a flags-only final).

    Outputs travel inline in the frame while they are small and `budget` lasts (ipc.tensors), else
    are placed in the s2p arena, or written into the client region the request named for them.
    When the arena cannot grow (INTERNAL), or an output does not fit its region or the region
    cannot be mapped (INVALID_ARG), the already placed outputs are freed again and the response
    becomes an error carrying the text.
    """
    if response is None:  # flags only: parameters nil tells it apart from a response with no outputs
        return WireResponse(rid, flags, None, [], None)
    # The response's own fields, as Triton's C++ side reads them (the checked getters are the model's API)
    error = response._error
    if error is not None:
        wire_error = error_to_wire(error.code(), error.message())
        return WireResponse(rid, flags, wire_error, [], _response_parameters(response))
    targets = client_shm.output_targets(rid)
    outputs: list[WireTensor] = []
    try:
        for tensor in response._outputs:
            name = tensor._name
            if requested and name not in requested:
                continue
            datatype, shape, buffer = tensor._wire_payload()
            target = targets.get(name) if targets else None
            if target is not None and tensors.cuda_region_device(target) is not None:  # a client's CUDA region
                outputs.append(cuda_regions.write(name, datatype, shape, buffer, target))
            elif isinstance(buffer, device_outputs.DeviceBuffer):  # a GPU tensor: copied once, to where it goes
                outputs.append(_place_device(rid, writer, name, datatype, shape, buffer, target))
            elif target is not None:
                outputs.append(tensors.place_in_region(client_shm.REGIONS, name, datatype, shape, buffer, target))
            elif (handle := output_buffers.claim(buffer)) is not None:  # already in the arena: no copy
                outputs.append(WireTensor(name, datatype, list(shape), list(handle)))
            else:
                outputs.append(tensors.place(writer, name, datatype, shape, buffer,
                                             tensors.InlineBudget() if budget is None else budget))
    except (ArenaFullError, RegionTooSmallError, client_shm.RegionError, cuda_regions.CudaRegionError,
            device_outputs.DeviceError) as exc:
        for placed in outputs:
            if placed.handle[0] == DEVICE_HANDLE_TAG:
                device_ipc.unexport(placed.handle)
            elif placed.handle[0] != tensors.INLINE_TAG:
                writer.free(tensors.wire_handle(placed))  # region outputs carry the empty handle: a no-op
        internal = isinstance(exc, (ArenaFullError, device_outputs.DeviceError))
        status = Status.INTERNAL if internal else Status.INVALID_ARG
        return WireResponse(rid, flags, error_to_wire(status, str(exc)), [], "{}")
    return WireResponse(rid, flags, None, outputs, _response_parameters(response))
