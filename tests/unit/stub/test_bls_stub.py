"""The stub side of BLS (pystub_backend/stub/features/bls.py, pystub_backend/stub/features/bls_outputs.py)
against a fake backend: real arenas,
frames captured. Inputs go into s2p and are freed by the final response; outputs are zero-copy views
of p2s given back (BlsCleanup) when the model drops them; deadlines cancel; iterators credit,
replay and cancel when dropped; BLS is refused outside the ready phase."""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pystub_backend.ipc import names, tensors
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.messages.bls import BlsCancel, BlsCleanup, BlsRequest, BlsResponse
from pystub_backend.ipc.messages.core import RESPONSE_FINAL
from pystub_backend.stub import pb_utils
from pystub_backend.stub.features import bls
from pystub_backend.stub.pb_utils import _runtime
from pystub_backend.stub.reader import ReadOwnership

FINAL = RESPONSE_FINAL


class FakeBackend:
    """The stub's peer: sees the frames the stub sends, writes outputs into the stub's p2s."""

    def __init__(self, base: str) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()
        self.p2s = ArenaWriter(base, "p2s", 1 << 16, 1 << 16)
        self.s2p_view = ArenaReader(base, "s2p")
        self.stub_p2s: ArenaReader | None = None  # the stub's reader: gets p2s segments as a frame would bring them

    def take(self, kind: type, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                frame = self.frames.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(frame, kind):
                return frame
        raise AssertionError(f"no {kind.__name__} frame within {timeout} s")

    def output(self, name: str, array: np.ndarray) -> list[Any]:
        placed = tensors.place(self.p2s, name, "FP32", list(array.shape), array)
        if self.stub_p2s is not None:
            self.stub_p2s.add_fds(self.p2s.take_new_fds())  # as the channel would, with the response frame
        return placed

    def receive(self, stub: Any, message: Any) -> None:
        """A frame from the stub: the s2p segments it created ride along, as on the channel."""
        self.s2p_view.add_fds(stub.s2p.take_new_fds())
        self.frames.put(message)


@contextlib.contextmanager
def fake_stub() -> Iterator[tuple[Any, FakeBackend]]:
    base = names.stub_base_name("pystub")
    backend = FakeBackend(base)
    stub = SimpleNamespace(
        s2p=ArenaWriter(base, "s2p", 1 << 16, 1 << 16), p2s=ArenaReader(base, "p2s"),
        options=SimpleNamespace(send_timeout=5.0), decoupled=False,
        control=SimpleNamespace(execute_start=0.0), loop=SimpleNamespace(_thread=None),
        log_error=lambda text: None, reading=ReadOwnership())
    stub.send = lambda message: backend.receive(stub, message)
    backend.stub_p2s = stub.p2s
    # The p2s arena's first segment exists from the start, as after a first request.
    backend.p2s.free(backend.p2s.allocate(1))
    try:
        yield stub, backend
    finally:
        _runtime.set_bls_handler(None)
        for resource in (stub.p2s, stub.s2p, backend.p2s, backend.s2p_view):
            resource.close()


def leaf_request(data: np.ndarray, timeout: int = 0) -> Any:
    return pb_utils.InferenceRequest(model_name="leaf", inputs=[pb_utils.Tensor("IN", data)],
                                     requested_output_names=["OUT"], timeout=timeout)


def in_thread(function: Any) -> queue.Queue:
    result: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: result.put(function()), daemon=True).start()
    return result


def test_sync_call_inputs_in_s2p_outputs_viewed_in_p2s_and_given_back():
    with fake_stub() as (stub, backend):
        client = bls.BlsClient(stub)
        data = np.arange(4, dtype=np.float32)
        answer = in_thread(lambda: client.exec(leaf_request(data), False))
        request = backend.take(BlsRequest)
        assert request.model_name == "leaf" and request.model_version == "" and request.holds is False
        wire_input = request.request[2][0]
        np.testing.assert_array_equal(tensors.to_array(backend.s2p_view, wire_input), data)
        assert stub.s2p.used > 0
        placed = backend.output("OUT", data + 1)
        client.on_response(BlsResponse(request.call_id, [request.call_id, FINAL, None, [placed], '{"k": 1}']))
        response = answer.get(timeout=5)
        assert stub.s2p.used == 0  # the final frees the inputs
        out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        np.testing.assert_array_equal(out, data + 1)
        assert not out.flags.writeable and response.parameters() == '{"k": 1}'
        view = out[1:]  # a view keeps the memory
        del response, out
        gc.collect()
        assert client.cleanup.leased == 1
        del view
        cleanup = backend.take(BlsCleanup)
        assert cleanup.handles == [placed[3]] and client.cleanup.leased == 0


def test_a_deadline_cancels_and_late_outputs_are_given_back():
    with fake_stub() as (stub, backend):
        client = bls.BlsClient(stub)
        started = time.monotonic()
        response = client.exec(leaf_request(np.ones(2, np.float32), timeout=100_000), False)
        assert 0.09 < time.monotonic() - started < 2
        assert response.error().code() == pb_utils.TritonError.UNAVAILABLE
        assert response.error().message() == ("Request timeout expired: the BLS request to model 'leaf' got no "
                                              "response within 0.1 s (the request's timeout); it was cancelled.")
        request = backend.take(BlsRequest)
        assert backend.take(BlsCancel).call_ids == [request.call_id]
        assert stub.s2p.used > 0  # the backend may still read the inputs
        placed = backend.output("OUT", np.ones(2, np.float32))
        client.on_response(BlsResponse(request.call_id, [request.call_id, FINAL, None, [placed], "{}"]))
        assert stub.s2p.used == 0
        assert backend.take(BlsCleanup).handles == [placed[3]]


def test_decoupled_iterator_credits_replays_and_errors():
    with fake_stub() as (stub, backend):
        client = bls.BlsClient(stub)
        iterator = client.exec(leaf_request(np.ones(1, np.float32)), True)
        request = backend.take(BlsRequest)
        call = request.call_id
        output = backend.output("OUT", np.array([5.0], np.float32))
        client.on_response(BlsResponse(call, [call, 0, None, [output], "{}"]))
        client.on_response(BlsResponse(call, [call, FINAL, [7, "stopped"], [], "{}"]))
        responses = list(iterator)
        assert [r.has_error() for r in responses] == [False, True]
        assert responses[1].error().message() == "stopped"
        assert backend.take(BlsCleanup).credits == [call]
        assert len(list(iterator)) == 2  # replayed
        iterator.cancel()  # after the final: nothing to cancel
        assert stub.s2p.used == 0


def test_a_dropped_iterator_cancels_its_call():
    with fake_stub() as (stub, backend):
        client = bls.BlsClient(stub)
        iterator = client.exec(leaf_request(np.ones(1, np.float32)), True)
        call = backend.take(BlsRequest).call_id
        del iterator
        gc.collect()
        assert backend.take(BlsCancel).call_ids == [call]
        placed = backend.output("OUT", np.array([1.0], np.float32))
        client.on_response(BlsResponse(call, [call, 0, None, [placed], "{}"]))  # late: given back at once
        client.on_response(BlsResponse(call, [call, FINAL, None, [], None]))
        assert backend.take(BlsCleanup).handles == [placed[3]]
        assert stub.s2p.used == 0 and client.in_flight() == 0


def test_bls_is_refused_until_ready_and_after_finalize_starts():
    with fake_stub() as (stub, _):
        request = leaf_request(np.ones(1, np.float32))
        with pytest.raises(pb_utils.TritonModelException, match="BLS is only supported during the 'execute' function."):
            request.exec()
        bls._enable(stub)
        assert _runtime.bls_handler() is not None
        bls._disable(stub)
        with pytest.raises(pb_utils.TritonModelException, match="BLS is only supported"):
            request.exec()
