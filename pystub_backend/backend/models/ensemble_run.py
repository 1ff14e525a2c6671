"""One ensemble request running through its data-flow graph (pystub_backend.backend.models.ensemble_config).

    request inputs ──▶ env {ensemble tensor: Tensor}
    repeat: every step whose inputs are all in env runs (Core.infer_stream, as its own request);
            a default step's response adds its outputs to env and may make other steps ready
    once nothing more can run: env holds the ensemble outputs → one ensemble response

Tensors are never copied between steps: a step's outputs are views of its stub's s2p arena, and
the next step's request carries those same views, which its stub process copies once, into its
own p2s arena (as for any client request). The step responses therefore stay unreleased until
every step that reads them has been placed and the ensemble responses built on them have been
released by whoever consumed them.

Decoupled steps stream through. Each response of a decoupled step continues the graph on its own
(a "lineage" forked from the one that ran the step, with that response's outputs added), so a
generator followed by a post-processing step yields one ensemble response per generated
response, in order (forks run one after another). The ensemble then answers like a decoupled
model: zero or more responses, then a flags-only final. A step error (an error response, a
refused request) fails the ensemble request with that step's error and cancels the rest.

    _Node  the step responses of one lineage; released when the lineage, its forks and the
           ensemble responses built on it are all done (a reference count)
"""

from __future__ import annotations

import asyncio
from typing import Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from pystub_backend.backend.models.ensemble_config import EnsembleGraph, EnsembleStep
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.services import StubFacingCore
from pystub_backend.ipc.status import Status

__all__ = ["EnsembleRun", "CANCELLED_TEXT"]

CANCELLED_TEXT = "Request was cancelled"


_draining: set[asyncio.Task[None]] = set()


def _discard(stream: ResponseStream) -> None:
    """Give up on a step's stream: cancel it and release whatever it still delivers."""
    stream.cancel()
    task = asyncio.ensure_future(_drain(stream))
    _draining.add(task)
    task.add_done_callback(_draining.discard)


async def _drain(stream: ResponseStream) -> None:
    async for response in stream:
        response.release()


class _StepError(Exception):
    def __init__(self, error: ServerError) -> None:
        super().__init__(error.message)
        self.error = error


class _Node:
    __slots__ = ("parent", "responses", "refs")

    def __init__(self, parent: _Node | None = None) -> None:
        self.parent = parent
        self.responses: list[InferResponse] = []
        self.refs = 1
        if parent is not None:
            parent.refs += 1

    def unref(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            responses, self.responses = self.responses, []
            for response in responses:
                response.release()
            if self.parent is not None:
                self.parent.unref()


class EnsembleRun:
    def __init__(self, core: StubFacingCore, graph: EnsembleGraph, request: InferRequest, stream: ResponseStream,
                 decoupled_steps: set[int], decoupled: bool) -> None:
        self.core = core
        self.graph = graph
        self.request = request
        self.stream = stream
        self.decoupled_steps = decoupled_steps  # steps whose model is decoupled (forks)
        self.decoupled = decoupled  # answers as a decoupled model (many responses, flags-only final)
        self.emitted = 0
        self._streams: set[ResponseStream] = set()

    # -- running -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run the graph to the end; the stream always gets a final response. Never raises but
        CancelledError."""
        root = _Node()
        try:
            await self._lineage(root, {tensor.name: tensor for tensor in self.request.inputs}, set())
            if self.decoupled:
                self.stream.put(InferResponse(self.graph.name, "", self.request.id, flags_only=True), True)
            elif not self.emitted:
                raise _StepError(ServerError(f"ensemble '{self.graph.name}' produced no response", Status.INTERNAL))
        except _StepError as failure:
            self._abort(failure.error)
        except asyncio.CancelledError:
            self._abort(ServerError(CANCELLED_TEXT, Status.CANCELLED))
            raise
        finally:
            root.unref()

    def _abort(self, error: ServerError) -> None:
        for stream in list(self._streams):
            _discard(stream)
        self._streams.clear()
        self.stream.fail(error)

    async def _lineage(self, node: _Node, env: dict[str, Tensor], started: set[int]) -> None:
        started = set(started)
        running: dict[asyncio.Future[Any], EnsembleStep] = {}
        forks: list[tuple[EnsembleStep, ResponseStream]] = []

        def launch() -> None:
            for step in self.graph.ready_steps(env, started):
                started.add(step.index)
                running[asyncio.ensure_future(self._start(step, env))] = step

        launch()
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                failure: _StepError | None = None
                for future in done:  # keep every result (responses must be released) before failing
                    step = running.pop(future)
                    try:
                        result = future.result()
                    except _StepError as exc:
                        failure = failure or exc
                        continue
                    if isinstance(result, ResponseStream):
                        forks.append((step, result))
                    else:
                        node.responses.append(result)
                        try:
                            env.update(self._outputs(step, result))
                        except _StepError as exc:
                            failure = failure or exc
                if failure is not None:
                    raise failure
                launch()
        finally:
            for future in running:
                future.cancel()
        if not forks:
            self._emit(node, env)
        for step, stream in forks:
            await self._fork_each(node, env, started, step, stream)

    async def _fork_each(self, node: _Node, env: dict[str, Tensor], started: set[int], step: EnsembleStep,
                         stream: ResponseStream) -> None:
        """Continue the graph once per response of decoupled `step`, one response after another."""
        async for response in stream:
            if response.error is not None:
                response.release()
                raise _StepError(response.error)
            if response.flags_only or not response.outputs:
                response.release()
                continue
            child = _Node(node)
            child.responses.append(response)
            try:
                child_env = dict(env)
                child_env.update(self._outputs(step, response))
                await self._lineage(child, child_env, started)
            finally:
                child.unref()
        self._streams.discard(stream)  # consumed to the end

    async def _start(self, step: EnsembleStep, env: dict[str, Tensor]) -> Any:
        """Run the step: its response (default models) or its response stream (decoupled models,
        consumed by the caller). Raises _StepError."""
        inputs = [Tensor(name, env[tensor].datatype, env[tensor].shape, env[tensor].data)
                  for name, tensor in step.input_map.items()]
        request = InferRequest(step.model_name, step.model_version, self.request.id, inputs,
                               [RequestedOutput(name) for name in step.output_map],
                               dict(self.request.parameters), correlation_id=self.request.correlation_id,
                               flags=self.request.flags)
        try:
            stream = await self.core.infer_stream(request)
        except ServerError as exc:
            raise _StepError(exc) from None
        self._streams.add(stream)  # until consumed: an abort cancels and drains what is left
        if step.index in self.decoupled_steps:
            return stream
        try:
            response = await stream.single()
        except ServerError as exc:
            raise _StepError(exc) from None
        self._streams.discard(stream)
        return response

    def _outputs(self, step: EnsembleStep, response: InferResponse) -> dict[str, Tensor]:
        """The response's outputs under their ensemble names. Raises _StepError when one is missing."""
        produced = {tensor.name: tensor for tensor in response.outputs}
        missing = sorted(set(step.output_map) - set(produced))
        if missing:
            raise _StepError(ServerError(f"in ensemble '{self.graph.name}', {step.label} did not return "
                                         f"output(s) {missing}", Status.INTERNAL))
        return {tensor_name: produced[output] for output, tensor_name in step.output_map.items()}

    def _emit(self, node: _Node, env: dict[str, Tensor]) -> None:
        """One ensemble response from `env` (the requested outputs, else all)."""
        names = [output.name for output in self.request.outputs] or self.graph.outputs
        missing = [name for name in names if name not in env]
        if missing:
            raise _StepError(ServerError(
                f"in ensemble '{self.graph.name}', output(s) {missing} were not produced: the steps writing them "
                f"could not run (a decoupled step's response lacked their inputs)", Status.INTERNAL))
        outputs = [Tensor(name, env[name].datatype, env[name].shape, env[name].data) for name in names]
        node.refs += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                node.unref()

        self.emitted += 1
        self.stream.put(InferResponse(self.graph.name, "", self.request.id, outputs, {}, release),
                        final=not self.decoupled)
