"""`execute_batch` in the stub (pystub_backend/stub/batched.py): config defaults and their checks, concatenation
and splitting, grouping of requests that cannot be concatenated, per-request rejection, failures
confined to their group, async execute_batch, and models without a batch dimension."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from pystub_backend.stub import pb_utils
from pystub_backend.stub.batched import BatchConfigError, BatchedExecute, parse_defaults
from pystub_backend.stub.executor import run_execute


def config(max_batch_size: int = 8, defaults: dict[str, str] | None = None, **dims: list[int]) -> dict[str, Any]:
    inputs = [{"name": "X", "data_type": "TYPE_FP32", "dims": dims.get("X", [2]), "optional": False},
              {"name": "S", "data_type": "TYPE_FP32", "dims": dims.get("S", [1]), "optional": True},
              {"name": "T", "data_type": "TYPE_STRING", "dims": dims.get("T", [1]), "optional": True},
              {"name": "E", "data_type": "TYPE_INT32", "dims": [1], "optional": True}]
    parameters = {f"default:{name}": {"string_value": value} for name, value in (defaults or {}).items()}
    return {"name": "m", "max_batch_size": max_batch_size, "input": inputs, "parameters": parameters}


def request(**inputs: Any) -> Any:
    tensors = [pb_utils.Tensor._from_array(name, np.asarray(value)) for name, value in inputs.items()]
    return pb_utils.InferenceRequest._from_server(
        inputs=tensors, request_id="", correlation_id=0, flags=0, timeout=0, parameters_json="{}",
        requested_output_names=set(), model_name="m", model_version=1, response_sender=None)


class Model:
    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    def execute_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(inputs)
        if (inputs["X"] == 666).any():
            raise ValueError("boom")
        y = inputs["X"] * inputs.get("S", 1)
        return {"Y": y.astype(np.float32), "T": inputs.get("T", np.full((len(y), 1), b"", object))}


def run(batched: BatchedExecute, model: Any, requests: list[Any]) -> tuple[list[Any], list[str]]:
    errors: list[str] = []
    return batched.run(model, requests, lambda awaitable: asyncio.run(_wrap(awaitable)), errors.append), errors


async def _wrap(awaitable: Any) -> Any:
    return await awaitable


def outputs(response: Any) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


X1 = np.array([[1, 2]], np.float32)
X2 = np.array([[3, 4], [5, 6]], np.float32)


def test_defaults_are_filled_and_the_batch_runs_in_one_call() -> None:
    batched = BatchedExecute(config(defaults={"S": "2", "T": '"dflt"'}), "m_0_0")
    model = Model()
    given = request(X=X1, S=np.array([[10]], np.float32), T=np.array([[b"x"]], object))
    responses, errors = run(batched, model, [request(X=X1), request(X=X2), given])
    assert not errors and len(model.calls) == 1
    np.testing.assert_array_equal(model.calls[0]["S"], [[2], [2], [2], [10]])
    assert model.calls[0]["T"].tolist() == [[b"dflt"]] * 3 + [[b"x"]]
    np.testing.assert_array_equal(outputs(responses[0])["Y"], X1 * 2)
    np.testing.assert_array_equal(outputs(responses[1])["Y"], X2 * 2)
    np.testing.assert_array_equal(outputs(responses[2])["Y"], X1 * 10)
    assert outputs(responses[2])["T"].tolist() == [[b"x"]]


def test_an_optional_input_without_default_splits_the_batch_into_groups() -> None:
    batched = BatchedExecute(config(), "m_0_0")
    model = Model()
    responses, _ = run(batched, model, [request(X=X1), request(X=X1, E=np.array([[1]], np.int32)), request(X=X2)])
    assert [sorted(call) for call in model.calls] == [["X"], ["E", "X"]]
    assert model.calls[0]["X"].shape == (3, 2)
    assert all(not r.has_error() for r in responses)


def test_a_missing_required_input_fails_that_request_alone() -> None:
    batched = BatchedExecute(config(), "m_0_0")
    responses, _ = run(batched, Model(), [request(S=np.array([[1]], np.float32)), request(X=X1)])
    assert responses[0].has_error() and responses[0].error().code() == pb_utils.TritonError.INVALID_ARG
    assert "input 'X' is required by model 'm'" in responses[0].error().message()
    assert not responses[1].has_error()


def test_an_exception_fails_only_its_group_with_the_batch_failure_text() -> None:
    batched = BatchedExecute(config(), "m_0_0")
    responses, errors = run(batched, Model(), [request(X=X1), request(X=np.full((1, 2), 666, np.float32)),
                                               request(X=X1, E=np.array([[1]], np.int32))])
    raise_line = Model.execute_batch.__code__.co_firstlineno + 3   # the model's frame, as Triton's "At:" tail
    text = ("Failed to process the request(s) for model 'm_0_0', message: ValueError: boom"
            f"\n\nAt:\n  {__file__}({raise_line}): execute_batch\n")
    assert [r.error().message() if r.has_error() else None for r in responses] == [text, text, None]
    assert errors and errors[0].startswith(text) and "Traceback" in errors[0]


@pytest.mark.parametrize(("result", "message"), [
    ([1, 2], "must return a dict of output name to numpy array, found type '<class 'list'>'"),
    ({"Y": [1]}, "found str -> list"),
    ({"Y": np.zeros((2, 1))}, "output 'Y' of execute_batch has shape [2, 1], but the batch has 3 element(s)"),
    ({"Y": np.array(["a", "b", "c"])}, "NumPy dtype is not supported."),
])
def test_a_malformed_return_fails_the_group(result: Any, message: str) -> None:
    class Bad:
        def execute_batch(self, inputs: dict[str, np.ndarray]) -> Any:
            return result

    responses, _ = run(BatchedExecute(config(), "m_0_0"), Bad(), [request(X=X1), request(X=X2)])
    assert all(message in r.error().message() for r in responses)


def test_async_execute_batch_and_run_execute_dispatch() -> None:
    class AsyncModel:
        async def execute_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            await asyncio.sleep(0)
            return {"Y": inputs["X"] + 1}

    class Loop:
        def submit(self, coroutine: Any) -> Any:
            class Done:
                def result(self) -> Any:
                    return asyncio.run(coroutine)
            return Done()

    batched = BatchedExecute(config(), "m_0_0")
    responses = run_execute(AsyncModel(), [request(X=X1), request(X=X2)], False, Loop(), print, batched)
    np.testing.assert_array_equal(outputs(responses[1])["Y"], X2 + 1)


def test_without_a_batch_dimension_each_request_runs_alone() -> None:
    batched = BatchedExecute(config(max_batch_size=0, defaults={"S": "3"}), "m_0_0")
    model = Model()
    responses, _ = run(batched, model, [request(X=np.array([1, 2], np.float32)),
                                        request(X=np.array([3, 4], np.float32))])
    assert len(model.calls) == 2 and model.calls[0]["S"].tolist() == [3.0]
    np.testing.assert_array_equal(outputs(responses[1])["Y"], [9.0, 12.0])


def test_defaults_broadcast_to_dims_and_fill_variable_dims_from_the_value() -> None:
    defaults = parse_defaults(config(defaults={"S": "1.5", "T": '["a", "b"]'}, S=[2, 2], T=[-1]))
    assert defaults["S"].tolist() == [[1.5, 1.5], [1.5, 1.5]] and defaults["S"].dtype == np.float32
    assert defaults["T"].tolist() == [b"a", b"b"] and defaults["T"].dtype == object


@pytest.mark.parametrize(("defaults", "dims", "message"), [
    ({"X": "1"}, {}, "input 'X' is not optional"),
    ({"NOPE": "1"}, {}, "names no input"),
    ({"S": "[1,"}, {}, "is not valid JSON"),
    ({"S": '"text"'}, {}, "cannot convert"),
    ({"S": "[1, 2]"}, {}, "does not fit dims [1]"),
    ({"T": '"a"'}, {"T": [-1]}, "must have 1 dim(s)"),
])
def test_bad_defaults_are_refused(defaults: dict[str, str], dims: dict[str, list[int]], message: str) -> None:
    with pytest.raises(BatchConfigError) as caught:
        parse_defaults(config(defaults=defaults, **dims))
    assert message in str(caught.value) and "config parameter 'default:" in str(caught.value)


def test_create_needs_execute_batch_and_refuses_decoupled_models() -> None:
    text = json.dumps(config())
    assert BatchedExecute.create(object, text, "m_0_0", False) is None
    assert isinstance(BatchedExecute.create(Model, text, "m_0_0", False), BatchedExecute)
    with pytest.raises(BatchConfigError, match="decoupled"):
        BatchedExecute.create(Model, text, "m_0_0", True)
