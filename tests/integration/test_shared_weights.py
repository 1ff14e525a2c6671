"""Shared weights (PYSTUB_SHARE_WEIGHTS): a template stub runs `initialize` once and forks the
KIND_CPU instances. Real backends, real stubs, real forks: identities, shared pages, the fallback
when a fork is unsafe, supervision of the forks and of the template, unload, KIND_GPU."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend

from pystub_backend.devices import FAKE_VARIABLE

MODEL = "shared_weights"
WEIGHTS_MIB = 64
HEARTBEAT = "--backend-config=python,stub-heartbeat-timeout-seconds=1"


def configure(repository: Path, count: int = 3, weights_mib: int = WEIGHTS_MIB, leave_thread: bool = False,
              groups: str | None = None) -> Path:
    config = repository / MODEL / "config.pbtxt"
    text = config.read_text().replace("count: 3", f"count: {count}")
    text = text.replace('string_value: "64"', f'string_value: "{weights_mib}"')
    if leave_thread:
        text = text.replace('"LEAVE_THREAD", value: { string_value: "no" }',
                            '"LEAVE_THREAD", value: { string_value: "yes" }')
    if groups is not None:
        text = text.replace(f"instance_group [ {{ count: {count}, kind: KIND_CPU }} ]", groups)
    config.write_text(text)
    return repository / MODEL / "calls.log"


def calls(log: Path, hook: str) -> list[tuple[int, str]]:
    """(pid, instance) of every call of `hook` the model recorded."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(pid), name) for word, pid, name in (line.split() for line in lines) if word == hook]


def stubs(backend: Backend) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return {row["instance"]: row for row in json.loads(response.read())["stubs"] if row["model"] == MODEL}


def infer(backend: Backend, sleep_ms: int = 0) -> tuple[str, int, float]:
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=120)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([sleep_ms], np.int32))
        result = client.infer(MODEL, [tensor])
        return (result.as_numpy("INSTANCE")[0].decode(), int(result.as_numpy("PID")[0]),
                float(result.as_numpy("TOTAL")[0]))
    finally:
        client.close()


def serve_everywhere(backend: Backend, count: int) -> dict[str, int]:
    """Send rounds of `count` concurrent slow requests until every instance answered: name -> pid."""
    answered: dict[str, int] = {}
    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(count) as pool:
        while len(answered) < count:
            assert time.monotonic() < deadline, f"only {sorted(answered)} answered within 60 s"
            for name, pid, total in pool.map(lambda _: infer(backend, 300), range(count)):
                assert total == expected_total()
                answered[name] = pid
    return answered


def expected_total(weights_mib: int = WEIGHTS_MIB) -> float:
    return float(np.arange((weights_mib << 20) // 8, dtype=np.float64).sum())


def wait_all_healthy(backend: Backend, restarts: dict[str, int], timeout: float = 60.0) -> dict[str, dict]:
    """Wait until every instance is healthy with more restarts than `restarts` says."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = stubs(backend)
        if all(row["healthy"] and row["restarts"] > restarts.get(name, -1) for name, row in rows.items()):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"the instances did not come back within {timeout} s: {stubs(backend)}")


def parent(pid: int) -> int:
    return psutil.Process(pid).ppid()


def stub_tree(backend: Backend) -> list[int]:
    return [p.pid for p in psutil.Process(backend.pid).children(recursive=True)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("shared"), MODEL)


@pytest.fixture(scope="module")
def backend(repository: Path) -> Iterator[Backend]:
    configure(repository)
    with module_backend(Backend(repository, HEARTBEAT)) as server:
        yield server


@pytest.fixture()
def log(repository: Path) -> Path:
    return repository / MODEL / "calls.log"


def test_forked_instances_serve_with_their_own_identities(backend: Backend, log: Path):
    answered = serve_everywhere(backend, 3)
    rows = stubs(backend)
    assert answered == {name: row["pid"] for name, row in rows.items()}
    assert sorted(answered) == [f"{MODEL}_0_0", f"{MODEL}_0_1", f"{MODEL}_0_2"]
    (template,) = {parent(pid) for pid in answered.values()}  # one parent: the template, not the backend
    assert template != backend.pid and parent(template) == backend.pid
    assert calls(log, "initialize") == [(template, f"{MODEL}_0_0")]  # once, with the first instance's args
    assert sorted(calls(log, "initialize_instance")) == sorted((pid, name) for name, pid in answered.items())


def test_weights_pages_stay_shared_while_the_instances_serve(backend: Backend):
    serve_everywhere(backend, 3)
    for _ in range(10):  # every inference reads every page of the weights
        serve_everywhere(backend, 3)
    pids = [row["pid"] for row in stubs(backend).values()]
    pids.append(parent(pids[0]))
    total_mib = sum(_pss_kib(pid) for pid in pids) / 1024
    # Not shared, each of the 3 instances holds its own 64 MiB (192 MiB, plus 3 interpreters).
    assert total_mib < 0.75 * 3 * WEIGHTS_MIB, f"PSS of the template and its instances: {total_mib:.0f} MiB"


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_dead_or_hung_instance_is_forked_again_without_initialize(backend: Backend, log: Path, sig: int):
    rows = stubs(backend)
    victim = rows[f"{MODEL}_0_1"]
    template = parent(victim["pid"])
    initialized = len(calls(log, "initialize"))
    os.kill(victim["pid"], sig)
    deadline = time.monotonic() + 60
    while (row := stubs(backend)[f"{MODEL}_0_1"])["restarts"] <= victim["restarts"] or not row["healthy"]:
        assert time.monotonic() < deadline, f"{MODEL}_0_1 did not come back: {row}"
        time.sleep(0.05)
    assert row["pid"] != victim["pid"] and parent(row["pid"]) == template
    assert not psutil.pid_exists(victim["pid"])  # reaped by the template, no zombie
    assert len(calls(log, "initialize")) == initialized  # forked again, not initialized again
    assert (row["pid"], f"{MODEL}_0_1") in calls(log, "initialize_instance")
    assert f"{MODEL}_0_1" in serve_everywhere(backend, 3)
    assert backend.log().count("does not share its weights") == 0


def test_a_dead_template_is_started_again_and_its_instances_forked_again(backend: Backend, log: Path):
    rows = stubs(backend)
    template = parent(rows[f"{MODEL}_0_0"]["pid"])
    assert template != backend.pid
    initialized = len(calls(log, "initialize"))
    os.kill(template, signal.SIGKILL)
    rows = wait_all_healthy(backend, {name: row["restarts"] for name, row in rows.items()})
    new_templates = {parent(row["pid"]) for row in rows.values()}
    assert len(new_templates) == 1 and template not in new_templates
    (new_template,) = new_templates
    assert parent(new_template) == backend.pid
    assert calls(log, "initialize")[initialized:] == [(new_template, f"{MODEL}_0_0")]  # initialize ran again, once
    assert serve_everywhere(backend, 3) == {name: row["pid"] for name, row in rows.items()}


def test_a_thread_left_running_by_initialize_loads_the_ordinary_way(tmp_path: Path):
    repository = make_repository(tmp_path, MODEL)
    log = configure(repository, count=2, leave_thread=True)
    with Backend(repository) as backend:
        answered = serve_everywhere(backend, 2)
        assert {parent(pid) for pid in answered.values()} == {backend.pid}  # ordinary stubs
        warnings = [line for line in backend.log().splitlines() if "does not share its weights" in line]
        assert len(warnings) == 1, warnings
        assert "initialize left 1 thread(s) running: left-running" in warnings[0]
        # The template's initialize, then each instance's own.
        initialized = sorted(name for _, name in calls(log, "initialize"))
        assert initialized == [f"{MODEL}_0_0", f"{MODEL}_0_0", f"{MODEL}_0_1"]
        assert calls(log, "initialize_instance") == []


def test_unload_leaves_no_process_and_nothing_in_dev_shm(tmp_path: Path):
    repository = make_repository(tmp_path, MODEL, "add_sub")
    configure(repository, count=2)
    explicit = ["--model-control-mode=explicit", f"--load-model={MODEL}", "--load-model=add_sub"]
    with Backend(repository, *explicit) as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            answered = serve_everywhere(backend, 2)
            template = parent(next(iter(answered.values())))
            assert template != backend.pid
            others = set(stub_tree(backend)) - set(answered.values()) - {template}
            client.unload_model(MODEL)
            deadline = time.monotonic() + 30
            while set(stub_tree(backend)) != others:
                assert time.monotonic() < deadline, f"left running after unload: {set(stub_tree(backend)) - others}"
                time.sleep(0.05)
            assert not client.is_model_ready(MODEL) and client.is_model_ready("add_sub")
            assert backend.shm_entries() == []
            assert "did not exit" not in backend.log()  # each went at the first step of its ladder
            client.load_model(MODEL)  # and back: a new template, forked instances
            assert len(serve_everywhere(backend, 2)) == 2
        finally:
            client.close()


def test_kind_gpu_instances_keep_the_ordinary_mode(tmp_path: Path):
    repository = make_repository(tmp_path, MODEL)
    log = configure(repository, count=2, groups="instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] }, "
                                                 "{ count: 2, kind: KIND_CPU } ]")
    with Backend(repository, env={FAKE_VARIABLE: "1"}) as backend:
        rows = stubs(backend)
        gpu, cpu = rows[f"{MODEL}_0_0"], [rows[f"{MODEL}_1_0"], rows[f"{MODEL}_1_1"]]
        assert parent(gpu["pid"]) == backend.pid  # spawned as any stub
        (template,) = {parent(row["pid"]) for row in cpu}
        assert template != backend.pid and parent(template) == backend.pid
        assert sorted(calls(log, "initialize")) == sorted([(gpu["pid"], f"{MODEL}_0_0"), (template, f"{MODEL}_1_0")])
        assert sorted(pid for pid, _ in calls(log, "initialize_instance")) == sorted(row["pid"] for row in cpu)


def test_a_change_of_instances_reloads_the_model_whole(tmp_path: Path):
    """Other models update their instances in place; these fork from the template of their load,
    so a new count brings a new template (one more `initialize`) and only forked instances."""
    repository = make_repository(tmp_path / "repository", MODEL)
    configure(repository, count=2)
    log = tmp_path / "calls.log"  # outside the model's directory, whose files did not change
    config = repository / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + f'parameters {{ key: "CALLS_LOG", value: {{ string_value: "{log}" }} }}\n')
    with Backend(repository, "--model-control-mode=explicit", f"--load-model={MODEL}") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            before = serve_everywhere(backend, 2)
            old_template = parent(next(iter(before.values())))
            config.write_text(config.read_text().replace("count: 2", "count: 3"))
            client.load_model(MODEL)
            after = serve_everywhere(backend, 3)
            templates = {parent(pid) for pid in after.values()}
            assert len(templates) == 1 and old_template not in templates, (old_template, templates)
            assert not set(before.values()) & set(after.values())  # not one instance was kept
            assert [name for _, name in calls(log, "initialize")] == [f"{MODEL}_0_0", f"{MODEL}_0_0"]
        finally:
            client.close()
