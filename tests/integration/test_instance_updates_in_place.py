"""Instance-only updates where pystub goes beyond Triton 2.51 or where the oracle cannot show it
(tests/differential/test_instance_updates*.py compares the rest with Triton): an instance FAILED for
good is replaced by an update; pystub's own views give an instance whose Triton name a kept one
holds a name of its own; a removed instance that still ends its sequences stops with the model's
unload, or once its sequence is evicted as idle; one whose execute outlasts the exit timeout is
stopped; a dynamic-batching model updates in place; a multiplexing model is reloaded.

Real backends and stubs: the model answers with the instance name it was given and its pid.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from harness import Backend

CONFIG = {"backend": "python", "max_batch_size": 0,
          "input": [{"name": "DELAY", "data_type": "TYPE_FP32", "dims": [1]}],
          "output": [{"name": "INSTANCE", "data_type": "TYPE_STRING", "dims": [1]}]}

MODEL = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        refuse = os.path.join(args["model_repository"], "..", "refuse")
        if os.path.exists(refuse) and self.name in open(refuse).read().split():
            raise RuntimeError(f"{self.name} refuses to start")

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            time.sleep(float(delay.reshape(-1)[0]))
            answer = np.array([f"{self.name} {os.getpid()}".encode()] * delay.size, np.object_).reshape(delay.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INSTANCE", answer)]))
        return responses
'''
DEADLINE = 60.0


def _repository(tmp_path: Path, name: str = "m") -> Path:
    repository = tmp_path / "models"
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(MODEL)
    return repository


def _url(backend: Backend, path: str) -> str:
    return f"http://127.0.0.1:{backend.ports['http']}{path}"


def _load(backend: Backend, name: str = "m", count: int = 1, **fields: Any) -> requests.Response:
    config = {"name": name, **CONFIG, "instance_group": [{"kind": "KIND_CPU", "count": count}], **fields}
    return requests.post(_url(backend, f"/v2/repository/models/{name}/load"),
                         json={"parameters": {"config": json.dumps(config)}}, timeout=DEADLINE)


def _infer(backend: Backend, name: str = "m", delay: float = 0.0, sequence: dict[str, Any] | None = None,
           shape: tuple[int, ...] = (1,)) -> requests.Response:
    body = {"inputs": [{"name": "DELAY", "datatype": "FP32", "shape": list(shape), "data": [delay]}],
            **({"parameters": sequence} if sequence else {})}
    return requests.post(_url(backend, f"/v2/models/{name}/infer"), json=body, timeout=DEADLINE)


def _answer(reply: requests.Response) -> str:
    assert reply.status_code == 200, reply.text
    return str(reply.json()["outputs"][0]["data"][0])


def _stubs(backend: Backend, name: str = "m") -> list[dict[str, Any]]:
    rows = requests.get(_url(backend, "/v2/pystub/stubs"), timeout=DEADLINE).json()["stubs"]
    return [row for row in rows if row["model"] == name]


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE:g} s waiting for {what}")
        time.sleep(0.05)
    return result


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_an_update_replaces_a_failed_instance_and_keeps_the_others(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    with Backend(repository, "--model-control-mode=explicit") as backend:
        assert _load(backend, count=2).status_code == 200
        before = {row["instance"]: row["pid"] for row in _stubs(backend)}
        (repository / "refuse").write_text("m_0_0")  # its restart fails the same way: FAILED for good
        os.kill(before["m_0_0"], signal.SIGKILL)
        _until(lambda: any(row["state"] == "FAILED" for row in _stubs(backend)), "m_0_0 to be FAILED")
        (repository / "refuse").unlink()
        assert _load(backend, count=2).status_code == 200  # the same config: only the failed one changes
        after = {row["instance"]: (row["pid"], row["state"]) for row in _stubs(backend)}
        assert after["m_0_1"] == (before["m_0_1"], "READY")
        assert after["m_0_0"][1] == "READY" and after["m_0_0"][0] != before["m_0_0"]
        assert {_answer(_infer(backend)).split()[0] for _ in range(4)} <= {"m_0_0", "m_0_1"}


def test_a_triton_name_a_kept_instance_holds_gets_a_name_of_its_own_in_pystubs_views(tmp_path: Path) -> None:
    """1 -> 2 -> 1 keeps m_0_1; 1 -> 2 again makes another m_0_1 (the model is told so, as by
    Triton), listed as m_0_1.2 by /v2/pystub/stubs, where it can be restarted alone."""
    with Backend(_repository(tmp_path), "--model-control-mode=explicit") as backend:
        for count in (1, 2, 1, 2):
            assert _load(backend, count=count).status_code == 200
        rows = {row["instance"]: row["pid"] for row in _stubs(backend)}
        assert set(rows) == {"m_0_1", "m_0_1.2"}
        concurrent = [_in_thread(lambda: _answer(_infer(backend, delay=0.5))) for _ in range(2)]  # one on each
        for thread, _ in concurrent:
            thread.join(DEADLINE)
        answers = {answer for _, answered in concurrent for answer in answered}
        assert {answer.split()[0] for answer in answers} == {"m_0_1"}
        assert {int(answer.split()[1]) for answer in answers} == set(rows.values())
        restarted = requests.post(_url(backend, "/v2/pystub/stubs/m/m_0_1.2/restart"), timeout=DEADLINE)
        assert restarted.json() == {"restarted": ["m_0_1.2"]}
        after = {row["instance"]: row["pid"] for row in _stubs(backend)}
        assert after["m_0_1"] == rows["m_0_1"] and after["m_0_1.2"] != rows["m_0_1.2"]


def _sequence_fields(idle_us: int) -> dict[str, Any]:
    return {"max_batch_size": 1, "sequence_batching": {"max_sequence_idle_microseconds": idle_us, "direct": {}}}


def _step(backend: Backend, sequence_id: int, start: bool = False, end: bool = False) -> requests.Response:
    return _infer(backend, sequence={"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end},
                  shape=(1, 1))


def test_unloading_stops_a_removed_instance_that_still_ends_its_sequence(tmp_path: Path) -> None:
    with Backend(_repository(tmp_path), "--model-control-mode=explicit") as backend:
        fields = _sequence_fields(60_000_000)
        assert _load(backend, count=1, **fields).status_code == 200
        assert _load(backend, count=2, **fields).status_code == 200
        holder = _answer(_step(backend, 1, start=True))
        assert holder.startswith("m_0_0 ")
        assert _load(backend, count=1, **fields).status_code == 200  # m_0_0 is removed: it ends sequence 1 first
        assert {row["instance"] for row in _stubs(backend)} == {"m_0_1"}  # the removed one is no longer listed
        assert _answer(_step(backend, 1)) == holder
        unloaded = requests.post(_url(backend, "/v2/repository/models/m/unload"), json={}, timeout=DEADLINE)
        assert unloaded.status_code == 200
        _until(lambda: not _stubs(backend), "the model's stubs to be gone")
        assert _step(backend, 1, end=True).status_code != 200  # the model is gone
        _until(lambda: not _alive(int(holder.split()[1])), "the removed instance's stub to exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone too (its parent reaps it)
        return stat.read().split()[2] != "Z"


def test_a_removed_instance_whose_sequence_goes_idle_stops(tmp_path: Path) -> None:
    with Backend(_repository(tmp_path), "--model-control-mode=explicit") as backend:
        fields = _sequence_fields(1_000_000)  # 1 s: the sequence is evicted soon after its last request
        assert _load(backend, count=1, **fields).status_code == 200
        assert _load(backend, count=2, **fields).status_code == 200
        holder = _answer(_step(backend, 1, start=True))
        assert _load(backend, count=1, **fields).status_code == 200
        _until(lambda: not _alive(int(holder.split()[1])), "the removed instance to stop after the eviction")
        assert _step(backend, 1).status_code != 200  # the sequence was evicted: it must START again
        assert _answer(_step(backend, 2, start=True, end=True)).startswith("m_0_1 ")


def test_a_removed_instance_whose_execute_outlasts_the_exit_timeout_is_stopped(tmp_path: Path) -> None:
    with Backend(_repository(tmp_path), "--model-control-mode=explicit", "--exit-timeout-secs=1") as backend:
        assert _load(backend, count=1).status_code == 200
        assert _load(backend, count=2).status_code == 200
        thread, answers = _in_thread(lambda: _infer(backend, delay=30.0))  # goes to m_0_0, the oldest
        _until(lambda: any(row["in_flight"] for row in _stubs(backend)), "the long request to run")
        assert _load(backend, count=1).status_code == 200
        assert thread.is_alive() or answers[0].status_code != 200  # stopped before its 30 s were up
        thread.join(DEADLINE)
        assert answers[0].status_code != 200, answers[0].text
        assert _answer(_infer(backend)).startswith("m_0_1 ")


def test_a_dynamic_batching_model_updates_in_place(tmp_path: Path) -> None:
    with Backend(_repository(tmp_path), "--model-control-mode=explicit") as backend:
        fields = {"max_batch_size": 4, "dynamic_batching": {}}
        assert _load(backend, count=1, **fields).status_code == 200
        first = {row["instance"]: row["pid"] for row in _stubs(backend)}
        assert _load(backend, count=2, **fields).status_code == 200
        grown = {row["instance"]: row["pid"] for row in _stubs(backend)}
        assert grown["m_0_0"] == first["m_0_0"] and set(grown) == {"m_0_0", "m_0_1"}
        assert _answer(_infer(backend, shape=(1, 1))).split()[0] in grown
        assert _load(backend, count=1, **fields).status_code == 200
        assert {row["instance"]: row["pid"] for row in _stubs(backend)} == {"m_0_1": grown["m_0_1"]}


def test_a_multiplexing_model_is_reloaded(tmp_path: Path) -> None:
    """Multiplexing is pystub's own (its per-instance caches are set up at load): a change of its
    instances reloads the model, as any other change does."""
    with Backend(_repository(tmp_path), "--model-control-mode=explicit") as backend:
        fields = {"parameters": {"MAX_MULTIPLEXED_MODELS": {"string_value": "2"}}}
        assert _load(backend, count=1, **fields).status_code == 200
        first = {row["instance"]: row["pid"] for row in _stubs(backend)}
        assert _load(backend, count=2, **fields).status_code == 200
        _until(lambda: len(_stubs(backend)) == 2, "the reloaded version's two stubs")
        assert first["m_0_0"] not in {row["pid"] for row in _stubs(backend)}
