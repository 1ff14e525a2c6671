"""Dynamic batching (issue 7) through a real backend and real stubs: preferred sizes, the queue
delay, max_batch_size, shapes that cannot batch, priorities and queue policies (timeouts with
REJECT and DELAY, max_queue_size) over HTTP and gRPC, preserve_ordering, per-request errors,
statistics, `execute_batch` with config defaults, and unload with queued work.

The test models report how they were batched: `batch_probe` answers every request with REQUESTS
(requests in its execute call), BATCH (their total batch size) and CALL (the instance's call
number); a first value above 1000 makes its call sleep (value - 1000) ms.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import TEST_MODELS, Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

OUTPUTS = """output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "REQUESTS", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "CALL", data_type: TYPE_INT32, dims: [ 1 ] }
]"""

PROBES = {
    "probe_preferred": "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] "
                       "max_queue_delay_microseconds: 2000000 }",
    "probe_delay": "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 500000 }",
    "probe_max": "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 300000 }",
    "probe_priority": "max_batch_size: 2\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    "probe_policy": """max_batch_size: 1
dynamic_batching {
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { max_queue_size: 2 allow_timeout_override: true }
  priority_queue_policy {
    key: 2
    value: { timeout_action: DELAY allow_timeout_override: true }
  }
}""",
    "probe_order": "max_batch_size: 1\ninstance_group [ { count: 2 } ]\ndynamic_batching { preserve_ordering: true }",
    "probe_unload": "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 30000000 }",
}


def write_probe(repository: Path, name: str, body: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    shutil.copy(TEST_MODELS / "batch_probe" / "1" / "model.py", repository / name / "1" / "model.py")
    (repository / name / "config.pbtxt").write_text(
        f'backend: "python"\n{body}\ninput [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]\n{OUTPUTS}\n')


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("batching"), "batch_author")
    for name, body in PROBES.items():
        write_probe(repository, name, body)
    loads = [f"--load-model={name}" for name in [*PROBES, "batch_author"] if name != "probe_unload"]
    with module_backend(Backend(repository, "--model-control-mode=explicit", "--exit-timeout-secs=2",
                                *loads)) as server:
        yield server


# -- clients -------------------------------------------------------------------------------------


class Answer:
    def __init__(self, result: Any = None, error: InferenceServerException | None = None) -> None:
        self.result = result
        self.error = error
        self.done_at = time.monotonic()

    def out(self, name: str) -> np.ndarray:
        assert self.error is None, self.error
        return self.result.as_numpy(name)

    def first(self, name: str) -> int:
        return int(self.out(name).reshape(-1)[0])


def probe(backend: Backend, model: str, value: float = 1.0, rows: int = 1, width: int = 1, protocol: str = "grpc",
          **options: Any) -> Answer:
    """One inference of a batch_probe model: INPUT0 = value, shape [rows, width]."""
    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(backend.grpc_url if protocol == "grpc" else backend.http_url)
    try:
        tensor = module.InferInput("INPUT0", [rows, width], "FP32")
        tensor.set_data_from_numpy(np.full((rows, width), value, np.float32))
        return Answer(client.infer(model, [tensor], **options))
    except InferenceServerException as exc:
        return Answer(error=exc)
    finally:
        client.close()


def together(*calls: Callable[[], Answer], stagger: float = 0.0) -> list[Answer]:
    """Run the calls concurrently (started `stagger` s apart); their answers in call order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures: list[Future] = []
        for call in calls:
            futures.append(pool.submit(call))
            if stagger:
                time.sleep(stagger)
        return [future.result(timeout=60) for future in futures]


def stats(backend: Backend, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


# -- batch forming -------------------------------------------------------------------------------


def test_a_preferred_size_is_sent_at_once_and_the_rest_waits_for_the_delay(backend: Backend) -> None:
    started = time.monotonic()
    answers = together(*[lambda: probe(backend, "probe_preferred")] * 6)
    times = sorted(a.done_at - started for a in answers)
    batches = sorted((a.first("BATCH") for a in answers), reverse=True)
    assert batches == [4, 4, 4, 4, 2, 2], batches
    assert times[3] < 1.5 and times[4] >= 1.9, times  # 4 at once; 2 after the 2 s queue delay


def test_the_queue_delay_gathers_requests_sent_apart(backend: Backend) -> None:
    started = time.monotonic()
    answers = together(*[lambda: probe(backend, "probe_delay")] * 3, stagger=0.1)
    assert [a.first("REQUESTS") for a in answers] == [3, 3, 3]
    assert len({a.first("CALL") for a in answers}) == 1
    assert all(a.done_at - started >= 0.45 for a in answers)


def test_batches_never_exceed_max_batch_size(backend: Backend) -> None:
    answers = together(*[lambda: probe(backend, "probe_max", rows=2)] * 3, lambda: probe(backend, "probe_max"),
                       lambda: probe(backend, "probe_max", rows=4))
    assert all(a.first("BATCH") <= 4 for a in answers), [a.first("BATCH") for a in answers]
    assert answers[4].first("REQUESTS") == 1  # a full batch on its own
    sizes = [row["batch_size"] for row in stats(backend, "probe_max")["batch_stats"]]
    assert sizes and max(sizes) <= 4


def test_requests_of_different_shapes_are_not_batched_together(backend: Backend) -> None:
    # As in Triton, a request that cannot join the batch ends it: the batch goes without waiting.
    answers = together(*[lambda w=w: probe(backend, "probe_delay", width=w) for w in (2, 2, 3)], stagger=0.15)
    assert [a.first("REQUESTS") for a in answers] == [2, 2, 1]
    assert answers[0].first("CALL") == answers[1].first("CALL") != answers[2].first("CALL")
    assert answers[2].done_at - answers[0].done_at >= 0.3  # the pair left when the third came
    np.testing.assert_array_equal(answers[2].out("OUTPUT0"), np.full((1, 3), 2.0, np.float32))


# -- priorities and queue policies ---------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_higher_priority_requests_run_first(backend: Backend, protocol: str) -> None:
    def call(priority: int) -> Callable[[], Answer]:
        return lambda: probe(backend, "probe_priority", protocol=protocol, priority=priority)

    blocker = lambda: probe(backend, "probe_priority", value=1700, rows=2)  # noqa: E731 (fills a batch)
    answers = together(blocker, call(2), call(2), call(1), call(1), stagger=0.05)
    calls = [a.first("CALL") for a in answers]
    assert calls[3] == calls[4] == calls[0] + 1, calls  # the two high ones form the next batch
    assert calls[1] == calls[2] == calls[0] + 2, calls


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_request_timeout_rejects_it_in_the_queue(backend: Backend, protocol: str) -> None:
    started = time.monotonic()
    blocker, late = together(lambda: probe(backend, "probe_policy", value=1800),
                             lambda: probe(backend, "probe_policy", protocol=protocol, timeout=100_000), stagger=0.1)
    assert blocker.error is None
    assert late.error is not None and "Request timeout expired" in late.error.message()
    assert late.error.status() in ("StatusCode.UNAVAILABLE", "503"), late.error.status()
    assert late.done_at - started < 0.7  # rejected while the blocker still runs


def test_a_delayed_request_runs_after_the_ones_that_did_not_time_out(backend: Backend) -> None:
    blocker, delayed, fresh = together(lambda: probe(backend, "probe_policy", value=2000),
                                       lambda: probe(backend, "probe_policy", priority=2, timeout=100_000),
                                       lambda: probe(backend, "probe_policy", priority=2), stagger=0.25)
    # `delayed` timed out (100 ms) while the blocker ran: DELAY keeps it, behind `fresh` (no timeout)
    assert delayed.error is None and fresh.error is None
    assert blocker.first("CALL") + 1 == fresh.first("CALL") == delayed.first("CALL") - 1


def test_a_full_queue_answers_unavailable(backend: Backend) -> None:
    answers = together(lambda: probe(backend, "probe_policy", value=1900),
                       *[lambda: probe(backend, "probe_policy")] * 3, stagger=0.15)
    assert [a.error is None for a in answers] == [True, True, True, False]
    assert "Exceeds maximum queue size" in answers[3].error.message()
    assert answers[3].error.status() == "StatusCode.UNAVAILABLE"


def test_preserve_ordering_answers_in_arrival_order(backend: Backend) -> None:
    slow, fast = together(lambda: probe(backend, "probe_order", value=1500),
                          lambda: probe(backend, "probe_order"), stagger=0.1)
    assert slow.error is None and fast.error is None
    # The fast request (sent 0.1 s after a 1.5 s one) was held back until the slow one was answered;
    # 0.2 s absorbs the jitter of two client threads noting their finish times.
    assert fast.done_at + 0.2 >= slow.done_at
    assert slow.first("REQUESTS") == fast.first("REQUESTS") == 1  # two instances: executed side by side


# -- errors --------------------------------------------------------------------------------------


def test_an_error_response_fails_only_its_request(backend: Backend) -> None:
    ok1, bad, invalid, ok2 = together(
        lambda: probe(backend, "probe_delay"), lambda: probe(backend, "probe_delay", value=-1),
        lambda: probe(backend, "probe_delay", rows=9),  # over max_batch_size: refused before batching
        lambda: probe(backend, "probe_delay"))
    assert ok1.first("REQUESTS") == ok2.first("REQUESTS") == 3 and ok1.first("CALL") == ok2.first("CALL")
    assert bad.error is not None and bad.error.message() == "negative input"
    assert bad.error.status() == "StatusCode.INVALID_ARGUMENT"
    assert invalid.error is not None and "batch-size must be <= 8" in invalid.error.message()


def test_an_exception_in_execute_fails_the_whole_batch(backend: Backend) -> None:
    answers = together(lambda: probe(backend, "probe_delay"), lambda: probe(backend, "probe_delay", value=666))
    for answer in answers:
        assert answer.error is not None
        assert answer.error.message().startswith(  # then Triton's "At:" tail: the model's frames
            "Failed to process the request(s) for model 'probe_delay_0', message: ValueError: poisoned batch\n\nAt:\n")
    assert probe(backend, "probe_delay").error is None  # and the next batch is fine


# -- statistics ----------------------------------------------------------------------------------


def test_statistics_count_executions_inferences_and_batch_sizes(backend: Backend) -> None:
    before = stats(backend, "probe_delay")
    answers = together(*[lambda: probe(backend, "probe_delay", rows=2)] * 4)  # 8 = max: sent when full
    assert [a.first("BATCH") for a in answers] == [8] * 4
    after = stats(backend, "probe_delay")
    assert int(after["execution_count"]) == int(before["execution_count"]) + 1
    assert int(after["inference_count"]) == int(before["inference_count"]) + 8
    eight = next(row for row in after["batch_stats"] if row["batch_size"] == 8)
    assert eight["compute_infer"]["count"] >= 1 and eight["compute_infer"]["ns"] > 0
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][key]["count"] == before["inference_stats"][key]["count"] + 4, key
    assert after["inference_stats"]["queue"]["ns"] > before["inference_stats"]["queue"]["ns"]


# -- execute_batch -------------------------------------------------------------------------------


def author(backend: Backend, x: list[list[float]] | None, **extra: Any) -> Answer:
    """One inference of batch_author with X = x (None: left out) and the `extra` inputs."""
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        arrays = {**({} if x is None else {"X": np.array(x, np.float32)}), **extra}
        inputs = []
        for name, array in arrays.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return Answer(client.infer("batch_author", inputs))
    except InferenceServerException as exc:
        return Answer(error=exc)
    finally:
        client.close()


def test_execute_batch_concatenates_fills_defaults_and_splits(backend: Backend) -> None:
    one, two, three = together(lambda: author(backend, [[1, 2]]), lambda: author(backend, [[3, 4], [5, 6]]),
                               lambda: author(backend, [[7, 8]]))
    np.testing.assert_allclose(one.out("Y"), [[2.5, 3.5]])
    np.testing.assert_allclose(two.out("Y"), [[6.5, 7.5], [10.5, 11.5]])
    np.testing.assert_allclose(three.out("Y"), [[14.5, 15.5]])
    assert [a.first("ROWS") for a in (one, two, three)] == [4, 4, 4]  # one call for all three
    assert len({a.first("CALL") for a in (one, two, three)}) == 1
    assert two.out("TAG_OUT").tolist() == [[b"none"], [b"none"]]


def test_execute_batch_uses_given_optional_inputs(backend: Backend) -> None:
    answer = author(backend, [[1, 2]], SCALE=np.array([[10]], np.float32), BIAS=np.array([[1, 1]], np.float32),
                    EXTRA=np.array([[100]], np.float32), TAG=np.array([[b"mine"]], object))
    np.testing.assert_allclose(answer.out("Y"), [[111, 121]])
    assert answer.out("TAG_OUT").tolist() == [[b"mine"]]


def test_execute_batch_failures_stay_in_their_batch(backend: Backend) -> None:
    failed, missing = together(lambda: author(backend, [[666, 0]]),
                               lambda: author(backend, None, SCALE=np.ones((1, 1), np.float32)))
    assert failed.error is not None and failed.error.message().startswith(  # then the "At:" tail
        "Failed to process the request(s) for model 'batch_author_0', message: RuntimeError: execute_batch "
        "failed on purpose\n\nAt:\n")
    # validation refuses it before it is queued, alone, with Triton's text
    assert missing.error is not None and missing.error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "missing required input(s) ['X']" in missing.error.message()
    np.testing.assert_allclose(author(backend, [[1, 1]]).out("Y"), [[2.5, 1.5]])


@pytest.mark.parametrize(("parameter", "message"), [
    ('key: "default:X" value: { string_value: "1" }', "input 'X' is not optional"),
    ('key: "default:SCALE" value: { string_value: "[1, 2" }', "'default:SCALE' of model 'bad_author' is not valid"),
])  # (tests/unit/stub/test_batched_execute.py checks every other refusal)
def test_a_bad_default_fails_the_load(backend: Backend, parameter: str, message: str) -> None:
    repository = Path(backend.repository)
    target = repository / "bad_author"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(repository / "batch_author", target)
    config = (target / "config.pbtxt").read_text()
    (target / "config.pbtxt").write_text(config + f"parameters {{ {parameter} }}\n")
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        with pytest.raises(InferenceServerException, match="load failed") as caught:
            client.load_model("bad_author")
        assert message in caught.value.message()
    finally:
        client.close()
        shutil.rmtree(target)


# -- unload ----------------------------------------------------------------------------------------


def test_unload_fails_queued_requests_and_finishes_the_running_batch(backend: Backend) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        client.load_model("probe_unload")
        with ThreadPoolExecutor(4) as pool:
            running = pool.submit(probe, backend, "probe_unload", 1500, 8)  # a full batch: runs at once
            time.sleep(0.3)
            queued = [pool.submit(probe, backend, "probe_unload") for _ in range(2)]  # wait for 30 s
            time.sleep(0.3)
            started = time.monotonic()
            client.unload_model("probe_unload")
            answers = [future.result(timeout=30) for future in queued]
        assert running.result().first("BATCH") == 8
        for answer in answers:  # failed at once, while the running batch still finishes
            assert answer.error is not None and answer.error.status() == "StatusCode.UNAVAILABLE"
            assert answer.error.message() == ("Model 'probe_unload' version 1 is unloading; the queued request "
                                              "was not executed."), answer.error.message()
            assert answer.done_at - started < 0.8
        ready = {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}
        assert "probe_unload" not in ready
    finally:
        client.close()
