"""`InferenceResponse` (docs/reference/model-api.md#inferenceresponse)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._binding import MODULE, OBJECT, Arg, PybindRepr, binding, instance_of, list_of
from ._errors import TritonError, TritonModelException
from ._parameters import parameters_to_json
from ._tensor import Tensor

__all__ = ["InferenceResponse"]


def _method(returns: str) -> Any:
    """An InferenceResponse method without arguments, as bound in Triton's pb_utils."""
    return binding(f"(self: {MODULE}.InferenceResponse) -> {returns}")


class InferenceResponse(PybindRepr):
    """`InferenceResponse(output_tensors=[], error=None, parameters=None)`.

    When `error` is set the server ignores the outputs (they are still returned by
    `output_tensors()`, as in the original). Raises TritonModelException
    `Output tensor for inference response should not be empty.` for a None tensor, the texts of
    docs/reference/model-api.md#parameters for bad parameters, and TypeError (pybind11's text) for
    arguments of the wrong type. `parameters` is pystub's (Triton 2.51 has no such argument): not in
    the signature.
    """

    __slots__ = ("_outputs", "_error", "_parameters")

    @binding(f"{MODULE}.InferenceResponse(output_tensors: List[{MODULE}.Tensor] = [], "
             f"error: {MODULE}.TritonError = None)", Arg("output_tensors", list_of(instance_of(Tensor)), ()),
             Arg("error", instance_of(TritonError), None), Arg("parameters", OBJECT, None))
    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        outputs: list[Tensor | None] = list(output_tensors or ())
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

    @_method(f"List[{MODULE}.Tensor]")
    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    @_method("bool")
    def has_error(self) -> bool:
        return self._error is not None

    @_method(f"{MODULE}.TritonError")
    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return self._parameters
