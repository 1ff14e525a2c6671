"""pb_utils._binding: pybind11's argument binding and its TypeError text (the differential tier
compares the texts with Triton 2.51's; these pin the rules without it)."""

from __future__ import annotations

import numpy as np
import pytest

from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils._binding import BOOL, INT, STR, UINT32, Arg, PybindRepr, binding


class Thing(PybindRepr):
    @binding("(self: c_python_backend_utils.Thing, name: str, count: int = 0) -> list", Arg("name", STR),
             Arg("count", INT, 0))
    def method(self, name: str, count: int = 0) -> list:
        return [name, count]

    @binding("(self: c_python_backend_utils.Thing, arg0: int) -> int", Arg("arg0", UINT32))
    def positional(self, value: int, /) -> int:
        return value


def _text(call: object) -> str:
    with pytest.raises(TypeError) as exc:
        call()  # type: ignore[operator]
    return str(exc.value)


def test_good_calls_reach_the_function_with_the_same_values() -> None:
    thing = Thing()
    assert thing.method("a") == ["a", 0]
    assert thing.method("a", 2) == ["a", 2]
    assert thing.method(count=np.int64(3), name=b"b") == [b"b", 3]
    assert thing.positional(7) == 7


def test_a_bad_call_raises_pybind11s_text() -> None:
    thing = Thing()
    address = f"{id(thing):#x}"
    assert _text(lambda: thing.method(None, count=1.5)) == (
        "method(): incompatible function arguments. The following argument types are supported:\n"
        "    1. (self: c_python_backend_utils.Thing, name: str, count: int = 0) -> list\n\n"
        f"Invoked with: <c_python_backend_utils.Thing object at {address}>, None; kwargs: count=1.5")


@pytest.mark.parametrize("call", [
    lambda t: t.method(),                      # a required argument missing
    lambda t: t.method("a", 1, 2),             # one too many
    lambda t: t.method("a", name="b"),         # given twice
    lambda t: t.method("a", colour=1),         # unknown keyword
    lambda t: t.positional(arg0=1),            # argN is positional only
    lambda t: t.positional(-1),                # unsigned
    lambda t: t.positional(2**32),             # does not fit 32 bits
    lambda t: t.positional(1.0),               # a float is no int
])
def test_what_pybind11_refuses(call: object) -> None:
    thing = Thing()
    assert "incompatible function arguments" in _text(lambda: call(thing))  # type: ignore[operator]


def test_constructors_leave_self_out() -> None:
    text = _text(lambda: pb_utils.Tensor("T", [1, 2]))
    assert text.startswith("__init__(): incompatible constructor arguments.")
    assert text.endswith("\n\nInvoked with: 'T', [1, 2]")
    assert _text(lambda: pb_utils.TritonError()).endswith("Invoked with: ")


@pytest.mark.parametrize(("value", "accepted"), [(True, True), (0, True), (2.5, True), (np.bool_(False), True),
                                                 (None, False), ("yes", False), ([], False)])
def test_bool_takes_numbers_not_none_or_text(value: object, accepted: bool) -> None:
    assert BOOL(value) is accepted
