"""Implicit state (`sequence_batching { state [...] }`) on a real backend, as Triton 2.51 serves a
Python model (measured on it with the same `state_probe` model):

- every request of a sequence carries the state input (next to the control inputs), and it holds
  the *initial* state each time (zero_data, or the bytes of `initial_state/<data_file>`): the
  Python backend never feeds the model's state output back, so the state does not advance;
- the state output is taken out of the response: the client sees only the config's outputs; asking
  for the state output, or sending the state input, is refused with Triton's texts;
- a missing or short data_file fails the load with Triton's texts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

MODEL = "state_probe"


def add_variant(repository: Path, name: str, initial: str, files: dict[str, bytes]) -> None:
    """A copy of state_probe named `name` whose initial_state says `initial` instead of zero_data."""
    (repository / name / "1").mkdir(parents=True)
    config = (repository / MODEL / "config.pbtxt").read_text().replace("zero_data: true", initial)
    (repository / name / "config.pbtxt").write_text(config)
    (repository / name / "1" / "model.py").write_text((repository / MODEL / "1" / "model.py").read_text())
    for file_name, data in files.items():
        (repository / name / "initial_state").mkdir(exist_ok=True)
        (repository / name / "initial_state" / file_name).write_bytes(data)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = make_repository(Path(tmp_path_factory.mktemp("state")), MODEL)
    add_variant(repository, "state_file", 'data_file: "init.bin"', {"init.bin": np.float32(100).tobytes()})
    add_variant(repository, "state_missing", 'data_file: "nofile.bin"', {})
    add_variant(repository, "state_short", 'data_file: "short.bin"', {"short.bin": b"ab"})
    return repository


@pytest.fixture(scope="module")
def backend(repository: Path) -> Iterator[Backend]:
    with module_backend(Backend(repository, "--exit-on-error=false")) as started:
        yield started


def infer(grpc: Any, model: str, value: float, sequence: int, start: bool = False, end: bool = False,
          outputs: list[str] | None = None, state: float | None = None) -> dict[str, Any]:
    inputs = [grpcclient.InferInput("INPUT", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([value], np.float32))
    if state is not None:
        inputs.append(grpcclient.InferInput("INPUT_STATE", [1], "FP32"))
        inputs[1].set_data_from_numpy(np.array([state], np.float32))
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    result = grpc.infer(model, inputs, sequence_id=sequence, sequence_start=start, sequence_end=end,
                        outputs=requested)
    names = [output.name for output in result.get_response().outputs]
    return {"names": names, "output": result.as_numpy("OUTPUT").tolist(),
            "seen": json.loads(result.as_numpy("SEEN")[0])}


@pytest.mark.parametrize(("model", "initial"), [(MODEL, 0.0), ("state_file", 100.0)])
def test_each_request_carries_the_initial_state(backend: Backend, grpc: Any, model: str, initial: float) -> None:
    sequence = 41 if model == MODEL else 42
    answers = [infer(grpc, model, value, sequence, start=value == 1, end=value == 3) for value in (1, 2, 3)]
    for value, answer in zip((1, 2, 3), answers, strict=True):
        assert answer["seen"] == {"inputs": ["INPUT", "INPUT_STATE"], "state": [initial]}
        assert answer["output"] == [value + initial]  # the state did not advance (as on Triton 2.51)
        assert answer["names"] == ["OUTPUT", "SEEN"]  # OUTPUT_STATE is not returned


def test_asking_for_the_state_output_is_refused(backend: Backend, grpc: Any) -> None:
    infer(grpc, MODEL, 1, 43, start=True)
    with pytest.raises(InferenceServerException, match="unexpected inference output 'OUTPUT_STATE' for model "
                                                       "'state_probe'"):
        infer(grpc, MODEL, 1, 43, end=True, outputs=["OUTPUT", "OUTPUT_STATE"])


def test_sending_the_state_input_is_refused(backend: Backend, grpc: Any) -> None:
    with pytest.raises(InferenceServerException, match="expected 1 inputs but got 2 inputs for model 'state_probe'"):
        infer(grpc, MODEL, 1, 44, start=True, end=True, state=5.0)


@pytest.mark.parametrize(("model", "text"), [
    ("state_missing", "failed to open text file for read {dir}/state_missing/initial_state/nofile.bin: "
                      "No such file or directory"),
    ("state_short", "initial_state setting expects 4 bytes, but the data provided from short.binonly has 2 bytes."),
])
def test_bad_data_files_fail_the_load(backend: Backend, grpc: Any, repository: Path, model: str, text: str) -> None:
    rows = {row.name: row for row in grpc.get_model_repository_index().models}
    assert rows[model].state == "UNAVAILABLE"
    assert rows[model].reason == text.format(dir=repository)
