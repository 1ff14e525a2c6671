"""pb_utils argument checking: every row of models/pb_args/1/argument_cases.py (one pb_utils
callable called with a bad argument) runs in a model on Triton 2.51 and on pystub, and what it
raised (type and text) must agree. Triton's classes are pybind11 bindings, so most rows compare
pybind11's "incompatible function arguments" TypeError; object addresses in those texts differ
from run to run and are compared as `0x?`.

`test_every_callable_has_a_row` keeps the table complete: a public pb_utils callable (function,
class, or method of a class) without a row fails it.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import json
import re
from types import ModuleType

import numpy as np
import pytest
from calls import agree, both, http_infer
from oracle import MODELS, Endpoint, Pair

from pystub_backend.stub import pb_utils

# Every case runs inside a model and answers through the same request path: the frontend
# workers variant would repeat the stub's work, not test the frontends (see conftest.py).
PYSTUB_VARIANTS_RUN = ("single-process",)
PAIR_MODELS = ("pb_args", "repeat")  # the cases' BLS calls go to `repeat`


def _table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("argument_cases", MODELS / "pb_args" / "1" / "argument_cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLE = _table()
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def _raised(endpoint: Endpoint, case: str) -> list:
    """[exception type, text] of the row `case` run in the pb_args model (addresses as 0x?)."""
    answer = http_infer(endpoint, "pb_args", [("CASE", np.array([case.encode()], np.object_), "BYTES")], ["RESULT"])
    assert "ok" in answer, f"{endpoint.name}: pb_args failed: {answer}"
    return json.loads(_ADDRESS.sub("0x?", answer["ok"]["RESULT"][2][0]))


@pytest.mark.parametrize("case", sorted(TABLE.CASES))
def test_bad_arguments(pair: Pair, case: str) -> None:
    triton, pystub = both(pair, _raised, case)
    if case.split(":")[0] in TABLE.EXTENSIONS:   # pystub's own callables: Triton 2.51 has no such name
        assert triton[0] == "AttributeError", triton
        assert pystub[0] != "ok", f"pystub accepted the bad call: {pystub}"
        return
    agree(triton, pystub)


def _public_callables() -> set[str]:
    """`name` for every public function and class of pb_utils, `Class.method` for the public
    methods pystub defines on each class (enums and inherited builtin methods left out)."""
    names = set()
    for name in pb_utils.__all__:
        value = getattr(pb_utils, name)
        if isinstance(value, type) and issubclass(value, enum.Enum):
            continue
        if inspect.isclass(value):
            names.add(name)
            for owner in value.__mro__:
                if owner.__module__.startswith("pystub_backend"):
                    names.update(f"{name}.{attribute}" for attribute, member in vars(owner).items()
                                 if not attribute.startswith("_") and _is_method(member))
        elif callable(value):
            names.add(name)
    return names


def _is_method(member: object) -> bool:
    return isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member)


def test_every_callable_has_a_row() -> None:
    rows = {case.split(":")[0] for case in TABLE.CASES}
    missing = sorted(_public_callables() - rows)
    assert not missing, f"pb_utils callables without a row in argument_cases.py: {missing}"
    assert rows >= TABLE.EXTENSIONS, sorted(TABLE.EXTENSIONS - rows)
