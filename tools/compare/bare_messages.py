"""The KServe v2 gRPC messages every bare gRPC candidate answers (compare/bare.py, bare_h2.py).

One place for what a candidate does per call, so the candidates differ only in how the call reaches
it: parse the request message, echo INPUT0 as OUTPUT0 (ModelInfer), or answer what perf_analyzer
asks before it starts (model metadata and config, liveness, readiness). `UNARY` maps each method's
HTTP/2 path to its request type and handler, for the servers that see raw gRPC frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2, service_pb2

MODEL = "identity_fp32"
METADATA: dict[str, Any] = {
    "name": MODEL, "versions": ["1"], "platform": "python",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
CONFIG: dict[str, Any] = {
    "name": MODEL, "backend": "python", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
SERVICE = "/inference.GRPCInferenceService/"


def infer(request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
    tensor = request.inputs[0]
    response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=tensor.shape)
    response.raw_output_contents.append(request.raw_input_contents[0])
    return response


def metadata(request: service_pb2.ModelMetadataRequest) -> service_pb2.ModelMetadataResponse:
    tensors = {k: [service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in METADATA[k]]
               for k in ("inputs", "outputs")}
    return service_pb2.ModelMetadataResponse(name=MODEL, versions=["1"], platform="python", **tensors)


def config(request: service_pb2.ModelConfigRequest) -> service_pb2.ModelConfigResponse:
    fp32 = model_config_pb2.TYPE_FP32
    model = model_config_pb2.ModelConfig(
        name=MODEL, backend="python", max_batch_size=8,
        input=[model_config_pb2.ModelInput(name=t["name"], data_type=fp32, dims=[-1]) for t in CONFIG["input"]],
        output=[model_config_pb2.ModelOutput(name=t["name"], data_type=fp32, dims=[-1]) for t in CONFIG["output"]])
    return service_pb2.ModelConfigResponse(config=model)


def server_live(request: service_pb2.ServerLiveRequest) -> service_pb2.ServerLiveResponse:
    return service_pb2.ServerLiveResponse(live=True)


def server_ready(request: service_pb2.ServerReadyRequest) -> service_pb2.ServerReadyResponse:
    return service_pb2.ServerReadyResponse(ready=True)


def model_ready(request: service_pb2.ModelReadyRequest) -> service_pb2.ModelReadyResponse:
    return service_pb2.ModelReadyResponse(ready=True)


def server_metadata(request: service_pb2.ServerMetadataRequest) -> service_pb2.ServerMetadataResponse:
    return service_pb2.ServerMetadataResponse(name="bare", version="0")


Handler = Callable[[Any], Message]
# method name -> (request type, handler, response type)
METHODS: dict[str, tuple[type[Message], Handler, type[Message]]] = {
    "ModelInfer": (service_pb2.ModelInferRequest, infer, service_pb2.ModelInferResponse),
    "ModelMetadata": (service_pb2.ModelMetadataRequest, metadata, service_pb2.ModelMetadataResponse),
    "ModelConfig": (service_pb2.ModelConfigRequest, config, service_pb2.ModelConfigResponse),
    "ServerLive": (service_pb2.ServerLiveRequest, server_live, service_pb2.ServerLiveResponse),
    "ServerReady": (service_pb2.ServerReadyRequest, server_ready, service_pb2.ServerReadyResponse),
    "ModelReady": (service_pb2.ModelReadyRequest, model_ready, service_pb2.ModelReadyResponse),
    "ServerMetadata": (service_pb2.ServerMetadataRequest, server_metadata, service_pb2.ServerMetadataResponse),
}
UNARY: dict[str, tuple[type[Message], Handler]] = {
    SERVICE + name: (request_type, handler) for name, (request_type, handler, _) in METHODS.items()}


def answer(path: str, message: bytes) -> bytes | None:
    """The serialised response to one unary call on `path`, or None for a method not served."""
    entry = UNARY.get(path)
    if entry is None:
        return None
    request_type, handler = entry
    return handler(request_type.FromString(message)).SerializeToString()
