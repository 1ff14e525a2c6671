"""Sequence batching through a real backend and real stubs, with tritonclient over HTTP
and gRPC: the direct and oldest strategies, control inputs, correlation ids as uint64 and string,
routing to one instance, the backlog, bad input, and eviction the model sees (idle timeout, a gRPC
stream closed mid-sequence, an HTTP client gone, a cancelled request, unload), plus iterative
sequences with request rescheduling.

`seq_probe` keeps a running sum per sequence and reports its call (BATCH, CALL, PID, LIVE, the
control inputs); its `sequence_evicted` logs `EVICTED cid=<repr> reason=<r> at=<time.time()>`,
which the tests read back to measure when the hook ran.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import ROOT, TEST_MODELS, Backend, module_backend
from tritonclient.utils import InferenceServerException

OUTPUTS = TEST_MODELS / "seq_probe" / "config.pbtxt"
CONTROLS = """control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]"""

PROBES = {
    "seq_direct": ("max_batch_size: 4", "max_sequence_idle_microseconds: 30000000\n"
                   "direct { max_queue_delay_microseconds: 200000 }\n" + CONTROLS % "TYPE_UINT64"),
    "seq_strings": ("max_batch_size: 2", CONTROLS % "TYPE_STRING"),
    "seq_oldest": ("max_batch_size: 4", "max_sequence_idle_microseconds: 30000000\n"
                   "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                   "max_queue_delay_microseconds: 1500000 }"),
    "seq_instances": ("max_batch_size: 2\ninstance_group [ { count: 2 } ]",
                      "max_sequence_idle_microseconds: 30000000\ndirect { }"),
    "seq_one_slot": ("max_batch_size: 1", "max_sequence_idle_microseconds: 30000000\ndirect { }"),
    "seq_stream": ("max_batch_size: 1", "max_sequence_idle_microseconds: 30000000\ndirect { }"),
    "seq_idle": ('max_batch_size: 1\nparameters { key: "ASYNC_HOOK" value: { string_value: "1" } }',
                 "max_sequence_idle_microseconds: 1000000\ndirect { }"),
    "seq_restart": ("max_batch_size: 1", "max_sequence_idle_microseconds: 30000000\ndirect { }"),
    "seq_unload": ("max_batch_size: 2", "max_sequence_idle_microseconds: 30000000\ndirect { }"),
    "seq_probe_iterative": ("max_batch_size: 1", "iterative_sequence: true\ndirect { }"),
}
ITERATIVE = {
    "iter_decoupled": "model_transaction_policy { decoupled: true }\nsequence_batching { iterative_sequence: true "
                      "direct { max_queue_delay_microseconds: 500000 minimum_slot_utilization: 0.5 } }",
    "iter_default": "sequence_batching { iterative_sequence: true }",
    "iter_answers": 'parameters { key: "MODE" value: { string_value: "answer_rescheduled" } }\n'
                    "sequence_batching { iterative_sequence: true }",
    "iter_not_sequence": "",
}
EVICTED = re.compile(r"\[(\w+?)_0(?:_\d)?\] EVICTED cid=(\S+) reason=(\w+) at=([\d.]+)")


def _write(repository: Path, name: str, source: str, config: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    shutil.copy(TEST_MODELS / source / "1" / "model.py", repository / name / "1" / "model.py")
    (repository / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = tmp_path_factory.mktemp("sequences") / "models"
    outputs = OUTPUTS.read_text()
    io = outputs[outputs.index("input ["):outputs.index("sequence_batching")]
    for name, (head, batching) in PROBES.items():
        body = f'backend: "python"\n{head}\n{io}\nsequence_batching {{\n{batching}\n}}\n'
        _write(repository, name, "seq_probe", body)
    iterative = (TEST_MODELS / "seq_iterative" / "config.pbtxt").read_text()
    iterative_io = iterative[iterative.index("max_batch_size"):iterative.index("model_transaction_policy")]
    for name, tail in ITERATIVE.items():
        _write(repository, name, "seq_iterative", f'backend: "python"\n{iterative_io}\n{tail}\n')
    shutil.copytree(ROOT / "examples" / "sequence_models" / "accumulate", repository / "accumulate")
    with module_backend(Backend(repository, "--model-control-mode=explicit", "--exit-timeout-secs=2",
                                *[f"--load-model={name}" for name in [*PROBES, *ITERATIVE, "accumulate"]])) as server:
        yield server


# -- clients -------------------------------------------------------------------------------------


def _inputs(module: Any, name: str, value: int) -> list[Any]:
    tensor = module.InferInput(name, [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def _result(result: Any) -> dict[str, Any]:
    values = {}
    for name in ("OUTPUT", "FLAGS", "BATCH", "CALL", "PID", "LIVE", "CORRID", "CONTROLS"):
        value = result.as_numpy(name).reshape(-1)[0]
        values[name] = value.decode() if isinstance(value, bytes) else int(value)
    values["CONTROLS"] = json.loads(values["CONTROLS"])
    return values


def infer(backend: Backend, model: str, value: int, cid: int | str, start: bool = False, end: bool = False,
          protocol: str = "http", **options: Any) -> dict[str, Any]:
    """One request of a sequence; raises InferenceServerException."""
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(backend.http_url if protocol == "http" else backend.grpc_url)
    try:
        return _result(client.infer(model, _inputs(module, "INPUT", value), sequence_id=cid, sequence_start=start,
                                    sequence_end=end, **options))
    finally:
        client.close()


def error_of(call: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.message()


def evictions(backend: Backend, model: str) -> list[tuple[str, str, float]]:
    return [(m.group(2), m.group(3), float(m.group(4))) for m in EVICTED.finditer(backend.log()) if m.group(1) == model]


def wait_eviction(backend: Backend, model: str, cid: str, timeout: float = 10.0) -> tuple[str, float]:
    """(reason, time.time() at which the model's hook ran) of the eviction of `cid` (its repr)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for seen, reason, at in evictions(backend, model):
            if seen == cid:
                return reason, at
        time.sleep(0.02)
    raise AssertionError(f"no eviction of {cid} for {model} within {timeout} s:\n{backend.log()[-3000:]}")


class Stream:
    """A gRPC stream of one client, with its responses in a queue."""

    def __init__(self, backend: Backend) -> None:
        self.client = grpcclient.InferenceServerClient(backend.grpc_url)
        self.responses: queue.Queue[Any] = queue.Queue()
        self.client.start_stream(lambda result, error: self.responses.put((result, error)))

    def send(self, model: str, value: int, cid: int | str, start: bool = False, end: bool = False,
             name: str = "INPUT", **options: Any) -> None:
        self.client.async_stream_infer(model, _inputs(grpcclient, name, value), sequence_id=cid,
                                       sequence_start=start, sequence_end=end, **options)

    def next(self, timeout: float = 10.0) -> Any:
        result, error = self.responses.get(timeout=timeout)
        if error is not None:
            raise error
        return result

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


# -- strategies, controls, routing ---------------------------------------------------------------


def test_direct_batches_one_request_per_sequence_in_order_with_control_inputs(backend: Backend) -> None:
    ids = [11, 12, 13, 2**64 - 5]

    def run(cid: int) -> list[dict[str, Any]]:
        # The first sequence's start keeps the one instance busy for 3 s: the other sequences'
        # starts wait in their slots meanwhile and go as one batch (on a loaded machine the
        # 200 ms queue delay alone may see them arrive one by one).
        hold = {"parameters": {"sleep_ms": 3000}} if cid == ids[0] else {}
        answers = [infer(backend, "seq_direct", 1, cid, start=True, **hold)]
        answers += [infer(backend, "seq_direct", value, cid) for value in (2, 3)]
        answers.append(infer(backend, "seq_direct", 4, cid, end=True))
        return answers

    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(ids, pool.map(run, ids), strict=True))
    for cid, answers in runs.items():
        assert [a["OUTPUT"] for a in answers] == [1, 3, 6, 10]  # in order, on the same state
        assert [a["FLAGS"] for a in answers] == [1, 0, 0, 2]
        assert all(a["CORRID"] == repr(cid) for a in answers)
        calls = [a["CALL"] for a in answers]
        assert calls == sorted(set(calls)), calls  # never two requests of one sequence in one batch
        first, middle, last = answers[0]["CONTROLS"], answers[1]["CONTROLS"], answers[3]["CONTROLS"]
        assert first == {"START": ["float32", 1.0], "END": ["bool", False], "READY": ["int32", 1],
                         "CORRID": ["uint64", cid]}
        assert middle["START"] == ["float32", 0.0] and middle["END"] == ["bool", False]
        assert last["START"] == ["float32", 0.0] and last["END"] == ["bool", True]
    assert max(a["BATCH"] for answers in runs.values() for a in answers) > 1  # the waiting slots went together
    assert max(a["BATCH"] for answers in runs.values() for a in answers) <= 4


def test_string_correlation_ids_and_a_string_corrid_control(backend: Backend) -> None:
    answer = infer(backend, "seq_strings", 5, "client-a", start=True, protocol="grpc")
    assert answer["CORRID"] == repr("client-a") and answer["CONTROLS"]["CORRID"] == ["object", "client-a"]
    numeric = infer(backend, "seq_strings", 1, 42, start=True, end=True)
    assert numeric["CORRID"] == "42" and numeric["CONTROLS"]["CORRID"] == ["object", "42"]
    assert infer(backend, "seq_strings", 2, "client-a", end=True)["OUTPUT"] == 7
    # a string id cannot fill a numeric CORRID control
    text = error_of(lambda: infer(backend, "seq_direct", 1, "text", start=True))
    assert "expects a UINT64 correlation ID" in text


def test_oldest_sends_a_preferred_batch_at_once_and_a_lone_request_after_the_delay(backend: Backend) -> None:
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(lambda cid: infer(backend, "seq_oldest", 1, cid, start=True), [21, 22]))
    pair_time = time.monotonic() - started
    assert [a["BATCH"] for a in pair] == [2, 2] and pair[0]["CALL"] == pair[1]["CALL"]
    started = time.monotonic()
    alone = infer(backend, "seq_oldest", 1, 21, end=True)
    alone_time = time.monotonic() - started
    assert alone["BATCH"] == 1 and alone["OUTPUT"] == 2
    assert pair_time < 1.0 and alone_time >= 1.3, (pair_time, alone_time)  # delay 1.5 s
    infer(backend, "seq_oldest", 1, 22, end=True)


def test_every_request_of_a_sequence_runs_on_the_same_instance(backend: Backend) -> None:
    ids = [31, 32, 33, 34]
    pids: dict[int, set[int]] = {cid: set() for cid in ids}
    for step in range(3):
        for cid in ids:
            pids[cid].add(infer(backend, "seq_instances", 1, cid, start=step == 0, end=step == 2)["PID"])
    assert all(len(seen) == 1 for seen in pids.values()), pids
    assert len(set.union(*pids.values())) == 2  # both instances served sequences


# -- the backlog and bad input -------------------------------------------------------------------


def test_a_new_sequence_waits_in_the_backlog_until_a_slot_frees(backend: Backend) -> None:
    infer(backend, "seq_one_slot", 1, 41, start=True)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(infer, backend, "seq_one_slot", 10, 42, True)
        time.sleep(0.5)
        assert not waiting.done()  # the only slot is taken
        ended = infer(backend, "seq_one_slot", 2, 41, end=True)
        second = waiting.result(timeout=10)
    assert ended["OUTPUT"] == 3 and second["OUTPUT"] == 10
    assert second["CALL"] > ended["CALL"]
    infer(backend, "seq_one_slot", 0, 42, end=True)


def test_bad_sequence_input_has_clear_answers(backend: Backend) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        text = error_of(lambda: client.infer("seq_direct", _inputs(httpclient, "INPUT", 1)))
    finally:
        client.close()
    assert text == "inference request to model 'seq_direct' must specify a non-zero or non-empty correlation ID"
    text = error_of(lambda: infer(backend, "seq_direct", 1, 4242, protocol="grpc"))
    assert text == ("inference request for sequence 4242 to model 'seq_direct' must specify the START flag on the "
                    "first request of the sequence")
    two = httpclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], np.int32))
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        text = error_of(lambda: client.infer("seq_direct", [two], sequence_id=5, sequence_start=True))
    finally:
        client.close()
    assert text == "inference request to model 'seq_direct' must specify batch-size 1 due to requirements of " \
                   "sequence batcher"


def test_a_second_start_for_a_live_sequence_restarts_it(backend: Backend) -> None:
    infer(backend, "seq_direct", 5, 51, start=True)
    assert infer(backend, "seq_direct", 5, 51)["OUTPUT"] == 10
    restarted = infer(backend, "seq_direct", 7, 51, start=True)
    assert restarted["OUTPUT"] == 7 and restarted["FLAGS"] == 1
    assert infer(backend, "seq_direct", 1, 51, end=True)["OUTPUT"] == 8
    backend.wait_for_log(r"sequence 51 of model 'seq_direct' got a new START before its END", timeout=5)
    assert not [e for e in evictions(backend, "seq_direct") if e[0] == "51"]


# -- eviction the model sees ---------------------------------------------------------------------


def test_an_idle_sequence_is_evicted_and_the_async_hook_runs_within_the_timeout_plus_one_second(
        backend: Backend) -> None:
    infer(backend, "seq_idle", 3, 61, start=True)
    answered = time.time()
    reason, at = wait_eviction(backend, "seq_idle", "61")
    assert reason == "idle_timeout"
    assert 0.9 <= at - answered <= 1.0 + 1.0, at - answered  # idle limit 1 s
    print(f"idle eviction: hook ran {at - answered:.3f} s after the last response (limit 1 s)")
    text = error_of(lambda: infer(backend, "seq_idle", 1, 61))
    assert "must specify the START flag" in text  # the sequence is gone
    assert infer(backend, "seq_idle", 1, 61, start=True, end=True)["LIVE"] == 0  # its state was freed


def test_a_failing_hook_is_logged_and_the_model_serves_on(backend: Backend) -> None:
    infer(backend, "seq_idle", 1, 666, start=True)
    assert wait_eviction(backend, "seq_idle", "666")[0] == "idle_timeout"
    backend.wait_for_log(r"sequence_evicted\(666, 'idle_timeout'\) of model 'seq_idle_0' raised RuntimeError: "
                         r"the hook failed on purpose", timeout=5)
    assert infer(backend, "seq_idle", 4, 667, start=True, end=True)["OUTPUT"] == 4


@pytest.mark.parametrize("cancel", [False, True], ids=["closed", "cancelled"])
def test_a_grpc_stream_closed_mid_sequence_evicts_it_and_the_backlog_takes_the_slot(
        backend: Backend, cancel: bool) -> None:
    cid, waiter = (71, 72) if not cancel else (73, 74)
    stream = Stream(backend)
    try:
        stream.send("seq_stream", 1, cid, start=True)
        stream.send("seq_stream", 2, cid)
        assert stream.next().as_numpy("OUTPUT").reshape(-1)[0] == 1
        assert stream.next().as_numpy("OUTPUT").reshape(-1)[0] == 3
        with ThreadPoolExecutor(1) as pool:
            backlogged = pool.submit(infer, backend, "seq_stream", 5, waiter, True)
            time.sleep(0.5)
            assert not backlogged.done()  # waits for the only slot
            closed = time.time()
            stream.close(cancel)
            second = backlogged.result(timeout=10)
            slot_reused = time.time() - closed
    finally:
        stream.client.close()
    reason, at = wait_eviction(backend, "seq_stream", str(cid))
    assert reason == "client_disconnected"
    assert at - closed <= 1.0 and slot_reused <= 1.0, (at - closed, slot_reused)
    print(f"stream {'cancelled' if cancel else 'closed'}: hook after {at - closed:.3f} s, backlogged sequence "
          f"answered after {slot_reused:.3f} s")
    assert second["OUTPUT"] == 5 and second["LIVE"] == 1  # the evicted sequence's state was freed
    infer(backend, "seq_stream", 0, waiter, end=True)


def test_a_sequence_that_ends_on_its_stream_is_not_evicted(backend: Backend) -> None:
    stream = Stream(backend)
    stream.send("seq_stream", 1, 75, start=True)
    stream.send("seq_stream", 1, 75, end=True)
    assert stream.next().as_numpy("OUTPUT").reshape(-1)[0] == 1
    assert stream.next().as_numpy("OUTPUT").reshape(-1)[0] == 2
    stream.close()
    time.sleep(0.3)
    assert not [e for e in evictions(backend, "seq_stream") if e[0] == "75"]


def test_an_http_client_gone_mid_request_evicts_its_sequence(backend: Backend) -> None:
    infer(backend, "seq_one_slot", 1, 81, start=True)
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=0.5)
    try:
        with pytest.raises((InferenceServerException, OSError)):  # the client timed out
            client.infer("seq_one_slot", _inputs(httpclient, "INPUT", 1), sequence_id=81,
                         parameters={"sleep_ms": 1500})
    finally:
        client.close()
    gone = time.time()
    reason, at = wait_eviction(backend, "seq_one_slot", "81")
    assert reason == "client_disconnected"
    assert at - gone <= 1.0 + 1.0  # after the running execute (1.5 s from the request) returned
    assert "must specify the START flag" in error_of(lambda: infer(backend, "seq_one_slot", 1, 81))


def test_a_cancelled_grpc_request_cancels_its_sequence(backend: Backend) -> None:
    infer(backend, "seq_one_slot", 1, 91, start=True, protocol="grpc")
    text = error_of(lambda: infer(backend, "seq_one_slot", 1, 91, protocol="grpc", client_timeout=0.5,
                                  parameters={"sleep_ms": 1000}))
    assert "Deadline Exceeded" in text
    assert wait_eviction(backend, "seq_one_slot", "91")[0] == "cancelled"


def test_unloading_the_model_evicts_its_sequences_before_finalize(backend: Backend) -> None:
    infer(backend, "seq_unload", 1, 101, start=True)
    infer(backend, "seq_unload", 1, "b", start=True, protocol="grpc")
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        client.unload_model("seq_unload")
    finally:
        client.close()
    finalize = backend.wait_for_log(r"\[seq_unload_0\] FINALIZE", timeout=10)
    seen = {cid: reason for cid, reason, _ in evictions(backend, "seq_unload")}
    assert seen == {"101": "unloading", "'b'": "unloading"}
    assert all(m.start() < finalize.start() for m in EVICTED.finditer(backend.log()) if m.group(1) == "seq_unload")


def test_a_sequence_whose_stub_restarted_must_start_again(backend: Backend) -> None:
    first = infer(backend, "seq_restart", 1, 141, start=True)
    os.kill(first["PID"], signal.SIGKILL)
    backend.wait_for_log(r"Stub process 'seq_restart_0' restarted", timeout=20)
    text = error_of(lambda: infer(backend, "seq_restart", 1, 141))
    assert text == ("sequence 141 of model 'seq_restart' was lost: the stub process that held its state restarted. "
                    "Start the sequence again.")
    again = infer(backend, "seq_restart", 2, 141, start=True, end=True)
    assert again["OUTPUT"] == 2 and again["PID"] != first["PID"]


def test_the_readme_example_frees_a_clients_state_when_its_stream_closes(backend: Backend) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        for value, start in ((5, True), (7, False)):
            tensor = grpcclient.InferInput("VALUE", [1, 1], "INT64")
            tensor.set_data_from_numpy(np.array([[value]], np.int64))
            client.async_stream_infer("accumulate", [tensor], sequence_id=201, sequence_start=start)
        sums = [int(answers.get(timeout=10)[0].as_numpy("SUM")[0][0]) for _ in range(2)]
    finally:
        client.stop_stream()
        client.close()
    assert sums == [5, 12]
    backend.wait_for_log(r"accumulate: freed the state of sequence 201 \(client_disconnected\); 0 sequence\(s\) left",
                         timeout=5)


# -- iterative sequences -------------------------------------------------------------------------


def test_a_decoupled_iterative_sequence_is_rescheduled_until_done(backend: Backend) -> None:
    stream = Stream(backend)
    try:
        stream.send("iter_decoupled", 3, 111, start=True, end=True, name="IN")
        stream.send("iter_decoupled", 2, 112, start=True, end=True, name="IN")
        pairs, batches = [], []
        for _ in range(5):
            result = stream.next()
            pairs.append((int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("RUNS")[0][0])))
            batches.append(int(result.as_numpy("BATCH")[0][0]))
    finally:
        stream.close()
    assert sorted(pairs) == sorted([(2, 1), (1, 2), (0, 3), (1, 1), (0, 2)])  # OUT = runs left, RUNS = runs
    assert max(batches) == 2  # the two iterative sequences ran in the same batches


def test_iterative_requests_without_a_correlation_id_are_sequences_of_their_own(backend: Backend) -> None:
    """As in Triton 2.51: an iterative sequence model needs no correlation id; each such request
    is its own sequence, rescheduled until done (decoupled over a stream, default mode over HTTP)."""
    stream = Stream(backend)
    try:
        stream.send("iter_decoupled", 3, 0, name="IN")
        stream.send("iter_decoupled", 2, 0, name="IN")
        pairs = []
        for _ in range(5):
            result = stream.next()
            pairs.append((int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("RUNS")[0][0])))
    finally:
        stream.close()
    assert sorted(pairs) == sorted([(2, 1), (1, 2), (0, 3), (1, 1), (0, 2)])
    for _ in range(2):
        result = _iterative(backend, "iter_default", 0)
        assert (int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("RUNS")[0][0])) == (1, 2)
    text = error_of(lambda: infer(backend, "seq_direct", 1, 0, start=True))
    assert "must specify a non-zero or non-empty correlation ID" in text  # not iterative: still required
    # What the model sees, as in Triton 2.51: a generated correlation id and START; each request
    # is a new sequence (the running sum restarts), and its slot is free again once it ran.
    seen = [infer(backend, "seq_probe_iterative", value, 0) for value in (5, 7)]
    assert [(answer["FLAGS"], answer["CORRID"], answer["OUTPUT"]) for answer in seen] == [(1, "1", 5), (1, "2", 7)]


def test_an_iterative_sequence_evicted_while_rescheduled_ends_cleanly(backend: Backend) -> None:
    stream = Stream(backend)
    try:
        stream.send("iter_decoupled", 100000, 151, start=True, end=True, name="IN")
        for _ in range(3):
            stream.next()
    finally:
        stream.close(cancel=True)
    backend.wait_for_log(r"sequence 151 of model 'iter_decoupled' evicted \(client_disconnected\)", timeout=5)
    stream = Stream(backend)  # the model serves on; nothing of the evicted request is left behind
    try:
        stream.send("iter_decoupled", 2, 152, start=True, end=True, name="IN")
        assert [int(stream.next().as_numpy("OUT")[0][0]) for _ in range(2)] == [1, 0]
    finally:
        stream.close()
    assert "answered unknown request" not in backend.log()


def test_a_default_mode_rescheduled_request_runs_again_and_answers_once(backend: Backend) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        result = client.infer("iter_default", _inputs(grpcclient, "IN", 9), sequence_id=121, sequence_start=True,
                              sequence_end=True)
    finally:
        client.close()
    assert int(result.as_numpy("OUT")[0][0]) == 9 and int(result.as_numpy("RUNS")[0][0]) == 2


def test_a_response_for_a_rescheduled_request_fails_with_tritons_text(backend: Backend) -> None:
    text = error_of(lambda: _iterative(backend, "iter_answers", 131))
    assert "Expected a None object in the execute function return list for reschduled request, found type" in text


def test_rescheduling_without_iterative_sequence_fails_the_request(backend: Backend) -> None:
    text = error_of(lambda: _iterative(backend, "iter_not_sequence", 0))
    assert text.startswith("Failed to reschedule the request of model 'iter_not_sequence': request rescheduling "
                           "requires 'sequence_batching { iterative_sequence: true }'")


def _iterative(backend: Backend, model: str, cid: int) -> Any:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        options = {"sequence_id": cid, "sequence_start": True, "sequence_end": True} if cid else {}
        return client.infer(model, _inputs(httpclient, "IN", 1), **options)
    finally:
        client.close()
