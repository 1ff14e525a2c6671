"""Between wire frames and pb_utils objects, inside the stub.

Inputs become `pb_utils.Tensor`s over read-only views of the p2s arena (no copy); a response's
outputs are written once into the s2p arena, pruned to the outputs the client asked for.
"""

from __future__ import annotations

from typing import Any

from ipc import tensors
from ipc.arena import ArenaFullError, ArenaReader, ArenaWriter
from ipc.status import Status
from pystub import pb_utils

__all__ = ["build_request", "response_to_wire", "error_to_wire"]

MAX_ERROR_CHARS = 32 * 1024  # frames are small; a model's error text is cut to fit


def error_to_wire(code: int, message: str) -> list[Any]:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "... [truncated]"
    return [int(code), message]


def build_request(wire: list[Any], reader: ArenaReader, model_name: str, model_version: int,
                  sender: Any) -> Any:
    """A `pb_utils.InferenceRequest` for the wire request. Raises ValueError for a corrupt one."""
    _rid, request_id, wire_inputs, requested, parameters_json, correlation_id, flags, timeout = wire
    inputs = [pb_utils.Tensor._from_array(t[0], tensors.to_array(reader, t)) for t in wire_inputs]
    return pb_utils.InferenceRequest._from_server(
        inputs=inputs, request_id=request_id, correlation_id=correlation_id, flags=flags,
        timeout=timeout, parameters_json=parameters_json, requested_output_names=set(requested),
        model_name=model_name, model_version=model_version, response_sender=sender)


def _response_parameters(response: Any) -> str:
    parameters = response.parameters()
    return parameters if isinstance(parameters, str) else "{}"


def response_to_wire(rid: int, response: Any, flags: int, requested: set[str],
                     writer: ArenaWriter) -> list[Any]:
    """The wire response for a pb_utils response (or None for a flags-only final).

    Outputs are placed in the s2p arena; when the arena cannot grow, the already placed outputs
    are freed again and the response becomes an INTERNAL error carrying the text.
    """
    if response is None:  # flags only: parameters nil tells it apart from a response with no outputs
        return [rid, flags, None, [], None]
    if response.has_error():
        error = response.error()
        return [rid, flags, error_to_wire(error.code(), error.message()), [], _response_parameters(response)]
    outputs: list[Any] = []
    try:
        for tensor in response.output_tensors():
            if requested and tensor.name() not in requested:
                continue
            datatype, shape, buffer = tensor._wire_payload()
            outputs.append(tensors.place(writer, tensor.name(), datatype, shape, buffer))
    except ArenaFullError as exc:
        for placed in outputs:
            writer.free(tensors.wire_handle(placed))
        return [rid, flags, error_to_wire(Status.INTERNAL, str(exc)), [], "{}"]
    return [rid, flags, None, outputs, _response_parameters(response)]
