"""Hypothesis strategies for fuzzing the frontends: KServe v2 JSON bodies (with the binary tensor
extension), gRPC `ModelInferRequest`s, and ipc frames. Shared by the in-process fuzz tests, the
fuzz tests against a real server and `tools/fuzz.py`.

Each strategy mixes three kinds of cases, so that the fuzzer reaches deep into the server as well
as probing its edges:
    valid     a request the model accepts (right names, datatypes, shapes and data)
    mutated   a valid request with one or two things broken (a shape, a size, a type, a name...)
    edge      a valid request with one value at or beyond a limit of the wire (uint64/int64
              parameters and dims, lone surrogates in strings)
    junk      anything the schema allows and much it does not: wrong JSON types, huge or negative
              shapes and sizes, bad UTF-8, duplicate inputs, shared-memory parameters pointing
              anywhere, parameters of every kind
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

__all__ = ["ModelSpec", "MODELS", "http_case", "grpc_request", "grpc_bytes", "ipc_frame", "HttpCase", "GrpcCase",
           "scaled", "well_typed_frame", "make_fuzz_repository"]


def scaled(examples: int) -> int:
    """The number of examples a fuzz test runs: its CI count times PYSTUB_FUZZ_SCALE (tools/fuzz.py
    sets it for long runs)."""
    return max(1, round(examples * float(os.environ.get("PYSTUB_FUZZ_SCALE", "1"))))

WIRE_TYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
              "FP16", "FP32", "FP64", "BF16", "BYTES"]
_NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}
RESERVED_KEYS = ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                 "binary_data_output", "triton_enable_empty_final_response", "triton_other",
                 "multiplexed_model_id"]
SHM_KEYS = ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"]
HUGE_INTS = [2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100,
             -1, -2, -(2**31), -(2**63), -(2**64)]


@dataclass(frozen=True)
class ModelSpec:
    """What a fuzzed request targets: a model's inputs as (name, wire datatype, dims without the
    batch dimension) and whether it batches."""

    name: str
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[str, ...]
    max_batch_size: int = 0


MODELS = {
    "identity_fp32": ModelSpec("identity_fp32", (("INPUT0", "FP32", (-1,)),), ("OUTPUT0",), 8),
    "add_sub": ModelSpec("add_sub", (("INPUT0", "FP32", (4,)), ("INPUT1", "FP32", (4,))), ("OUTPUT0", "OUTPUT1")),
    "string_identity": ModelSpec("string_identity", (("INPUT0", "BYTES", (-1,)),), ("OUTPUT0",)),
    "identity_2d": ModelSpec("identity_2d", (("INPUT0", "FP32", (-1, -1)),), ("OUTPUT0",)),
}
# identity_fp32's model with two variable dims and no batching: a shape such as [0, 2**63] holds
# no element, so only a range check on the dims stops it.
IDENTITY_2D_CONFIG = """
name: "identity_2d"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
"""


def make_fuzz_repository(directory: Any) -> Any:
    """A repository with the models `MODELS` names (copies of the examples, and identity_2d)."""
    import shutil
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples" / "models"
    repository = Path(directory) / "models"
    repository.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        if (examples / name).is_dir():
            shutil.copytree(examples / name, repository / name)
    shutil.copytree(examples / "identity_fp32", repository / "identity_2d")
    (repository / "identity_2d" / "config.pbtxt").write_text(IDENTITY_2D_CONFIG)
    return repository

# -- scalars and small pieces ------------------------------------------------------------------------
# Text with lone surrogates too: JSON can carry them (`"\ud800"`), UTF-8 cannot.
_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.one_of(st.text(max_size=12), st.lists(st.one_of(st.characters(), _surrogates), max_size=6).map("".join))
ints = st.one_of(st.integers(-3, 16), st.sampled_from(HUGE_INTS), st.integers(-(2**70), 2**70))
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(texts, inner, max_size=3)),
                           max_leaves=12)


def _dims(dims: tuple[int, ...], draw: Any) -> list[int]:
    return [draw(st.integers(0, 6)) if d < 0 else d for d in dims]


def _tensor_values(datatype: str, shape: list[int], draw: Any) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        return np.array(items or [], dtype=np.object_).reshape(shape)
    dtype = _NUMPY.get(datatype, np.float32)
    raw = draw(st.binary(min_size=count * np.dtype(dtype).itemsize, max_size=count * np.dtype(dtype).itemsize))
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if dtype == np.bool_:
        array = array.astype(np.uint8).astype(np.bool_)
    return array


def _bytes_of(array: np.ndarray) -> bytes:
    if array.dtype == np.object_:
        return b"".join(len(item).to_bytes(4, "little") + item for item in array.reshape(-1))
    return array.tobytes()


def _json_data(array: np.ndarray) -> list[Any]:
    if array.dtype == np.object_:
        return [item.decode("utf-8", "surrogateescape") for item in array.reshape(-1)]
    values = array.reshape(-1).tolist()
    return [v if not isinstance(v, float) or math.isfinite(v) else 0.0 for v in values]


# -- HTTP ------------------------------------------------------------------------------------------------
@dataclass
class HttpCase:
    """One HTTP inference request: body, `Inference-Header-Content-Length` (None: absent),
    `Content-Encoding` (None: absent), and the model it targets."""

    model: str
    body: bytes
    header_length: str | None
    encoding: str | None = None
    kind: str = "junk"


def _valid_document(spec: ModelSpec, draw: Any) -> tuple[dict[str, Any], list[bytes]]:
    batch = [draw(st.integers(1, spec.max_batch_size))] if spec.max_batch_size else []
    inputs, buffers = [], []
    for name, datatype, dims in spec.inputs:
        shape = batch + _dims(dims, draw)
        array = _tensor_values(datatype, shape, draw)
        if draw(st.booleans()):
            data = _bytes_of(array)
            inputs.append({"name": name, "datatype": datatype, "shape": shape,
                           "parameters": {"binary_data_size": len(data)}})
            buffers.append(data)
        else:
            inputs.append({"name": name, "datatype": datatype, "shape": shape, "data": _json_data(array)})
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=8))
    if draw(st.booleans()):
        document["outputs"] = [{"name": o, "parameters": {"binary_data": draw(st.booleans())}}
                               for o in spec.outputs if draw(st.booleans())]
    if draw(st.booleans()):
        document["parameters"] = {"binary_data_output": draw(st.booleans())}
    return document, buffers


_MUTATIONS = ["shape", "edge_shape", "datatype", "name", "size", "data", "duplicate", "drop", "shm", "parameters",
              "edge_parameters", "id", "outputs", "type_of_field", "extra_bytes", "oversize_metadata"]
# Metadata over the 128 KiB control frame: it must travel to the stub (spilled into
# the arena) or be refused with a 4xx, never a 500, and never fail another request.
OVERSIZE_CHARS = [131_000, 140_000, 300_000]
MANY_OUTPUTS = 20_000
# Parameters at and beyond what the wire to the stub carries (uint64), and lone surrogates.
_EDGE_PARAMETERS = [("timeout", 2**64 - 1), ("timeout", 2**64), ("timeout", 2**100), ("priority", 2**64),
                    ("priority", 2**64 - 1), ("timeout", -1), ("priority", 1.5), ("sequence_id", 2**64),
                    ("sequence_id", -(2**63)), ("sequence_id", "\ud800"), ("custom", "\ud800"), ("\ud800", 1),
                    ("custom", 2**100), ("custom", -(2**100)), ("custom", float("nan")), ("timeout", True)]
_EDGE_DIMS = [2**63 - 1, 2**63, 2**64, 2**100, -1, 2**31]


def _mutate(document: dict[str, Any], buffers: list[bytes], draw: Any, what: str | None = None) -> None:
    inputs = document.get("inputs")
    if not isinstance(inputs, list):  # an earlier mutation replaced it
        inputs = []
    target = inputs[draw(st.integers(0, len(inputs) - 1))] if inputs else {}
    if not isinstance(target, dict):
        target = {}
    if not isinstance(target.get("parameters", {}), dict):
        target["parameters"] = {}
    if not isinstance(document.get("parameters", {}), dict):
        document["parameters"] = {}
    what = what or draw(st.sampled_from(_MUTATIONS))
    if what == "shape":
        target["shape"] = draw(st.one_of(st.lists(ints, max_size=4), json_values))
    elif what == "edge_shape":  # an empty tensor with an out-of-range dim, or a huge one
        shape = [draw(st.sampled_from(_EDGE_DIMS)), draw(st.sampled_from([0, 0, 1]))]
        target["shape"] = draw(st.permutations(shape))
        binary = [t for t in inputs if isinstance(t, dict) and "binary_data_size" in t.get("parameters", {})]
        if target in binary and len(buffers) == len(binary):
            del buffers[binary.index(target)]  # its bytes go with it: the tensor is empty now
        target.pop("parameters", None)
        target["data"] = []
    elif what == "edge_parameters":  # values at and beyond what the wire carries, lone surrogates
        parameters = document.setdefault("parameters", {})
        key, value = draw(st.sampled_from(_EDGE_PARAMETERS))
        parameters[key] = value
    elif what == "datatype":
        target["datatype"] = draw(st.one_of(st.sampled_from(WIRE_TYPES), texts, json_values))
    elif what == "name":
        target["name"] = draw(st.one_of(texts, json_values))
    elif what == "size":
        target.setdefault("parameters", {})["binary_data_size"] = draw(st.one_of(ints, json_values))
        target.pop("data", None) if draw(st.booleans()) else None
    elif what == "data":
        target["data"] = draw(json_values)
    elif what == "duplicate" and target in inputs:
        inputs.append(dict(target))
    elif what == "drop" and target in inputs:
        inputs.remove(target)
    elif what == "shm":
        parameters = target.setdefault("parameters", {})
        for key in draw(st.lists(st.sampled_from(SHM_KEYS), max_size=3)):
            parameters[key] = draw(st.one_of(ints, texts, scalars))
    elif what == "parameters":
        parameters = document.setdefault("parameters", {})
        for key in draw(st.lists(st.one_of(st.sampled_from(RESERVED_KEYS), texts), max_size=3)):
            parameters[key] = draw(st.one_of(scalars, json_values))
    elif what == "id":
        document["id"] = draw(st.one_of(texts, json_values))
    elif what == "outputs":
        document["outputs"] = draw(st.one_of(json_values, st.lists(st.dictionaries(
            st.sampled_from(["name", "parameters"]), st.one_of(texts, json_values)), max_size=3)))
    elif what == "type_of_field":
        key = draw(st.sampled_from(["inputs", "outputs", "parameters", "id"]))
        document[key] = draw(json_values)
    elif what == "extra_bytes":
        buffers.append(draw(st.binary(max_size=16)))
    elif what == "oversize_metadata":
        size = draw(st.sampled_from(OVERSIZE_CHARS))
        part = draw(st.sampled_from(["id", "outputs", "parameters"]))
        if part == "id":
            document["id"] = "i" * size
        elif part == "outputs":
            document["outputs"] = [{"name": "OUTPUT0"}] * MANY_OUTPUTS
        else:
            document.setdefault("parameters", {})["note"] = "p" * size


@st.composite
def _junk_document(draw: Any) -> dict[str, Any]:
    def tensor() -> dict[str, Any]:
        item: dict[str, Any] = {}
        for key in draw(st.lists(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]),
                                 max_size=5, unique=True)):
            item[key] = {"name": lambda: draw(st.one_of(st.sampled_from(["INPUT0", "INPUT1"]), texts)),
                         "shape": lambda: draw(st.lists(ints, max_size=4)),
                         "datatype": lambda: draw(st.sampled_from(WIRE_TYPES)),
                         "data": lambda: draw(json_values),
                         "parameters": lambda: draw(st.dictionaries(
                             st.one_of(st.sampled_from(SHM_KEYS + ["binary_data_size", "binary_data"]), texts),
                             scalars, max_size=3))}[key]()
        return item
    document: dict[str, Any] = {"inputs": [tensor() for _ in range(draw(st.integers(0, 3)))]}
    if draw(st.booleans()):
        document["outputs"] = [tensor() for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        document["parameters"] = draw(st.dictionaries(st.one_of(st.sampled_from(RESERVED_KEYS), texts),
                                                      scalars, max_size=3))
    return document


def _header_length(body_length: int, header: int, draw: Any) -> str | None:
    return draw(st.one_of(
        st.just(str(header)), st.just(str(header)), st.none(),
        st.integers(-5, body_length + 5).map(str), st.sampled_from(HUGE_INTS).map(str),
        st.sampled_from(["", " ", "0x10", "1e3", "+5", "١٢", "9" * 30])))


@st.composite
def http_case(draw: Any, models: tuple[str, ...] = tuple(MODELS)) -> HttpCase:
    """An HTTP inference body for one of `models` (valid, mutated or junk; see the module doc)."""
    model = draw(st.sampled_from(models))
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "edge", "junk", "bytes", "raw"]))
    if kind == "bytes":  # not JSON at all, or JSON cut short, or bad UTF-8
        body = draw(st.one_of(st.binary(max_size=64), st.just(b'{"inputs": [').map(
            lambda b: b + draw(st.binary(max_size=8))), st.just(b'{"id": "\xff\xfe"}')))
        return HttpCase(model, body, _header_length(len(body), len(body), draw), kind=kind)
    if kind == "raw":  # `Inference-Header-Content-Length: 0`: the body is the only input's bytes
        body = draw(st.binary(max_size=64))
        return HttpCase(model, body, "0", kind=kind)
    if kind == "junk":
        document, buffers = draw(_junk_document()), draw(st.lists(st.binary(max_size=16), max_size=2))
    else:
        document, buffers = _valid_document(MODELS[model], draw)
        if kind == "mutated":
            for _ in range(draw(st.integers(1, 2))):
                _mutate(document, buffers, draw)
        elif kind == "edge":  # a valid request with one value at or beyond a limit
            _mutate(document, buffers, draw, draw(st.sampled_from(["edge_shape", "edge_parameters"])))
    header = json.dumps(document).encode("utf-8", "surrogatepass")
    body = header + b"".join(buffers)
    length = str(len(header)) if buffers or draw(st.booleans()) else None
    if kind != "valid" and draw(st.integers(0, 4)) == 0:
        length = _header_length(len(body), len(header), draw)
    encoding = None
    if draw(st.integers(0, 9)) == 0:
        encoding = draw(st.sampled_from(["gzip", "deflate", "identity", "br", "gzip, gzip", "x-gzip"]))
        if encoding in ("gzip", "x-gzip", "deflate") and draw(st.integers(0, 3)):
            body = gzip.compress(body) if encoding != "deflate" else zlib.compress(body)
        elif encoding != "identity":
            kind = "mutated"  # declared but not applied, or not supported
    return HttpCase(model, body, length, encoding, kind)


# -- gRPC ------------------------------------------------------------------------------------------------
def _set_parameter(target: Any, key: str, draw: Any) -> None:
    kind = draw(st.sampled_from(["bool", "int64", "uint64", "string", "double", "unset"]))
    param = target[key]
    if kind == "bool":
        param.bool_param = draw(st.booleans())
    elif kind == "int64":
        param.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "uint64":
        param.uint64_param = draw(st.integers(0, 2**64 - 1))
    elif kind == "string":
        param.string_param = draw(st.text(max_size=8))
    elif kind == "double":
        param.double_param = draw(floats)


_CONTENT_FIELDS = {
    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1), "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
    "fp64_contents": floats, "bytes_contents": st.binary(max_size=8)}
_GRPC_INTS = st.one_of(st.integers(-3, 8), st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, -(2**63)]))


@dataclass
class GrpcCase:
    kind: str  # valid, mutated or junk
    request: service_pb2.ModelInferRequest


@st.composite
def grpc_request(draw: Any, models: tuple[str, ...] = tuple(MODELS), oversize: bool = True) -> GrpcCase:
    """A `ModelInferRequest` for one of `models`: valid, mutated or junk (`oversize`: mutations may
    give it metadata over the 128 KiB control frame)."""
    model = draw(st.sampled_from(models))
    spec = MODELS[model]
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "junk"]))
    request = service_pb2.ModelInferRequest(model_name=model)
    if kind == "junk" and draw(st.booleans()):
        request.model_name = draw(st.text(max_size=8))
    request.id = draw(st.text(max_size=6))
    batch = [draw(st.integers(1, spec.max_batch_size))] if spec.max_batch_size else []
    use_raw = draw(st.booleans())
    for name, datatype, dims in spec.inputs:
        tensor = request.inputs.add(name=name, datatype=datatype)
        shape = batch + _dims(dims, draw)
        tensor.shape.extend(shape)
        array = _tensor_values(datatype, shape, draw)
        if use_raw:
            request.raw_input_contents.append(_bytes_of(array))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(list(array.reshape(-1)))
        else:
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    if kind != "valid":
        for _ in range(draw(st.integers(1, 3))):
            _mutate_grpc(request, draw, oversize)
    return GrpcCase(kind, request)


def _mutate_grpc(request: service_pb2.ModelInferRequest, draw: Any, oversize: bool = True) -> None:
    what = draw(st.sampled_from(["shape", "datatype", "name", "raw", "contents", "duplicate", "parameters",
                                 "tensor_parameters", "shm", "outputs", "drop"] + ["oversize_metadata"] * oversize))
    tensor = request.inputs[draw(st.integers(0, len(request.inputs) - 1))] if request.inputs else None
    if what == "shape" and tensor is not None:
        del tensor.shape[:]
        tensor.shape.extend(draw(st.lists(_GRPC_INTS, max_size=4)))
    elif what == "datatype" and tensor is not None:
        tensor.datatype = draw(st.one_of(st.sampled_from(WIRE_TYPES), st.text(max_size=6)))
    elif what == "name" and tensor is not None:
        tensor.name = draw(st.text(max_size=6))
    elif what == "raw":
        del request.raw_input_contents[:]
        request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=3)))
    elif what == "contents" and tensor is not None:
        field = draw(st.sampled_from(sorted(_CONTENT_FIELDS)))
        getattr(tensor.contents, field).extend(draw(st.lists(_CONTENT_FIELDS[field], max_size=6)))
    elif what == "duplicate" and tensor is not None:
        request.inputs.add().CopyFrom(tensor)
    elif what == "drop" and tensor is not None:
        request.inputs.remove(tensor)
    elif what == "parameters":
        for key in draw(st.lists(st.one_of(st.sampled_from(RESERVED_KEYS), st.text(max_size=5)), max_size=3)):
            _set_parameter(request.parameters, key, draw)
    elif what == "tensor_parameters" and tensor is not None:
        for key in draw(st.lists(st.sampled_from(["binary_data", "binary_data_size", "x"]), max_size=2)):
            _set_parameter(tensor.parameters, key, draw)
    elif what == "shm" and tensor is not None:
        for key in draw(st.lists(st.sampled_from(SHM_KEYS), min_size=1, max_size=3)):
            _set_parameter(tensor.parameters, key, draw)
    elif what == "oversize_metadata":  # over the control frame: travels spilled, or 4xx
        size = draw(st.sampled_from(OVERSIZE_CHARS))
        part = draw(st.sampled_from(["id", "outputs", "parameters"]))
        if part == "id":
            request.id = "i" * size
        elif part == "outputs":
            for _ in range(MANY_OUTPUTS):
                request.outputs.add(name="OUTPUT0")
        else:
            request.parameters["note"].string_param = "p" * size
    elif what == "outputs":
        for _ in range(draw(st.integers(1, 2))):
            output = request.outputs.add(name=draw(st.one_of(st.just("OUTPUT0"), st.text(max_size=5))))
            for key in draw(st.lists(st.sampled_from(SHM_KEYS + ["binary_data"]), max_size=2)):
                _set_parameter(output.parameters, key, draw)


@st.composite
def grpc_bytes(draw: Any) -> bytes:
    """Bytes for the ModelInfer method: a serialized request, cut, flipped or extended, or noise
    (wrong wire types, bad UTF-8 in string fields)."""
    # Not oversize: cut inside a 140 KB field, grpcio's parser refuses the bytes with texts of its own
    # before our servicer runs; oversize metadata is test_grpc_infer_answers_or_refuses's part.
    data = draw(grpc_request(oversize=False)).request.SerializeToString()
    how = draw(st.sampled_from(["noise", "cut", "flip", "append", "bad_utf8"]))
    if how == "noise":
        return draw(st.binary(max_size=64))
    if how == "cut":
        return data[:draw(st.integers(0, len(data)))]
    if how == "flip" and data:
        index = draw(st.integers(0, len(data) - 1))
        return data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1:]
    if how == "bad_utf8":  # field 1 (model_name), length-delimited, with invalid UTF-8
        return b"\x0a\x03\xff\xfe\xfd" + data
    return data + draw(st.binary(max_size=16))


# -- ipc frames ------------------------------------------------------------------------------------------
_msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=6),
              st.binary(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=10)


@st.composite
def ipc_frame(draw: Any, kinds: tuple[int, ...] = (), arities: dict[int, int] | None = None) -> bytes:
    """A corrupt-looking frame: noise, msgpack that is not a message array, an unknown kind, a
    registered kind with the wrong arity, or with fields of any type."""
    how = draw(st.sampled_from(["noise", "not_array", "unknown_kind", "arity", "fields", "fields"]))
    if how == "noise":
        return draw(st.binary(min_size=1, max_size=64))
    if how == "not_array":
        return msgpack.packb(draw(_msgpack_values), use_bin_type=True)
    if how == "unknown_kind":
        kind = draw(st.one_of(st.integers(-5, 200).filter(lambda k: k not in kinds), st.text(max_size=3)))
        return msgpack.packb([kind, *draw(st.lists(_msgpack_values, max_size=4))], use_bin_type=True)
    kind = draw(st.sampled_from(kinds)) if kinds else 0
    arity = (arities or {}).get(kind, 0)
    count = draw(st.integers(0, arity + 3).filter(lambda n: n != arity)) if how == "arity" else arity
    return msgpack.packb([kind, *draw(st.lists(_msgpack_values, min_size=count, max_size=count))],
                         use_bin_type=True)


def _typed_value(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of the right top-level type for a message field (contents arbitrary)."""
    import types
    import typing

    if isinstance(annotation, type) and hasattr(annotation, "_fields"):  # a record (pystub_backend.ipc.records)
        return _typed_record(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_typed_value(arg) for arg in typing.get_args(annotation)))
    if origin is list:
        args = typing.get_args(annotation)
        if args and isinstance(args[0], type) and hasattr(args[0], "_fields"):
            return st.lists(_typed_record(args[0]), max_size=3)
        if args and typing.get_origin(args[0]) in (typing.Union, types.UnionType):  # e.g. list[RecordA | RecordB]
            return st.lists(_typed_value(args[0]), max_size=3)
        if args and typing.get_origin(args[0]) is list:
            return st.lists(st.lists(_msgpack_values, max_size=5), max_size=3)
        return st.lists(_msgpack_values, max_size=5)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), _msgpack_values, max_size=3)
    simple = {int: st.integers(-(2**63), 2**64 - 1), bool: st.booleans(), float: st.floats(),
              str: st.text(max_size=12), type(None): st.none(), bytes: st.binary(max_size=16),
              memoryview: st.binary(max_size=16)}  # a view travels as msgpack bytes
    return simple.get(annotation, _msgpack_values)


def _typed_record(cls: type) -> st.SearchStrategy[list[Any]]:
    """The array of a record whose fields have the declared types (a trailing defaulted field may
    be absent, as on the wire)."""
    import typing

    hints = typing.get_type_hints(cls)
    fields = [_typed_value(hints.get(name, Any)) for name in cls._fields]  # type: ignore[attr-defined]
    required = len(fields) - len(cls._field_defaults)  # type: ignore[attr-defined]
    return st.tuples(*fields, st.integers(required, len(fields))).map(lambda drawn: list(drawn[:drawn[-1]]))


@st.composite
def well_typed_frame(draw: Any, classes: tuple[type, ...]) -> bytes:
    """A frame of one of `classes` whose fields have the declared types and meaningless values:
    it passes the decoder, so only the receiver's handler stands between it and harm."""
    import typing

    cls = draw(st.sampled_from(classes))
    hints = typing.get_type_hints(cls)
    values = [draw(_typed_value(hints.get(name, Any))) for name in cls._fields]
    from pystub_backend.ipc.wire import registered_kinds
    kind = next(k for k, c in registered_kinds().items() if c is cls)
    return msgpack.packb([kind, *values], use_bin_type=True)
