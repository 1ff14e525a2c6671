"""pb_utils InferenceRequest, InferenceResponse, TritonError, parameters, PreferredMemory, trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pystub_backend.ipc.status import Status
from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Tensor,
    TritonError,
    TritonModelException,
    _runtime,
)


@pytest.fixture(autouse=True)
def _reset_runtime():
    yield
    _runtime.set_bls_handler(None)


def _tensor(name="IN", value=1.0):
    return Tensor(name, np.array([value], dtype=np.float32))


def _server_request(sender=None, **overrides):
    fields = dict(
        inputs=[_tensor("A"), _tensor("B")], request_id="r1", correlation_id="seq-7", flags=1,
        timeout=1500, parameters_json='{"k": 1}', requested_output_names={"OUT"}, model_name="m",
        model_version=3, response_sender=sender or InferenceResponseSender(_ignore, lambda: False, decoupled=False),
    )
    fields.update(overrides)
    return InferenceRequest._from_server(**fields)


def _ignore(response, flags):
    pass


# -- TritonError / TritonModelException ---------------------------------------------------------

def test_triton_error_codes():
    codes = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
             "ALREADY_EXISTS", "CANCELLED"]
    assert [int(getattr(TritonError, name)) for name in codes] == list(range(8))
    assert TritonError.CANCELLED is Status.CANCELLED


def test_triton_error_accessors_and_default_code():
    error = TritonError("boom")
    assert error.message() == "boom"
    assert error.code() is TritonError.INTERNAL
    error = TritonError("gone", TritonError.NOT_FOUND)
    assert error.code() == 2
    assert TritonError(message="m", code=TritonError.CANCELLED).code() is TritonError.CANCELLED


@pytest.mark.parametrize("args", [(None,), ("m", None), (1,), ("m", 99), ("m", 4), ("m", "INTERNAL")])
def test_triton_error_refuses_bad_arguments(args):
    with pytest.raises(TypeError):
        TritonError(*args)


def test_triton_model_exception_is_an_exception_with_plain_text():
    assert issubclass(TritonModelException, Exception)
    assert str(TritonModelException("text")) == "text"


# -- InferenceRequest received from the server ---------------------------------------------------

def test_server_request_accessors():
    cancelled = iter([False, True])
    sender = InferenceResponseSender(_ignore, lambda: next(cancelled), decoupled=True)
    request = _server_request(sender, trace_context='{"traceparent": "x"}')
    assert [t.name() for t in request.inputs()] == ["A", "B"]
    assert request.request_id() == "r1"
    assert request.correlation_id() == "seq-7"
    assert request.flags() == 1
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert request.flags() == 2
    assert request.timeout() == 1500
    assert json.loads(request.parameters()) == {"k": 1}
    assert request.requested_output_names() == {"OUT"}
    assert request.trace().get_context() == '{"traceparent": "x"}'
    assert request.get_response_sender() is sender
    assert request.is_cancelled() is False
    assert request.is_cancelled() is True
    assert sender.is_cancelled() is True


def test_release_flags_default_and_set():
    request = _server_request()
    assert request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request._release_flags == 2
    with pytest.raises(TypeError):
        request.set_release_flags(flags=1)  # positional (docs/reference/model-api.md#inferencerequest)
    with pytest.raises(TypeError):
        request.set_release_flags(None)


def test_untraced_request_has_no_context():
    assert _server_request().trace().get_context() is None
    assert pb_utils.InferenceTrace().get_context() is None


def test_get_input_tensor_by_name():
    request = _server_request()
    assert pb_utils.get_input_tensor_by_name(request, "B").name() == "B"
    assert pb_utils.get_input_tensor_by_name(request, "C") is None


# -- BLS request constructor ----------------------------------------------------------------------

def test_bls_request_defaults():
    request = InferenceRequest(model_name="other", inputs=[_tensor()], requested_output_names=["OUT"])
    assert request.request_id() == ""
    assert request.correlation_id() == 0
    assert request.flags() == 0
    assert request.timeout() == 0
    assert request.parameters() == "{}"
    assert request.requested_output_names() == {"OUT"}
    assert request.trace().get_context() is None
    assert request._model_name == "other"
    assert request._model_version == -1
    assert request._preferred_memory.preferred_memory_type == 2  # server default
    assert request.is_cancelled() is False


def test_bls_request_with_all_arguments():
    trace = _server_request(trace_context="ctx").trace()
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    request = InferenceRequest(
        model_name="other", inputs=[_tensor()], requested_output_names=[], request_id="id",
        correlation_id="corr", model_version=2, flags=3, timeout=10, preferred_memory=memory,
        trace=trace, parameters={"a": True, "b": 2, "c": "s"},
    )
    assert request.correlation_id() == "corr"
    assert request._model_version == 2
    assert request._preferred_memory is memory
    assert request.trace().get_context() == "ctx"
    assert json.loads(request.parameters()) == {"a": True, "b": 2, "c": "s"}
    assert request.requested_output_names() == set()


def test_bls_request_empty_input():
    with pytest.raises(TritonModelException) as exc:
        InferenceRequest(model_name="m", inputs=[_tensor(), None], requested_output_names=[], request_id="r")
    assert str(exc.value) == "Input tensor for request with id 'r' and model name 'm' should not be empty."


def test_bls_request_empty_output_name():
    with pytest.raises(TritonModelException) as exc:
        InferenceRequest(model_name="m", inputs=[], requested_output_names=["A", ""])
    assert str(exc.value) == "Requested output name for request with id '' and model name 'm' should not be empty."


@pytest.mark.parametrize("correlation_id", [1.5, b"x", [1]])
def test_bls_request_correlation_id_type(correlation_id):
    with pytest.raises(TritonModelException) as exc:
        InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=correlation_id)
    assert str(exc.value) == "Correlation ID must be integer or string"


def test_bls_request_integer_correlation_id():
    request = InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=2**63)
    assert request.correlation_id() == 2**63


@pytest.mark.parametrize(
    "field", ["model_name", "inputs", "requested_output_names", "request_id", "correlation_id",
              "model_version", "flags", "timeout", "preferred_memory", "trace"],
)
def test_bls_request_only_parameters_may_be_none(field):
    arguments = dict(model_name="m", inputs=[], requested_output_names=[])
    arguments[field] = None
    with pytest.raises((TypeError, TritonModelException)) as exc:
        InferenceRequest(**arguments)
    assert exc.type is TypeError
    assert str(exc.value).startswith("__init__(): incompatible constructor arguments.")
    assert InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters=None).parameters() == "{}"


def test_bls_request_wrong_input_type():
    with pytest.raises(TypeError):
        InferenceRequest(model_name="m", inputs=[np.zeros(1)], requested_output_names=[])


# -- parameters (docs/reference/model-api.md#parameters) ---------------------------------------------------------------

@pytest.mark.parametrize(
    "parameters,message",
    [
        ({1: "a"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"a": 1.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        ({"a": None}, "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"a": [1]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
        ([("a", 1)], "Expect N8pybind114dictE, got <class 'list'>"),
    ],
)
def test_parameter_errors_for_requests_and_responses(parameters, message):
    with pytest.raises(TritonModelException) as exc:
        InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters=parameters)
    assert str(exc.value) == message
    with pytest.raises(TritonModelException) as exc:
        InferenceResponse(parameters=parameters)
    assert str(exc.value) == message


# -- BLS exec -------------------------------------------------------------------------------------

def test_exec_without_handler_is_refused():
    request = InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    for call in (request.exec, request.async_exec):
        with pytest.raises(TritonModelException) as exc:
            call()
        assert str(exc.value) == "BLS is only supported during the 'execute' function."


def test_exec_delegates_to_the_handler():
    calls = []

    class Handler:
        def exec(self, request, decoupled):
            calls.append(("exec", request, decoupled))
            return "response"

        def async_exec(self, request, decoupled):
            calls.append(("async_exec", request, decoupled))
            return "future"

    _runtime.set_bls_handler(Handler())
    request = InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    assert request.exec() == "response"
    assert request.async_exec(decoupled=True) == "future"
    assert calls == [("exec", request, False), ("async_exec", request, True)]
    with pytest.raises(TypeError):
        request.exec(decoupled=None)


def test_bls_request_sender_refuses_to_send():
    request = InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(TritonModelException):
        request.get_response_sender().send(InferenceResponse())


# -- PreferredMemory ------------------------------------------------------------------------------

def test_preferred_memory():
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
    assert memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_GPU
    assert memory.preferred_device_id == 1
    assert pb_utils.PreferredMemory(preferred_memory_type=pb_utils.TRITONSERVER_MEMORY_CPU).preferred_device_id == 0
    for bad in ((None,), (5,), (pb_utils.TRITONSERVER_MEMORY_CPU, None)):
        with pytest.raises(TypeError):
            pb_utils.PreferredMemory(*bad)


# -- InferenceResponse ----------------------------------------------------------------------------

def test_response_defaults():
    response = InferenceResponse()
    assert response.output_tensors() == []
    assert response.has_error() is False
    assert response.error() is None
    assert response.parameters() == "{}"


def test_response_with_outputs_error_and_parameters():
    out = _tensor("OUT")
    error = TritonError("bad", TritonError.INVALID_ARG)
    response = InferenceResponse(output_tensors=[out], error=error, parameters={"p": "v"})
    assert response.output_tensors() == [out]
    assert response.has_error() and response.error() is error
    assert json.loads(response.parameters()) == {"p": "v"}
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "NOPE") is None
    assert InferenceResponse([out]).output_tensors() == [out]


def test_response_none_tensor():
    with pytest.raises(TritonModelException) as exc:
        InferenceResponse(output_tensors=[_tensor(), None])
    assert str(exc.value) == "Output tensor for inference response should not be empty."


@pytest.mark.parametrize("kwargs", [{"output_tensors": [np.zeros(1)]}, {"output_tensors": 3},
                                    {"error": "text"}])
def test_response_wrong_types(kwargs):
    with pytest.raises(TypeError):
        InferenceResponse(**kwargs)


def test_stub_side_response_constructor():
    response = InferenceResponse._create([_tensor("X")], None, '{"a": 1}')
    assert response.parameters() == '{"a": 1}'
    assert [t.name() for t in response.output_tensors()] == ["X"]
