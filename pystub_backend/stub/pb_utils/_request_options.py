"""Small value types a BLS request carries: `PreferredMemory` and `InferenceTrace`."""

from __future__ import annotations

from ._binding import INT, MODULE, Arg, PybindRepr, binding, enum_of
from ._constants import MemoryType

__all__ = ["PreferredMemory", "InferenceTrace", "PREFERRED_MEMORY_DEFAULT"]

# The original's third, unexported enum value `kDefault`: "let the server decide".
PREFERRED_MEMORY_DEFAULT = 2


class PreferredMemory(PybindRepr):
    """`PreferredMemory(preferred_memory_type, preferred_device_id=0)`: where BLS outputs go.

    A CPU-only build always places them on the CPU; the hint is carried along unchanged.
    Raises TypeError (pybind11's text) for a type that is not a `MemoryType` or a device id that
    is not an int.
    """

    __slots__ = ("_memory_type", "_device_id")

    @binding(f"{MODULE}.PreferredMemory(preferred_memory_type: triton::backend::python::PreferredMemory::MemoryType, "
             "preferred_device_id: int = 0)", Arg("preferred_memory_type", enum_of(MemoryType)),
             Arg("preferred_device_id", INT, 0))
    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        self._memory_type = int(preferred_memory_type)
        self._device_id = int(preferred_device_id)

    @classmethod
    def _default(cls) -> PreferredMemory:
        memory = cls.__new__(cls)
        memory._memory_type = PREFERRED_MEMORY_DEFAULT
        memory._device_id = 0
        return memory

    @property
    def preferred_memory_type(self) -> int:
        """`MemoryType` member, or PREFERRED_MEMORY_DEFAULT (2) when no preference was given."""
        return self._memory_type

    @property
    def preferred_device_id(self) -> int:
        return self._device_id



class InferenceTrace(PybindRepr):
    """The trace of a request; pass `request.trace()` into a BLS request to keep its context."""

    __slots__ = ("_context",)

    def __init__(self) -> None:
        self._context: str | None = None

    @classmethod
    def _with_context(cls, context: str | None) -> InferenceTrace:
        trace = cls()
        trace._context = context or None
        return trace

    def get_context(self) -> str | None:
        """The trace context (e.g. OpenTelemetry headers as JSON), or None when not traced."""
        return self._context
