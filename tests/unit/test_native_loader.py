"""Which modules the package serves compiled (pystub_backend/_native_loader.py): a compiled tree
laid out as tools/build_compiled.py writes it, with real sources and placeholder extension files
(the decision reads the manifest, the sources and which files exist; loading is end to end in
tests/integration/test_hot_path_modes.py)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import shutil
from pathlib import Path

import pytest

import pystub_backend
from pystub_backend._native_loader import decide

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
SOURCES = Path(pystub_backend.__file__).parent
MODULES = ("pystub_backend.ipc.wire", "pystub_backend.ipc.records")


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """`<tmp>/pystub_backend/_native`, beside copies of the two modules' sources, built for them."""
    package = tmp_path / "pystub_backend"
    modules = {}
    for name in MODULES:
        relative = Path(*name.split(".")[1:]).with_suffix(".py")
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCES / relative, package / relative)
        extension = package / "_native" / "pystub_backend" / relative.with_name(relative.stem + SUFFIX)
        extension.parent.mkdir(parents=True, exist_ok=True)
        extension.write_bytes(b"")
        modules[name] = hashlib.sha256((package / relative).read_bytes()).hexdigest()
    manifest = {"compiler": "cython 3", "suffix": SUFFIX, "modules": modules}
    (package / "_native" / "manifest.json").write_text(json.dumps(manifest))
    return package / "_native"


def test_a_current_build_serves_every_module(tree: Path):
    state, served = decide({}, tree)
    assert (state.mode, state.stale, sorted(served)) == ("compiled", [], sorted(MODULES))
    assert served["pystub_backend.ipc.wire"] == tree / "pystub_backend" / "ipc" / f"wire{SUFFIX}"
    assert state.compiler == "cython 3" and "current (2)" in state.reason


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_environment_variable_serves_nothing(tree: Path, value: str):
    state, served = decide({"PYSTUB_PURE_PYTHON": value}, tree)
    assert (state.mode, served, state.reason) == ("pure", {}, f"PYSTUB_PURE_PYTHON={value}")


def test_zero_or_empty_leaves_it_compiled(tree: Path):
    assert decide({"PYSTUB_PURE_PYTHON": "0"}, tree)[0].mode == "compiled"
    assert decide({"PYSTUB_PURE_PYTHON": ""}, tree)[0].mode == "compiled"


def test_a_changed_source_runs_as_python_and_is_named(tree: Path):
    source = tree.parent / "ipc" / "records.py"
    source.write_text(source.read_text() + "\n# edited after the build\n")
    state, served = decide({}, tree)
    assert sorted(served) == ["pystub_backend.ipc.wire"]
    assert state.stale == ["pystub_backend.ipc.records"] and "older than their sources" in state.reason


def test_a_missing_extension_is_not_served(tree: Path):
    (tree / "pystub_backend" / "ipc" / f"wire{SUFFIX}").unlink()
    state, served = decide({}, tree)
    assert sorted(served) == ["pystub_backend.ipc.records"] and state.stale == ["pystub_backend.ipc.wire"]


def test_another_interpreters_build_is_left_alone(tree: Path):
    manifest = json.loads((tree / "manifest.json").read_text())
    (tree / "manifest.json").write_text(json.dumps(dict(manifest, suffix=".cpython-39-x86_64-linux-gnu.so")))
    state, served = decide({}, tree)
    assert (state.mode, served, state.stale) == ("pure", {}, [])
    assert "another interpreter" in state.reason


def test_no_tree_or_a_broken_manifest_is_pure_and_says_why(tree: Path):
    (tree / "manifest.json").write_text("{not json")
    assert "unreadable" in decide({}, tree)[0].reason
    shutil.rmtree(tree)
    state, served = decide({}, tree)
    assert (state.mode, served) == ("pure", {}) and "no compiled modules were built" in state.reason


def test_objects_of_the_hot_modules_pickle_as_they_run():
    """Whatever mode this process runs in (compiled after an opt-in build), the hot modules' objects
    survive pickle: classes stay Python classes under Cython."""
    import pickle

    import numpy as np

    from pystub_backend.backend.errors import ServerError, Status
    from pystub_backend.backend.inference import InferRequest, Tensor
    from pystub_backend.ipc.messages.core import Execute
    from pystub_backend.ipc.records import WireRequest, WireTensor
    from pystub_backend.stub import pb_utils

    wire = WireTensor("A", "FP32", [1], [0, 1, 2])
    execute = Execute(1, [WireRequest(1, "x", [wire], [], "{}", 0, 0, 0)], [])
    assert pickle.loads(pickle.dumps(execute)) == execute
    error = pickle.loads(pickle.dumps(ServerError("bad input", Status.INVALID_ARG)))
    assert (type(error), error.status, error.message) == (ServerError, Status.INVALID_ARG, "bad input")
    request = pickle.loads(pickle.dumps(InferRequest("m", inputs=[Tensor("A", "INT32", (1,), b"\0" * 4)])))
    assert (request.model_name, request.inputs[0].name, bytes(request.inputs[0].data)) == ("m", "A", b"\0" * 4)
    tensor = pickle.loads(pickle.dumps(pb_utils.Tensor("x", np.arange(3, dtype=np.float32))))
    np.testing.assert_array_equal(tensor.as_numpy(), np.arange(3, dtype=np.float32))
