"""Fuzzing in process: the HTTP and gRPC inference decoders, request validation, the
EXECUTE frame a request becomes, and the ipc frame decoder.

The property, for every generated input: it is either accepted all the way to an encodable EXECUTE
frame, or refused with `ServerError(INVALID_ARG)` (an unknown `Content-Encoding`: UNSUPPORTED) /
`MessageDecodeError` — never any other exception. Requests generated as valid must be accepted.
The cases come from `fuzz_cases` (valid, mutated and junk); `tools/fuzz.py` runs the same
targets with many more examples.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from fuzz_cases import (
    IDENTITY_2D_CONFIG,
    MODELS,
    GrpcCase,
    HttpCase,
    grpc_bytes,
    grpc_request,
    http_case,
    ipc_frame,
    scaled,
)
from google.protobuf.message import DecodeError
from harness import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from pystub_backend.backend.config.model_config import (
    config_to_json,
    load_config_file,
    model_metadata,
    normalize,
    parse_config_text,
)
from pystub_backend.backend.config.sequence_controls import sequence_fields
from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.features.client_shm import ClientShmRegistry
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.frontends.grpc import codec as grpc_codec
from pystub_backend.backend.frontends.http.codec import decode_infer_request, parse_header_length
from pystub_backend.backend.frontends.http.compression import decompress_body
from pystub_backend.backend.frontends.http.raw import decode_raw_request, raw_input_spec
from pystub_backend.backend.models.validation import validate_request
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.ipc.arena import ArenaReader
from pystub_backend.ipc.bytes_codec import deserialize_bytes
from pystub_backend.ipc.channel import make_pair
from pystub_backend.ipc.dtypes import numpy_dtype
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.wire import registered_kinds

LIMIT = 1 << 20  # the decompressed-body limit these tests decode under
SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
CONFIGS = {name: normalize(load_config_file(EXAMPLES / name / "config.pbtxt"), name) for name in MODELS
           if (EXAMPLES / name).is_dir()}
CONFIGS["identity_2d"] = normalize(parse_config_text(IDENTITY_2D_CONFIG, "identity_2d"), "identity_2d")


class _FakeArena:
    """Stands in for the p2s arena: the handle a tensor would get, nothing stored (the arena is not
    what these tests fuzz; the frame that carries the handles is)."""

    def write(self, data: Any) -> tuple[int, int, int]:
        return (0, 0, memoryview(data).nbytes)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubProcess]:
    loop = asyncio.new_event_loop()

    async def make() -> StubProcess:
        process = StubProcess("fuzz_0_0", StubSettings(), "fuzz", feature_services(None))
        process.p2s = _FakeArena()  # type: ignore[assignment]
        process.s2p = ArenaReader(process.base, "s2p")
        process.open_link(backend_end)  # nothing is sent over it: the frames are only built
        return process

    backend_end, stub_end = make_pair()
    process = loop.run_until_complete(make())
    yield process
    assert process.link is not None and process.s2p is not None
    process.link.close()
    process.s2p.close()
    stub_end.close()
    loop.close()


def _to_stub(stub: StubProcess, request: Any, model: str) -> bytes:
    """Validate the request as the core does and build the EXECUTE frame it would travel in.
    Raises ServerError."""
    registry = ClientShmRegistry(enabled=False)
    with registry.resolve(request):
        validate_request(request, CONFIGS[model])
        fields = sequence_fields(request.parameters)  # what the sequence batcher puts on the wire
        request.correlation_id, request.flags = fields.correlation_id, fields.flags
        assert stub.exchange is not None
        wire = stub.exchange.place_request(request).wire
        frame = msg.encode(msg.Execute(1, [wire], []))
    for tensor in request.inputs:  # the stub views each input as pystub_backend.ipc.tensors.to_array does
        _view_as_the_stub_does(tensor)
    return frame


def _view_as_the_stub_does(tensor: Any) -> None:
    shape = list(tensor.shape)
    if tensor.datatype == "BYTES":
        deserialize_bytes(tensor.data, math.prod(shape)).reshape(shape)
    else:
        np.frombuffer(tensor.data, dtype="<u2" if tensor.datatype == "BF16" else numpy_dtype(tensor.datatype)
                      ).reshape(shape)


def _refused(error: ServerError, allowed: tuple[Status, ...] = (Status.INVALID_ARG,)) -> None:
    assert error.status in allowed, f"refused with {error.status.name}, not INVALID_ARG: {error.message}"
    assert error.message, "a refusal must say why"


def _decode_http(case: HttpCase) -> Any:
    body = decompress_body(bytearray(case.body), case.encoding, LIMIT)
    length = parse_header_length(case.header_length, len(body))
    if length == 0:
        config = CONFIGS[case.model]
        spec = raw_input_spec(model_metadata(config, ["1"]), config_to_json(config))
        return decode_raw_request(body, spec, case.model).request
    return decode_infer_request(body, length, case.model).request


@settings(max_examples=scaled(600), **SETTINGS)  # ~8 ms of CPU each: inside the 120 s per-test timeout at load 30
@given(case=http_case())
def test_http_bodies_are_accepted_or_refused_cleanly(stub: StubProcess, case: HttpCase) -> None:
    try:
        frame = _to_stub(stub, _decode_http(case), case.model)
    except ServerError as error:
        assert case.kind != "valid", f"a valid request was refused: {error.message}"
        statuses = (Status.INVALID_ARG, Status.UNSUPPORTED) if case.encoding else (Status.INVALID_ARG,)
        _refused(error, statuses)
        return
    assert msg.decode(frame).requests  # what the stub would receive decodes again


def _grpc_to_stub(stub: StubProcess, request: service_pb2.ModelInferRequest) -> None:
    """Decode a gRPC request and send it to the stub, as one of the models it serves (an unknown
    model name would only be refused by the lookup). Raises ServerError when refused."""
    model = request.model_name if request.model_name in MODELS else "identity_fp32"
    decoded = grpc_codec.decode_infer_request(request)
    decoded.model_name = model
    _to_stub(stub, decoded, model)


@settings(max_examples=scaled(800), **SETTINGS)
@given(case=grpc_request())
def test_grpc_requests_are_accepted_or_refused_cleanly(stub: StubProcess, case: GrpcCase) -> None:
    try:
        _grpc_to_stub(stub, case.request)
    except ServerError as error:
        assert case.kind != "valid", f"a valid request was refused: {error.message}\n{case.request}"
        _refused(error)


@settings(max_examples=scaled(600), **SETTINGS)
@given(data=grpc_bytes())
def test_grpc_wire_bytes_are_refused_cleanly(stub: StubProcess, data: bytes) -> None:
    try:
        request = service_pb2.ModelInferRequest.FromString(data)
    except DecodeError:
        return  # grpcio answers this itself (UNKNOWN, "Error parsing message") before our code runs
    try:
        _grpc_to_stub(stub, request)
    except ServerError as error:
        _refused(error)


_KINDS = tuple(sorted(registered_kinds()))
_ARITIES = {kind: len(cls._fields) for kind, cls in registered_kinds().items()}


@settings(max_examples=scaled(500), **SETTINGS)
@given(frame=ipc_frame(_KINDS, _ARITIES))
def test_corrupt_frames_are_rejected_by_the_decoder(frame: bytes) -> None:
    try:
        message = msg.decode(frame)
    except msg.MessageDecodeError as error:
        assert str(error)
        return
    # Accepted: a registered message whose fields have the declared shapes (the fuzzer found a
    # well-formed frame, which the receiver may act on).
    assert type(message) in registered_kinds().values()
    encoded = msg.encode(message)
    assert msg.encode(msg.decode(encoded)) == encoded  # bytes, not values: NaN != NaN


@settings(max_examples=scaled(300), **SETTINGS)
@given(payload=st.binary(max_size=200), encoding=st.sampled_from(["gzip", "deflate", "x-gzip", "identity", "br"]),
       expand=st.integers(0, 3 * LIMIT))
def test_compressed_bodies_are_bounded(payload: bytes, encoding: str, expand: int) -> None:
    import gzip
    import zlib

    bodies = [payload, gzip.compress(payload + bytes(expand)), zlib.compress(payload + bytes(expand))]
    for body in bodies:
        try:
            result = decompress_body(bytearray(body), encoding, LIMIT)
        except ServerError as error:
            _refused(error, (Status.INVALID_ARG, Status.UNSUPPORTED))
            continue
        assert len(result) <= LIMIT


def test_the_frame_decoder_checks_field_types() -> None:
    """The decoder rejects a known kind whose fields have the wrong types (what the fuzzer
    relies on to keep garbage away from the handlers)."""
    for fields in ([5, "1", [], []], [8, [[0, 0, 1]], 7], [7, "not a list"], [9, 0, 1, "f", 1]):
        with pytest.raises(msg.MessageDecodeError, match="field"):
            msg.decode(msgpack.packb(fields))
    assert msg.decode(msgpack.packb([8, [[0, 0, 1]], [3]])) == msg.Release([[0, 0, 1]], [3])
    assert msg.decode(msgpack.packb([33, 1, None, 2])) is not None  # an int where a float is declared
