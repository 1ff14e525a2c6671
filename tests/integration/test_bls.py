"""BLS: models calling models from `execute`, sync, async and decoupled; target checks,
deadlines, cancellation, stub death on either side, deadlock refusal, and a 10,000-call leak test.

The driver models (tests/models/bls_*) report what they saw in an INFO tensor; the tests check it.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from bls_calls import drive as drive_at
from harness import TEST_MODELS, Backend, make_repository, module_backend

STUB_TIMEOUT = 4


def copy_model(repository: Path, source: str, name: str, instances: int | None = None) -> None:
    """A copy of a test model under another name (optionally with another instance count)."""
    shutil.copytree(TEST_MODELS / source, repository / name)
    if instances is not None:
        config = repository / name / "config.pbtxt"
        text = config.read_text().replace("count: 1,", f"count: {instances},")
        config.write_text(text)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("bls"), "bls_driver", "bls_leaf", "bls_probe",
                                 "bls_async_driver", "bls_decoupled_driver", "repeat", "slow", "faulty",
                                 "bls_keeper")
    copy_model(repository, "bls_driver", "bls_pong")
    copy_model(repository, "bls_driver", "bls_twin", instances=2)
    with module_backend(Backend(repository, f"--backend-config=python,stub-timeout-seconds={STUB_TIMEOUT}")) as server:
        yield server


def drive(backend: Backend, params: dict[str, Any], data: np.ndarray | None = None, model: str = "bls_driver",
          ) -> tuple[np.ndarray, dict[str, Any]]:
    return drive_at(backend.http_url, params, data, model)


def stream_drive(backend: Backend, model: str, params: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """One request to a decoupled driver over a gRPC stream: its single data response."""
    import queue

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        tensor = grpcclient.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        client.async_stream_infer(model, [tensor], parameters=params)
        result, error = results.get(timeout=60)
        assert error is None, error
        return result.as_numpy("OUT"), json.loads(result.as_numpy("INFO")[0])
    finally:
        client.stop_stream()
        client.close()


def stub_rows(backend: Backend) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return {row["instance"]: row for row in json.loads(response.read())["stubs"]}


def settled(backend: Backend, check, timeout: float = 15.0) -> Any:
    """Poll `check()` until it returns something truthy (BLS memory is given back asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


# -- calls and what crosses ----------------------------------------------------------------------------
def test_sync_exec_returns_the_targets_outputs(backend: Backend):
    out, info = drive(backend, {"chain": "bls_leaf"})
    assert info == {"path": ["bls_driver", "bls_leaf"]}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 2)


def test_large_tensors_cross_both_arenas(backend: Backend):
    data = np.random.default_rng(1).random(2_000_000, dtype=np.float32)  # 8 MB: both arenas grow
    out, info = drive(backend, {"chain": "bls_leaf"}, data)
    assert "error" not in info
    np.testing.assert_array_equal(out, data + 2)


def _keep(backend: Backend, values: np.ndarray, drop: bool = False) -> int:
    """One request to bls_keeper (it keeps the BLS output it got); how many outputs it holds."""
    with httpclient.InferenceServerClient(backend.http_url) as client:
        tensor = httpclient.InferInput("IN", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer("bls_keeper", [tensor], parameters={"drop": True} if drop else None)
    np.testing.assert_array_equal(result.as_numpy("OUT"), values + 1)
    return int(result.as_numpy("KEPT")[0])


def test_small_outputs_come_inline_and_hold_no_arena_while_kept(backend: Backend):
    """A BLS output of at most 1 KiB rides in the response frame: the caller may keep it as long as
    it likes and its p2s arena holds nothing for it. A 4 KiB output (the control) is held in the
    arena while kept, and given back once the model drops it."""
    used = lambda: stub_rows(backend)["bls_keeper_0"]["arena_used_bytes"]  # noqa: E731
    assert _keep(backend, np.arange(4, dtype=np.float32), drop=True) == 1
    for count in range(2, 6):
        assert _keep(backend, np.arange(256, dtype=np.float32)) == count  # 1 KiB each
    assert settled(backend, lambda: used() == 0), f"kept small outputs hold {used()} bytes of the arena"
    _keep(backend, np.arange(1024, dtype=np.float32))  # 4 KiB, kept
    assert settled(backend, lambda: used() >= 4096), "a kept 4 KiB output is not in the caller's arena"
    _keep(backend, np.arange(4, dtype=np.float32), drop=True)  # lets the 4 KiB one go
    assert settled(backend, lambda: used() == 0), f"dropped outputs still hold {used()} bytes"


def test_request_options_reach_the_target(backend: Backend):
    out, info = drive(backend, {"mode": "probe"})
    assert info["seen"] == {"request_id": "bls-7", "correlation_id": 42, "flags": 1, "timeout": 5_000_000,
                            "parameters": {"greeting": "hi", "n": 3, "flag": True},
                            "requested": ["OUT", "REQUEST"], "version": "1"}
    assert info["response_parameters"] == {"answered_by": "bls_probe", "count": 1}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) * 2)
    _, info = drive(backend, {"mode": "probe", "correlation_id": "session-9"})
    assert info["seen"]["correlation_id"] == "session-9"


def test_bls_is_refused_outside_execute(backend: Backend):
    _, info = drive(backend, {"mode": "init"})
    assert info == {"error": "BLS is only supported during the 'execute' function."}


def test_target_checks_use_tritons_texts(backend: Backend):
    _, info = drive(backend, {"mode": "error", "target": "nope"})
    assert info == {"error": "Model nope - Error when running inference: Failed for execute the inference request. "
                             "Model 'nope' is not ready.", "code": 2}
    _, info = drive(backend, {"mode": "error", "target": "bls_leaf", "version": 7})
    assert info["error"] == ("Model bls_leaf - Error when running inference: Request for unknown model: 'bls_leaf' "
                             "version 7 is not found")
    _, info = drive(backend, {"mode": "error", "target": "repeat"})
    assert info["error"] == (
        "Model repeat is using the decoupled. The current BLS request call doesn't support models using the "
        "decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls "
        "for decoupled models.'")
    _, info = drive(backend, {"mode": "error", "target": "bls_leaf", "decoupled": True})
    assert info == {"outputs": ["OUT"]}  # decoupled=True works for default targets too


def test_validation_errors_come_back_as_error_responses(backend: Backend):
    _, info = drive(backend, {"mode": "error", "target": "faulty"})  # wrong input name for faulty
    assert info["error"].startswith("Model faulty - Error when running inference: ")
    assert info["code"] == 3


# -- decoupled, async ----------------------------------------------------------------------------------
def test_decoupled_exec_iterates_until_final_and_replays(backend: Backend):
    out, info = drive(backend, {"mode": "decoupled", "count": 5})
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32))
    assert info["errors"] == []
    assert info["replayed"] == 6  # five responses and the empty final


def test_iterator_cancel_stops_the_target(backend: Backend):
    out, info = drive(backend, {"mode": "decoupled", "count": 10_000, "delay_ms": 5, "take": 3})
    assert 3 <= len(out) < 100
    # As on Triton, the caller still receives what the target sends after the cancel, ending with
    # the target's own final response (repeat answers a cancel with a CANCELLED error of its own).
    np.testing.assert_array_equal(out, np.arange(len(out), dtype=np.float32))
    assert info["errors"] == [[7, "request cancelled"]]
    assert info["after_cancel"] < 2.0, info
    backend.wait_for_log(r"repeat: cancelled at [\d.]+ after \d+ responses")


def test_async_exec_runs_calls_concurrently(backend: Backend):
    out, info = drive(backend, {"mode": "gather", "count": 16}, model="bls_async_driver")
    assert info["errors"] == []
    expected = [float((np.arange(4, dtype=np.float32) + i + 1).sum()) for i in range(16)]
    np.testing.assert_array_equal(out, np.array(expected, np.float32))


def test_async_exec_decoupled_returns_an_iterator(backend: Backend):
    out, info = drive(backend, {"mode": "decoupled", "count": 4}, model="bls_async_driver")
    assert info == {"type": "ResponseIterator"}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32))


# -- deadlines and deaths ------------------------------------------------------------------------------
def test_request_timeout_is_a_deadline(backend: Backend):
    _, info = drive(backend, {"mode": "timeout", "delay_ms": 3000, "bls_timeout_us": 300_000})
    assert info["code"] == 4
    assert info["error"] == ("Request timeout expired: the BLS request to model 'slow' got no response within "
                             "0.3 s (the request's timeout); it was cancelled.")
    assert 0.25 < info["seconds"] < 2.5
    _, info = drive(backend, {"mode": "timeout", "delay_ms": 3000, "bls_timeout_us": 300_000},
                    model="bls_async_driver")
    assert info["error"].startswith("Request timeout expired") and info["seconds"] < 2.5


def test_without_a_timeout_the_stub_timeout_bounds_the_wait(backend: Backend):
    _, info = drive(backend, {"mode": "timeout", "delay_ms": (STUB_TIMEOUT + 3) * 1000})
    assert info["error"] == (f"Request timeout expired: the BLS request to model 'slow' got no response within "
                             f"{STUB_TIMEOUT} s (stub-timeout-seconds); it was cancelled.")
    assert STUB_TIMEOUT - 0.5 < info["seconds"] < STUB_TIMEOUT + 3
    # 'slow' still runs the abandoned request, and the call waits for its wind-down; the driver's
    # instance, whose execute moved on, is no longer held by it: it takes the next request at once
    started = time.monotonic()
    out, info = drive(backend, {"chain": "bls_leaf"})
    assert "error" not in info and time.monotonic() - started < STUB_TIMEOUT / 2


def test_target_stub_death_is_an_error_not_a_hang(backend: Backend):
    _, info = drive(backend, {"mode": "fault", "fault": 2})  # os._exit in the target's execute
    assert info["error"] == "Stub process 'faulty_0' is not healthy." and info["code"] == 4
    assert info["seconds"] < 5
    settled(backend, lambda: stub_rows(backend)["faulty_0"]["healthy"])
    _, info = drive(backend, {"mode": "fault", "fault": 1})  # segfault
    assert info["error"] == "Stub process 'faulty_0' is not healthy."
    settled(backend, lambda: stub_rows(backend)["faulty_0"]["healthy"])
    _, info = drive(backend, {"mode": "fault", "fault": 0})
    assert "error" not in info


def test_caller_stub_death_ends_its_calls(backend: Backend):
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        with pytest.raises(Exception, match="Stub process 'bls_pong_0_0' is not healthy."):
            client.infer("bls_pong", [tensor], parameters={"mode": "die"})
    finally:
        client.close()
    assert settled(backend, lambda: stub_rows(backend)["bls_pong_0_0"]["healthy"])
    assert settled(backend, lambda: drive(backend, {"mode": "inspect"})[1]["registry_size"] == 0)


# -- recursion and deadlock ----------------------------------------------------------------------------
def test_a_cycle_through_a_busy_model_fails_at_once_instead_of_hanging(backend: Backend):
    started = time.monotonic()
    out, info = drive(backend, {"chain": "bls_pong,bls_driver"})  # driver → pong → driver (1 instance)
    assert time.monotonic() - started < STUB_TIMEOUT  # refused, not timed out
    assert info["path"] == ["bls_driver", "bls_pong"]
    assert info["error"].startswith("BLS deadlock: the request to model 'bls_driver' can never run: every "
                                    "instance of 'bls_driver' (bls_driver_0_0) is inside an execute that waits")
    _, info = drive(backend, {"chain": "bls_driver"})  # calling itself directly
    assert info["error"].startswith("BLS deadlock: the request to model 'bls_driver' can never run")
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 1)


def test_a_cycle_with_a_free_instance_runs(backend: Backend):
    out, info = drive(backend, {"chain": "bls_pong,bls_twin"}, model="bls_twin")  # twin has two instances
    assert info == {"path": ["bls_twin", "bls_pong", "bls_twin"]}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 3)


def test_a_decoupled_model_calls_itself_through_another_model(backend: Backend):
    # From its own thread the instance is free: dd → bls_driver → dd (decoupled target) works.
    out, info = stream_drive(backend, "bls_decoupled_driver", {"chain": "bls_driver,bls_decoupled_driver"})
    assert info == {"path": ["bls_decoupled_driver", "bls_driver", "bls_decoupled_driver"]}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 3)
    out, info = stream_drive(backend, "bls_decoupled_driver", {"chain": "bls_decoupled_driver"})
    assert info["path"] == ["bls_decoupled_driver", "bls_decoupled_driver"]
    # From execute itself the instance is held: the same cycle is refused.
    _, info = stream_drive(backend, "bls_decoupled_driver",
                           {"chain": "bls_driver,bls_decoupled_driver", "from": "execute"})
    assert "BLS deadlock: the request to model 'bls_decoupled_driver' can never run" in info["error"]


def test_default_model_calls_a_decoupled_target(backend: Backend):
    out, info = drive(backend, {"chain": "bls_decoupled_driver,bls_pong"})
    assert info == {"path": ["bls_driver", "bls_decoupled_driver", "bls_pong"]}
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 3)


# -- memory --------------------------------------------------------------------------------------------
def test_ten_thousand_mixed_calls_leave_nothing_behind(backend: Backend):
    def quiet(model: str) -> dict | None:
        """The caller's facts once no BLS call is left, of this test or of one before it sharing the
        backend (a cancelled or timed-out call winds down after its test returned)."""
        facts = drive(backend, {"mode": "inspect"}, model=model)[1]
        idle = facts["registry_size"] == 0 and facts["caller_calls"] == 0 and not facts.get("calls_in_flight")
        return facts if idle else None

    before = settled(backend, lambda: quiet("bls_driver"))
    before_async = settled(backend, lambda: quiet("bls_async_driver"))
    assert before is not None and before_async is not None, "the calls of earlier tests never ended"
    started = time.monotonic()
    for _ in range(2):  # sync, decoupled, cancelled, dropped iterators, errors, bigger tensors
        _, info = drive(backend, {"mode": "many", "count": 2000})
        assert info == {"calls": 2000, "bad": []}
    for _ in range(2):  # async_exec in waves of concurrent calls, decoupled ones among them
        _, info = drive(backend, {"mode": "many", "count": 3000, "width": 25}, model="bls_async_driver")
        assert info == {"calls": 3000, "bad": 0}
    elapsed = time.monotonic() - started

    def clean() -> dict | None:
        facts = drive(backend, {"mode": "inspect"})[1]
        return facts if facts == before else None

    after = settled(backend, clean)
    assert after == before, (before, drive(backend, {"mode": "inspect"})[1])
    after_async = settled(backend, lambda: (f := drive(backend, {"mode": "inspect"}, model="bls_async_driver")[1])
                          == before_async and f)
    assert after_async == before_async
    assert before["registry_size"] == 0 and before["calls_in_flight"] == 0 and before["outputs_held"] == 0
    assert before["s2p_used"] == 0

    def targets_clean() -> bool:
        rows = stub_rows(backend)
        return all(rows[name]["arena_used_bytes"] == 0 and rows[name]["in_flight"] == 0
                   for name in ("bls_leaf_0", "repeat_0"))

    assert settled(backend, targets_clean), stub_rows(backend)
    print(f"\n10,000 mixed BLS calls in {elapsed:.1f} s ({elapsed / 10_000 * 1e3:.2f} ms per call)")


def test_a_target_that_is_not_ready(backend: Backend):
    _, info = drive(backend, {"mode": "fault", "fault": 2, "then": 0})  # its stub is restarting
    assert info["then"] == {"error": "Failed for execute the inference request. Model 'faulty' is not ready.",
                            "code": 4}
    settled(backend, lambda: stub_rows(backend)["faulty_0"]["healthy"])


# -- model control from a model, finalize, back-pressure (a backend of their own) -------------------------
def test_model_control_from_a_model_and_bls_refused_in_finalize(tmp_path: Path):
    repository = make_repository(tmp_path, "bls_driver", "bls_leaf", "repeat", "add_sub")
    with Backend(repository, "--model-control-mode=explicit", "--load-model=bls_driver", "--load-model=repeat",
                 "--backend-config=python,stub-timeout-seconds=1.5") as backend:
        _, info = drive(backend, {"mode": "control", "target": "add_sub", "steps": "ready,load,ready,unload,ready"})
        assert info == {"steps": [False, "loaded", True, "unloaded", False]}
        _, info = drive(backend, {"mode": "control", "target": "nope", "steps": "load"})
        assert info["steps"][0].startswith(  # Triton 2.51's answer for a model the repository does not have
            "error: Failed to load model: Failed to process the request for model 'bls_driver_0_0', message: "
            "failed to load 'nope', failed to poll from model repository")
        _, info = drive(backend, {"mode": "control", "target": "add_sub", "steps": "load_config",
                                  "config": "{not json"})
        assert info["steps"][0].startswith("error: Failed to load model: ")
        # A decoupled call whose iterator is not read: the backend forwards 64 responses, waits for
        # the stub timeout, then cancels the request and says why.
        _, info = drive(backend, {"mode": "stall", "seconds": 3})
        assert info["values"] == 64
        assert info["errors"] == ["BLS response iterator of model 'repeat' was not read: 64 responses waited "
                                  "1.5 s; the request was cancelled."]
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            client.unload_model("bls_driver")
        finally:
            client.close()
        backend.wait_for_log(r"bls_driver finalize: BLS is only supported during the 'execute' function\.")


def test_model_control_needs_explicit_mode(backend: Backend):
    _, info = drive(backend, {"mode": "control", "target": "bls_leaf", "steps": "load,ready"})
    assert info == {"steps": ["error: Failed to load model: Failed to process the request for model "
                              "'bls_driver_0_0', message: explicit model load / unload is not allowed if "
                              "polling is enabled", True]}
