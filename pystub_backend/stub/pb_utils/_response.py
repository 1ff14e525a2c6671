"""`InferenceResponse` (docs/reference/model-api.md#inferenceresponse)."""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import TritonError, TritonModelException
from ._parameters import parameters_to_json
from ._tensor import Tensor

__all__ = ["InferenceResponse"]


class InferenceResponse:
    """`InferenceResponse(output_tensors=[], error=None, parameters=None)`.

    When `error` is set the server ignores the outputs (they are still returned by
    `output_tensors()`, as in the original). Raises TritonModelException
    `Output tensor for inference response should not be empty.` for a None tensor, the texts of
    docs/reference/model-api.md#parameters for bad parameters, and TypeError for arguments of the wrong type.
    """

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        outputs = _tensor_list(output_tensors)
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a TritonError or None, got {type(error)}")
        parameters_json = parameters_to_json(parameters)
        if any(output is None for output in outputs):
            raise TritonModelException("Output tensor for inference response should not be empty.")
        self._outputs: list[Tensor] = outputs  # type: ignore[assignment]
        self._error = error
        self._parameters = parameters_json

    @classmethod
    def _create(
        cls, output_tensors: list[Tensor], error: TritonError | None = None, parameters_json: str = "{}"
    ) -> InferenceResponse:
        """Stub-side constructor (BLS results): parameters arrive as JSON already."""
        response = cls.__new__(cls)
        response._outputs = list(output_tensors)
        response._error = error
        response._parameters = parameters_json
        return response

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return self._parameters

    def __repr__(self) -> str:
        return f"InferenceResponse(outputs={[t.name() for t in self._outputs]}, error={self._error!r})"


def _tensor_list(output_tensors: object) -> list[Tensor | None]:
    if output_tensors is None:
        return []
    if isinstance(output_tensors, (str, bytes, dict)) or not hasattr(output_tensors, "__iter__"):
        raise TypeError(f"output_tensors must be a list of Tensor, got {type(output_tensors)}")
    outputs = list(output_tensors)
    for output in outputs:
        if output is not None and not isinstance(output, Tensor):
            raise TypeError(f"output_tensors must be a list of Tensor, found {type(output)}")
    return outputs
