"""The floor's gRPC front: HTTP/2 on ngh2 (libnghttp2, sans-I/O), as pystub's h2 stack uses it.

A gRPC call is an HTTP/2 POST to /inference.GRPCInferenceService/METHOD whose DATA is one
length-prefixed message (1 byte compressed flag, 4 bytes big-endian length, the protobuf); the
answer is HEADERS (:status 200, content-type application/grpc), DATA (one message) and trailers
(grpc-status, grpc-message). The connection's settings are pystub's (backend/frontends/grpc/h2/
connection.py: 4 MiB stream windows, 1 MiB frames); flow control is ngh2's own (automatic
WINDOW_UPDATEs), where pystub tracks what its calls consumed.

ModelInfer's request is parsed by protobuf (its C implementation), its tensors go to the model
process as they are, and the answer is written from the model link's callback. The other unary
methods perf_analyzer and tritonclient call first (metadata, config, liveness, readiness) are
answered here from compare/bare_messages.py. The floor has one model: its inputs are checked by
the model process, nothing else is (no compression, no deadlines, no metadata).
"""

from __future__ import annotations

import asyncio

import ngh2
from compare.bare_messages import MODEL, SERVICE, answer
from google.protobuf.message import DecodeError
from model_link import ModelLink
from tritonclient.grpc import service_pb2

_SETTINGS = {ngh2.Setting.INITIAL_WINDOW_SIZE: 4 << 20, ngh2.Setting.MAX_CONCURRENT_STREAMS: 1000,
             ngh2.Setting.MAX_FRAME_SIZE: 1 << 20}
_CONNECTION_WINDOW = 16 << 20
_INFER = SERVICE + "ModelInfer"
_INVALID_ARGUMENT, _NOT_FOUND, _UNIMPLEMENTED, _UNAVAILABLE = 3, 5, 12, 14
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class GrpcConnection(asyncio.Protocol):
    def __init__(self, link: ModelLink) -> None:
        self._link = link
        self._h2 = ngh2.Connection(ngh2.Role.SERVER)
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, tuple[str, bytearray]] = {}  # stream id -> (:path, body so far)

    # -- the socket ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._h2.initiate_connection(_SETTINGS)
        self._h2.set_local_window_size(_CONNECTION_WINDOW)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # answers still coming for this connection are dropped

    def data_received(self, data: bytes) -> None:
        try:
            self._h2.receive_data(data)
            for event in self._h2.events():
                self._handle(event)
        except ngh2.NGH2Error:  # the client broke the protocol: nothing more to say to it
            if self._transport is not None:
                self._transport.close()
            return
        self._flush()  # every answer this batch of events completed, in one write

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _handle(self, event: ngh2.Event) -> None:
        if isinstance(event, ngh2.RequestReceived):
            path = next((value for name, value in event.headers if name == b":path"), b"")
            self._streams[event.stream_id] = (path.decode("ascii", "replace"), bytearray())
            if event.end_stream:
                self._call(event.stream_id)
        elif isinstance(event, ngh2.DataReceived):
            if event.stream_id in self._streams:
                self._streams[event.stream_id][1].extend(event.data)
                if event.end_stream:
                    self._call(event.stream_id)
        elif isinstance(event, ngh2.TrailersReceived):
            if event.stream_id in self._streams:
                self._call(event.stream_id)
        elif isinstance(event, (ngh2.StreamReset, ngh2.StreamClosed)):
            self._streams.pop(event.stream_id, None)
        elif isinstance(event, ngh2.ConnectionClosed) and self._transport is not None:
            self._transport.close()

    # -- calls -----------------------------------------------------------------------------------------
    def _call(self, stream_id: int) -> None:
        path, body = self._streams.pop(stream_id)
        if len(body) < 5 or body[0] != 0 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
            self._fail(stream_id, _INVALID_ARGUMENT, "the floor takes one uncompressed message per call")
            return
        message = bytes(body[5:])
        if path != _INFER:
            reply = answer(path, message)  # metadata, config, liveness, readiness
            if reply is None:
                self._fail(stream_id, _UNIMPLEMENTED, f"the floor does not serve {path}")
            else:
                self._reply(stream_id, reply)
            return
        try:
            request = service_pb2.ModelInferRequest.FromString(message)
        except DecodeError as error:
            self._fail(stream_id, _INVALID_ARGUMENT, f"not a ModelInferRequest: {error}")
            return
        if request.model_name != MODEL:
            self._fail(stream_id, _NOT_FOUND, f"the floor serves {MODEL} only, not {request.model_name!r}")
            return
        if len(request.raw_input_contents) != len(request.inputs):
            self._fail(stream_id, _INVALID_ARGUMENT, "the floor takes raw_input_contents, one per input")
            return
        tensors = [[tensor.name, tensor.datatype, list(tensor.shape), data]
                   for tensor, data in zip(request.inputs, request.raw_input_contents, strict=True)]
        try:
            self._link.submit(tensors, lambda error, outputs: self._answer(stream_id, request.id, error, outputs))
        except ValueError as error:
            self._link.failed += 1
            self._fail(stream_id, _INVALID_ARGUMENT, str(error))

    def _answer(self, stream_id: int, request_id: str, error: str | None, outputs: list[list]) -> None:
        if error is not None:
            self._fail(stream_id, _UNAVAILABLE if "exited" in error else _INVALID_ARGUMENT, error)
        else:
            response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1", id=request_id)
            for name, datatype, shape, data in outputs:
                response.outputs.add(name=name, datatype=datatype, shape=shape)
                response.raw_output_contents.append(data)
            self._reply(stream_id, response.SerializeToString())
        self._flush()

    def _reply(self, stream_id: int, message: bytes) -> None:
        try:
            self._h2.send_response(stream_id, _RESPONSE_HEADERS)
            self._h2.send_data(stream_id, b"\x00" + len(message).to_bytes(4, "big") + message)
            self._h2.send_trailers(stream_id, [(b"grpc-status", b"0")])
        except ngh2.NGH2Error:  # the client reset the stream meanwhile
            pass

    def _fail(self, stream_id: int, code: int, details: str) -> None:
        """A trailers-only answer: one HEADERS frame with the status."""
        try:
            self._h2.send_response(stream_id, [*_RESPONSE_HEADERS, (b"grpc-status", str(code).encode()),
                                               (b"grpc-message", _percent(details))], end_stream=True)
        except ngh2.NGH2Error:
            pass


def _percent(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as it is, every other byte as %XX."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())
