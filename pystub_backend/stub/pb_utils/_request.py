"""`InferenceRequest`: a request handed to `execute`, or one a model builds for BLS
(docs/reference/model-api.md#inferencerequest)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from . import _runtime
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


class InferenceRequest:
    """A BLS request, or (via `_from_server`) a request received by `execute`.

    The constructor raises TritonModelException with the docs/reference/model-api.md#inferencerequest, #parameters
    texts, and TypeError for arguments of the wrong type (any argument but `parameters` being None included).
    """

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
        input_list = _input_list(inputs)
        output_names = _name_list(requested_output_names)
        _require_int("model_version", model_version)
        _require_uint("flags", flags, 2**32 - 1)
        _require_uint("timeout", timeout, _UINT64_MAX)
        _typed("preferred_memory", preferred_memory, PreferredMemory)
        _typed("trace", trace, InferenceTrace)
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
        request = cls.__new__(cls)
        request._setup(
            inputs=inputs, request_id=request_id, correlation_id=correlation_id, flags=flags,
            timeout=timeout, parameters_json=parameters_json, requested_output_names=requested_output_names,
            model_name=model_name, model_version=model_version,
            trace=InferenceTrace._with_context(trace_context) if trace_context else _NO_TRACE,
            response_sender=response_sender, sender_source=sender_source,
        )
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Raises TypeError unless `flags` is an unsigned 32-bit int."""
        _require_uint("flags", flags, 2**32 - 1)
        self._flags = flags

    def timeout(self) -> int:
        """The timeout in microseconds, 0 if none."""
        return self._timeout

    def parameters(self) -> str:
        """The custom request parameters as a JSON object string."""
        return self._parameters

    def requested_output_names(self) -> set[str]:
        return self._requested_output_names

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's sender; a BLS request has one that refuses every send."""
        if self._response_sender is None:
            source = self._sender_source
            self._response_sender = (source.sender() if source is not None
                                     else InferenceResponseSender(_refuse_send, lambda: False, decoupled=True))
        return self._response_sender

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request (always False for a BLS request)."""
        if self._response_sender is not None:
            return self._response_sender.is_cancelled()
        return self._sender_source.is_cancelled() if self._sender_source is not None else False

    def set_release_flags(self, flags: int, /) -> None:
        """`TRITONSERVER_REQUEST_RELEASE_ALL` or `_RESCHEDULE`
        (docs/reference/model-api.md#release-flags-and-rescheduling). Raises TypeError for a non-int."""
        _require_uint("flags", flags, 2**32 - 1)
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model (BLS): an `InferenceResponse`, or a
        `ResponseIterator` with `decoupled=True`. Failures come back as the response's error.

        Raises TritonModelException `BLS is only supported during the 'execute' function.`
        """
        return _bls_handler().exec(self, _require_bool("decoupled", decoupled))

    def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` as an awaitable; raises like `exec`."""
        return _bls_handler().async_exec(self, _require_bool("decoupled", decoupled))

    def __repr__(self) -> str:
        return f"InferenceRequest(model_name={self._model_name!r}, request_id={self._request_id!r})"


def _bls_handler() -> _runtime.BlsHandler:
    handler = _runtime.bls_handler()
    if handler is None:
        raise TritonModelException(_BLS_REFUSED)
    return handler


def _refuse_send(response: object, flags: int) -> None:
    raise TritonModelException("Unable to send response. A BLS request has no client to respond to.")


def _input_list(inputs: object) -> list[Tensor]:
    items = _sequence("inputs", inputs)
    for item in items:
        if item is not None and not isinstance(item, Tensor):
            raise TypeError(f"inputs must be a list of Tensor, found {type(item)}")
    return items


def _name_list(names: object) -> list[str]:
    return [require_str("requested output name", item) for item in _sequence("requested_output_names", names)]


def _sequence(what: str, value: object) -> list[Any]:
    if value is None or isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a list, got {type(value)}")
    return list(value)


def _require_int(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {type(value)}")


def _require_uint(what: str, value: object, maximum: int) -> None:
    _require_int(what, value)
    if not 0 <= value <= maximum:  # type: ignore[operator]
        raise TypeError(f"{what} must be between 0 and {maximum}, got {value}")


def _require_bool(what: str, value: object) -> bool:
    if value is None:
        raise TypeError(f"{what} must be a bool, got None")
    return bool(value)


def _typed(what: str, value: object, cls: type) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{what} must be a {cls.__name__}, got {type(value)}")


def _correlation_id(correlation_id: object) -> int | str:
    if isinstance(correlation_id, str):
        return correlation_id
    if isinstance(correlation_id, int):
        _require_uint("correlation_id", int(correlation_id), _UINT64_MAX)
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
