"""EnsembleRun (backend/models/ensemble_run.py) against a fake core: tensors pass between steps as the very
same buffers (no copy in the backend), step responses are released only after everything built on
them is, decoupled steps fork one ensemble response each in order, and errors and cancels clean up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from pystub_backend.backend.config.model_config import normalize, parse_config_text
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.models.ensemble_config import EnsembleGraph
from pystub_backend.backend.models.ensemble_run import EnsembleRun
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.ipc.status import Status

Compute = Callable[[dict[str, np.ndarray]], Any]


def make_graph(steps: str, outputs: list[str]) -> EnsembleGraph:
    outs = ",".join(f'{{ name: "{o}", data_type: TYPE_FP32, dims: [ -1 ] }}' for o in outputs)
    config = parse_config_text(f"""name: "ens" platform: "ensemble"
        input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }} ] output [ {outs} ]
        ensemble_scheduling {{ step [ {steps} ] }}""", "test")
    return EnsembleGraph.from_config(normalize(config, "ens"))


def step(model: str, source: str, target: str) -> str:
    return f'{{ model_name: "{model}" input_map {{ key: "IN" value: "{source}" }} ' \
           f'output_map {{ key: "OUT" value: "{target}" }} }}'


class FakeCore:
    """`models[name](inputs)` returns OUT arrays: one (default) or a list (decoupled), or raises
    ServerError for an error response. Tracks requests, released responses and cancels."""

    def __init__(self, models: dict[str, Compute], decoupled: set[str] = frozenset()) -> None:
        self.models = models
        self.decoupled = set(decoupled)
        self.requests: list[InferRequest] = []
        self.outputs: dict[str, list[Any]] = {}  # model -> the buffers its responses carried
        self.released: list[str] = []
        self.live = 0
        self.cancelled: list[str] = []
        self._tasks: list[asyncio.Task] = []

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return name in self.decoupled

    def _response(self, request: InferRequest, array: np.ndarray) -> InferResponse:
        buffer = memoryview(bytearray(array.astype(np.float32).tobytes()))
        self.outputs.setdefault(request.model_name, []).append(buffer)
        self.live += 1

        def release() -> None:
            self.live -= 1
            self.released.append(request.model_name)

        return InferResponse(request.model_name, "1", request.id, [Tensor("OUT", "FP32", (array.size,), buffer)],
                             release=release)

    async def infer_stream(self, request: InferRequest) -> ResponseStream:
        self.requests.append(request)
        stream = ResponseStream(request.id, request.model_name, lambda: self.cancelled.append(request.model_name))
        inputs = {t.name: np.frombuffer(t.data, np.float32) for t in request.inputs}
        self._tasks.append(asyncio.ensure_future(self._produce(request, stream, inputs)))
        return stream

    async def _produce(self, request: InferRequest, stream: ResponseStream, inputs: dict[str, np.ndarray]) -> None:
        try:
            result = self.models[request.model_name](inputs)
        except ServerError as error:
            stream.fail(error)
            return
        if request.model_name not in self.decoupled:
            stream.put(self._response(request, result), True)
            return
        for array in result:
            await asyncio.sleep(0.001)
            if stream.cancelled:
                break
            stream.put(self._response(request, array), False)
        stream.put(InferResponse(request.model_name, "1", request.id, flags_only=True), True)


async def run(core: FakeCore, graph: EnsembleGraph, x: np.ndarray, consume: bool = True,
              requested: list[str] | None = None) -> tuple[ResponseStream, list[InferResponse], EnsembleRun]:
    request = InferRequest("ens", inputs=[Tensor("X", "FP32", (x.size,), memoryview(x.tobytes()))])
    if requested:
        from pystub_backend.backend.inference import RequestedOutput
        request.outputs = [RequestedOutput(name) for name in requested]
    stream = ResponseStream("", "ens", lambda: None)
    steps = {s.index for s in graph.steps if core.is_decoupled(s.model_name)}
    ensemble = EnsembleRun(core, graph, request, stream, steps, bool(steps))
    task = asyncio.ensure_future(ensemble.run())
    stream._on_cancel = task.cancel  # what EnsembleScheduler wires
    responses = [r async for r in stream] if consume else []
    await asyncio.gather(task, return_exceptions=True)
    return stream, responses, ensemble


def test_steps_pass_the_very_same_buffers_and_release_after_the_consumer():
    async def main() -> None:
        core = FakeCore({"add": lambda i: i["IN"] + 1, "double": lambda i: i["IN"] * 2})
        graph = make_graph(step("add", "X", "t") + "," + step("double", "t", "Y") + "," + step("add", "X", "Z"),
                           ["Y", "Z"])
        stream, responses, _ = await run(core, graph, np.arange(3, dtype=np.float32))
        (response,) = responses
        assert response.final and response.error is None
        # the 'double' step read the 'add' step's own buffer: no copy in between
        double_request = next(r for r in core.requests if r.model_name == "double")
        assert double_request.inputs[0].data in core.outputs["add"]
        outputs = {t.name: t for t in response.outputs}
        assert outputs["Y"].data is core.outputs["double"][0]
        np.testing.assert_array_equal(np.frombuffer(outputs["Y"].data, np.float32), [2, 4, 6])
        np.testing.assert_array_equal(np.frombuffer(outputs["Z"].data, np.float32), [1, 2, 3])
        assert core.live == 3  # held for the consumer
        response.release()
        assert core.live == 0 and sorted(core.released) == ["add", "add", "double"]

    asyncio.run(main())


def test_requested_outputs_only():
    async def main() -> None:
        core = FakeCore({"add": lambda i: i["IN"] + 1})
        graph = make_graph(step("add", "X", "Y") + "," + step("add", "Y", "Z"), ["Y", "Z"])
        _, (response,), _ = await run(core, graph, np.zeros(2, np.float32), requested=["Z"])
        assert [t.name for t in response.outputs] == ["Z"]
        response.release()
        assert core.live == 0

    asyncio.run(main())


def test_a_decoupled_step_forks_one_response_each_in_order():
    async def main() -> None:
        core = FakeCore({"gen": lambda i: [i["IN"] + 10 * k for k in range(4)], "add": lambda i: i["IN"] + 1},
                        decoupled={"gen"})
        graph = make_graph(step("gen", "X", "g") + "," + step("add", "g", "Y"), ["Y"])
        _, responses, _ = await run(core, graph, np.zeros(2, np.float32))
        data = [r for r in responses if not r.flags_only]
        assert [float(np.frombuffer(r.outputs[0].data, np.float32)[0]) for r in data] == [1, 11, 21, 31]
        assert not any(r.final for r in data) and responses[-1].flags_only and responses[-1].final
        for response in data:
            response.release()
        assert core.live == 0

    asyncio.run(main())


def test_a_step_error_fails_the_request_and_releases_everything():
    async def main() -> None:
        def broken(inputs: dict[str, np.ndarray]) -> Any:
            raise ServerError("broken step", Status.INVALID_ARG)

        core = FakeCore({"add": lambda i: i["IN"] + 1, "broken": broken})
        graph = make_graph(step("add", "X", "t") + "," + step("broken", "X", "u") + "," + step("add", "t", "Y"),
                           ["Y"])
        stream, responses, _ = await run(core, graph, np.zeros(2, np.float32))
        assert [r.error.message for r in responses] == ["broken step"]
        assert stream.error is not None and stream.error.status == Status.INVALID_ARG
        await asyncio.sleep(0.05)
        assert core.live == 0

    asyncio.run(main())


def test_cancel_cancels_the_steps_and_ends_the_stream():
    async def main() -> None:
        core = FakeCore({"gen": lambda i: [i["IN"]] * 1000, "add": lambda i: i["IN"] + 1}, decoupled={"gen"})
        graph = make_graph(step("gen", "X", "g") + "," + step("add", "g", "Y"), ["Y"])
        request = InferRequest("ens", inputs=[Tensor("X", "FP32", (1,), memoryview(b"\0\0\0\0"))])
        stream = ResponseStream("", "ens", lambda: None)
        task = asyncio.ensure_future(EnsembleRun(core, graph, request, stream, {0}, True).run())
        stream._on_cancel = task.cancel
        first = await stream.next()
        first.release()
        stream.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.05)
        assert stream.finished and "gen" in core.cancelled
        assert core.live == 0

    asyncio.run(main())
