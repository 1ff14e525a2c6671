"""`InferenceRequest`: a request handed to `execute`, or one a model builds for BLS
(docs/reference/model-api.md#inferencerequest)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from . import _runtime
from ._binding import (
    BOOL,
    INT,
    MODULE,
    OBJECT,
    STR,
    UINT32,
    UINT64,
    Arg,
    PybindRepr,
    binding,
    instance_of,
    list_of,
)
from ._constants import TRITONSERVER_REQUEST_RELEASE_ALL
from ._errors import TritonModelException, require_str
from ._parameters import parameters_to_json
from ._request_options import InferenceTrace, PreferredMemory
from ._sender import InferenceResponseSender
from ._tensor import Tensor

__all__ = ["InferenceRequest"]

_BLS_REFUSED = "BLS is only supported during the 'execute' function."
_UINT64_MAX = 2**64 - 1
# Both are immutable, so sharing one default instance is safe.
_DEFAULT_MEMORY = PreferredMemory._default()
_NO_TRACE = InferenceTrace()


class SenderSource(Protocol):
    """Where a server request's sender comes from (the stub's request registry)."""

    def sender(self) -> InferenceResponseSender:
        """The request's one sender (made on the first call)."""
        ...

    def is_cancelled(self) -> bool:
        ...


def _NOT_NONE(value: object) -> bool:  # noqa: N802 - named as the binding's other argument kinds
    # Triton's binding refuses None for correlation_id although its signature says `object`
    return value is not None


def _signature() -> str:
    """Triton's constructor signature, its defaults shown as pybind11 shows them."""
    return (f"{MODULE}.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
            "inputs: List[triton::backend::python::PbTensor], requested_output_names: List[str], model_name: str, "
            "model_version: int = -1, flags: int = 0, timeout: int = 0, "
            f"preferred_memory: {MODULE}.PreferredMemory = {_DEFAULT_MEMORY!r}, "
            f"trace: {MODULE}.InferenceTrace = {_NO_TRACE!r}, parameters: object = None)")


_CONSTRUCTOR_ARGS = (
    Arg("request_id", STR, ""), Arg("correlation_id", _NOT_NONE, 0), Arg("inputs", list_of(instance_of(Tensor))),
    Arg("requested_output_names", list_of(STR)), Arg("model_name", STR), Arg("model_version", INT, -1),
    Arg("flags", UINT32, 0), Arg("timeout", UINT64, 0),
    Arg("preferred_memory", instance_of(PreferredMemory, none=False), None),
    Arg("trace", instance_of(InferenceTrace, none=False), None), Arg("parameters", OBJECT, None),
)


def _method(returns: str, *args: Arg) -> Any:
    """An InferenceRequest method as bound in Triton's pb_utils (its arguments are ints)."""
    shown = "".join(f", {arg.name}: int" for arg in args)
    return binding(f"(self: {MODULE}.InferenceRequest{shown}) -> {returns}", *args)


_EXEC = binding(f"(self: {MODULE}.InferenceRequest, decoupled: bool = False) -> object",
                Arg("decoupled", BOOL, False))


class InferenceRequest(PybindRepr):
    """A BLS request, or (via `_from_server`) a request received by `execute`.

    The constructor raises TritonModelException with the docs/reference/model-api.md#inferencerequest, #parameters
    texts, and TypeError for arguments of the wrong type (any argument but `parameters` being None included).
    """

    @binding(_signature, *_CONSTRUCTOR_ARGS)
    def __init__(
        self,
        model_name: str,
        inputs: Iterable[Tensor],
        requested_output_names: Iterable[str],
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory = _DEFAULT_MEMORY,
        trace: InferenceTrace = _NO_TRACE,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        model_name = require_str("model_name", model_name)
        request_id = require_str("request_id", request_id)
        input_list = list(inputs)
        output_names = [require_str("requested output name", name) for name in requested_output_names]
        model_version, flags, timeout = int(model_version), int(flags), int(timeout)
        parameters_json = parameters_to_json(parameters)
        correlation_id = _correlation_id(correlation_id)
        _check_not_empty(input_list, output_names, request_id, model_name)
        self._setup(
            inputs=input_list, request_id=request_id, correlation_id=correlation_id, flags=flags,
            timeout=timeout, parameters_json=parameters_json, requested_output_names=set(output_names),
            model_name=model_name, model_version=model_version, trace=trace,
        )
        self._preferred_memory = preferred_memory

    def _setup(self, *, inputs: list[Tensor], request_id: str, correlation_id: int | str, flags: int,
               timeout: int, parameters_json: str, requested_output_names: set[str], model_name: str,
               model_version: int, trace: InferenceTrace,
               response_sender: InferenceResponseSender | None = None,
               sender_source: SenderSource | None = None) -> None:
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters_json
        self._requested_output_names = requested_output_names
        self._model_name = model_name
        self._model_version = model_version
        self._trace = trace
        self._response_sender = response_sender
        self._sender_source = sender_source  # the server's request: its sender is made on first use
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._preferred_memory = _DEFAULT_MEMORY

    @classmethod
    def _from_server(
        cls, *, inputs: list[Tensor], request_id: str, correlation_id: int | str, flags: int, timeout: int,
        parameters_json: str, requested_output_names: set[str], model_name: str, model_version: int,
        response_sender: InferenceResponseSender | None = None, trace_context: str | None = None,
        sender_source: SenderSource | None = None,
    ) -> InferenceRequest:
        """Stub-side constructor for a request received from the server; nothing is validated.

        `sender_source` (instead of `response_sender`) makes the sender when the model first asks
        for it: most models answer by returning responses and never need one."""
        # The attributes `_setup` sets, set here directly: this runs for every request a stub gets.
        request = cls.__new__(cls)
        request._inputs = inputs
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters_json
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._trace = InferenceTrace._with_context(trace_context) if trace_context else _NO_TRACE
        request._response_sender = response_sender
        request._sender_source = sender_source
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._preferred_memory = _DEFAULT_MEMORY
        return request

    @_method("List[triton::backend::python::PbTensor]")
    def inputs(self) -> list[Tensor]:
        return self._inputs

    @_method("str")
    def request_id(self) -> str:
        return self._request_id

    @_method("object")
    def correlation_id(self) -> int | str:
        return self._correlation_id

    @_method("int")
    def flags(self) -> int:
        return self._flags

    @_method("None", Arg("arg0", UINT32))
    def set_flags(self, flags: int, /) -> None:
        """Raises TypeError unless `flags` is an unsigned 32-bit int."""
        self._flags = int(flags)

    @_method("int")
    def timeout(self) -> int:
        """The timeout in microseconds, 0 if none."""
        return self._timeout

    @_method("str")
    def parameters(self) -> str:
        """The custom request parameters as a JSON object string."""
        return self._parameters

    @_method("Set[str]")
    def requested_output_names(self) -> set[str]:
        return self._requested_output_names

    @_method(f"{MODULE}.InferenceTrace")
    def trace(self) -> InferenceTrace:
        return self._trace

    @_method("triton::backend::python::ResponseSender")
    def get_response_sender(self) -> InferenceResponseSender:
        """The request's sender; a BLS request has one that refuses every send."""
        if self._response_sender is None:
            source = self._sender_source
            self._response_sender = (source.sender() if source is not None
                                     else InferenceResponseSender(_refuse_send, lambda: False, decoupled=True))
        return self._response_sender

    @_method("bool")
    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request (always False for a BLS request)."""
        if self._response_sender is not None:
            return self._response_sender.is_cancelled()
        return self._sender_source.is_cancelled() if self._sender_source is not None else False

    @_method("None", Arg("arg0", UINT32))
    def set_release_flags(self, flags: int, /) -> None:
        """`TRITONSERVER_REQUEST_RELEASE_ALL` or `_RESCHEDULE`
        (docs/reference/model-api.md#release-flags-and-rescheduling). Raises TypeError for a non-int."""
        self._release_flags = int(flags)

    @_EXEC
    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model (BLS): an `InferenceResponse`, or a
        `ResponseIterator` with `decoupled=True`. Failures come back as the response's error.

        Raises TritonModelException `BLS is only supported during the 'execute' function.`
        """
        return _bls_handler().exec(self, bool(decoupled))

    @_EXEC
    def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` as an awaitable; raises like `exec`."""
        return _bls_handler().async_exec(self, bool(decoupled))


def _bls_handler() -> _runtime.BlsHandler:
    handler = _runtime.bls_handler()
    if handler is None:
        raise TritonModelException(_BLS_REFUSED)
    return handler


def _refuse_send(response: object, flags: int) -> None:
    raise TritonModelException("Unable to send response. A BLS request has no client to respond to.")


def _correlation_id(correlation_id: object) -> int | str:
    if isinstance(correlation_id, str):
        return correlation_id
    if isinstance(correlation_id, int):
        if not 0 <= correlation_id <= _UINT64_MAX:
            raise TypeError(f"correlation_id must be between 0 and {_UINT64_MAX}, got {correlation_id}")
        return int(correlation_id)
    raise TritonModelException("Correlation ID must be integer or string")


def _check_not_empty(inputs: Sequence[Tensor | None], output_names: list[str], request_id: str,
                     model_name: str) -> None:
    if any(item is None for item in inputs):
        raise TritonModelException(
            f"Input tensor for request with id '{request_id}' and model name '{model_name}' should not be empty."
        )
    if any(name == "" for name in output_names):
        raise TritonModelException(
            f"Requested output name for request with id '{request_id}' and model name '{model_name}' "
            "should not be empty."
        )
