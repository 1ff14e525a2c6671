"""Load-time behaviours: the log line naming the config fields pystub does not act
on, a stub that dies inside `initialize` (Triton's `Stub process '<instance>' is not healthy.`), and
readiness checks that wait for the `is_ready()` call already running instead of starting another."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from harness import Backend

PLAIN = '''
import numpy as np
import os
import signal
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {initialize}

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32))]) for _ in requests]
'''

IO = ('input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
      'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')


def _model(repository: Path, name: str, config: str, source: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}{config}')
    (repository / name / "1" / "model.py").write_text(source)


def _index(backend: Backend) -> dict[str, dict[str, str]]:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        return {row["name"]: row for row in client.get_model_repository_index()}
    finally:
        client.close()


def test_unused_fields_are_named_once_and_a_death_in_initialize_fails_the_load(tmp_path: Path):
    repository = tmp_path / "models"
    _model(repository, "lavish", 'optimization { priority: PRIORITY_MAX }\nresponse_cache { enable: true }\n'
           'model_operations { op_library_filename: "ops.so" }\nmetric_tags { key: "team" value: "a" }\n'
           'model_transaction_policy { decoupled: false }\n'
           'instance_group [ { kind: KIND_CPU, count: 1, host_policy: "numa0" } ]\n', PLAIN.format(initialize="pass"))
    _model(repository, "plain", "", PLAIN.format(initialize="pass"))
    _model(repository, "exits", "", PLAIN.format(initialize="os._exit(3)"))
    _model(repository, "killed", "", PLAIN.format(initialize="os.kill(os.getpid(), signal.SIGKILL)"))
    with Backend(repository, "--exit-on-error=false") as backend:
        index = _index(backend)
        log_text = backend.log()
    lines = [line for line in log_text.splitlines() if "config fields pystub does not act on" in line]
    assert len(lines) == 1, lines  # 'plain' sets nothing pystub ignores; model_transaction_policy is used
    assert lines[0].endswith("model 'lavish': config fields pystub does not act on: optimization, metric_tags, "
                             "model_operations, response_cache, instance_group.host_policy")
    for name, how in (("exits", "exited with code 3"), ("killed", "was killed by signal SIGKILL")):
        text = f"Stub process '{name}_0' is not healthy."
        assert (index[name]["state"], index[name]["reason"]) == ("UNAVAILABLE", text)
        assert f"failed to load '{name}' version 1: Internal: {text}" in log_text
        assert f"stub '{name}_0' {how} during initialize" in log_text
    assert index["plain"]["state"] == index["lavish"]["state"] == "READY"


SLOW_READY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0
        self.slow_next = False

    def is_ready(self):
        self.calls += 1
        if self.slow_next:  # armed by a request: this call takes 7 s and says "not ready"
            self.slow_next = False
            time.sleep(7)
            return False
        return True

    def execute(self, requests):
        self.slow_next = True
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([self.calls], np.float32))])
                for _ in requests]
'''


def _ready(backend: Backend) -> tuple[bool, float]:
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=30)
    started = time.monotonic()
    try:
        return client.is_model_ready("slow"), time.monotonic() - started
    finally:
        client.close()


def _calls(backend: Backend) -> int:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        return int(client.infer("slow", [tensor]).as_numpy("Y")[0])
    finally:
        client.close()


def test_a_slow_is_ready_is_waited_for_not_called_again(tmp_path: Path):
    repository = tmp_path / "models"
    _model(repository, "slow", "", SLOW_READY)
    with Backend(repository) as backend:
        calls_before = _calls(backend)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(_ready, backend)
            time.sleep(0.5)
            answer, elapsed = first.result()
            assert not answer and 4.5 < elapsed < 6.5, elapsed
            # The call is still running (7 s): this check waits for it, and gets that call's answer.
            second, waited = _ready(backend)
            assert not second and 0.5 < waited < 3.5, waited
        third, quick = _ready(backend)  # a new call, answered at once
        assert third and quick < 2.0
        # Two calls: the slow one and the third check's; the second check made none.
        assert _calls(backend) - calls_before == 2
