"""`model_warmup`: samples run on every instance before the model is ready, and a
failing sample fails the load with Triton 2.51's text (checked against it: tools/compare)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from harness import Backend

# Records every execute (instance, and per request each input's shape, dtype and first values)
# as one JSON line in the file named by the config parameter LOG.
RECORDER = '''
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

MODE = "{mode}"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = config["parameters"]["LOG"]["string_value"]
        self.instance = args["model_instance_name"]

    def _values(self, tensor):
        array = tensor.as_numpy()
        values = [v.decode() for v in array.ravel()] if array.dtype == object else array.ravel().tolist()
        return [list(array.shape), str(array.dtype), values]

    def execute(self, requests):
        with open(self.log, "a") as handle:
            handle.write(json.dumps({{"instance": self.instance, "requests": [
                {{t.name(): self._values(t) for t in r.inputs()}} for r in requests]}}) + "\\n")
        if MODE == "slow":
            time.sleep(0.5)  # readiness must wait for this
        if MODE == "raise":
            raise ValueError("boom in execute")
        responses = []
        for request in requests:
            if MODE == "error":
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad sample")))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float32))]))
        return responses
'''

IO = ('input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
      'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]\n')


def zero(name: str, batch_size: int, count: int = 0, dtype: str = "TYPE_FP32", dims: str = "2") -> str:
    return (f'{{ name: "{name}" batch_size: {batch_size} count: {count} inputs {{ key: "X" value {{ '
            f'data_type: {dtype} dims: [ {dims} ] zero_data: true }} }} }}')


def write_model(repository: Path, name: str, config: str, mode: str = "ok") -> Path:
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(RECORDER.format(mode=mode))
    log = repository.parent / f"{name}.jsonl"
    (directory / "config.pbtxt").write_text(
        f'backend: "python"\n{config}\nparameters {{ key: "LOG" value {{ string_value: "{log}" }} }}\n')
    return log


def executes(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_samples_run_per_instance_in_order_before_the_model_is_ready(tmp_path: Path):
    repository = tmp_path / "models"
    log = write_model(repository, "warm", "max_batch_size: 4\n" + IO.replace("dims: [ 2 ] }", "dims: [ 2 ] }, "
                      '{ name: "S", data_type: TYPE_STRING, dims: [ 2 ], optional: true }', 1) +
                      "instance_group [ { kind: KIND_CPU, count: 2 } ]\nmodel_warmup [\n" +
                      zero("zeros", 3, count=2) + ",\n"
                      '{ name: "rand" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2 ] '
                      'random_data: true } } },\n'
                      '{ name: "file" batch_size: 2 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2 ] '
                      'input_data_file: "x.bin" } } inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ] '
                      'input_data_file: "s.bin" } } },\n' + zero("skipped", 0) + " ]", mode="slow")
    (repository / "warm" / "warmup").mkdir()
    np.array([1.5, -2.0], np.float32).tofile(repository / "warm" / "warmup" / "x.bin")
    (repository / "warm" / "warmup" / "s.bin").write_bytes(struct.pack("<I", 3) + b"abc" + struct.pack("<I", 2) + b"de")
    with Backend(repository) as backend:
        # The server only reports its ports (Backend.start returns) once every model is loaded.
        runs = executes(log)
        client = HTTP(backend)
        try:
            assert client.is_model_ready("warm")
        finally:
            client.close()
        log_text = backend.log()
    assert log_text.index("running warmup sample 'file' for iteration 1") < log_text.index(
        "successfully loaded 'warm' version 1")
    assert "Skipping batch 0 warmup sample 'skipped'" in log_text
    for instance in ("warm_0_0", "warm_0_1"):
        mine = [run["requests"] for run in runs if run["instance"] == instance]
        assert len(mine) == 4  # zeros twice (count 2), rand once, file once (count 0 means once)
        zeros = {"X": [[1, 2], "float32", [0.0, 0.0]]}
        assert mine[0] == mine[1] == [zeros] * 3  # batch_size 3: three requests of batch 1
        assert len(mine[2]) == 1 and mine[2][0]["X"][:2] == [[1, 2], "float32"]
        assert mine[3] == [{"X": [[1, 2], "float32", [1.5, -2.0]], "S": [[1, 2], "object", ["abc", "de"]]}] * 2
    assert len(runs) == 8


def HTTP(backend: Backend) -> httpclient.InferenceServerClient:  # noqa: N802 - reads as a constructor
    return httpclient.InferenceServerClient(backend.http_url)


FAILURES = {
    # model name -> (config, model mode, files under warmup/, the load error Triton 2.51 gives)
    "raises": (IO + "model_warmup [ " + zero("boom", 1) + " ]", "raise", {},
               "failed to run warmup sample 'boom': Failed to process the request(s) for model 'raises_0', "
               "message: ValueError: boom in execute\n\nAt:\n  {dir}/1/model.py(29): execute\n; "),
    "error_response": (IO + "model_warmup [ " + zero("bad", 1) + " ]", "error", {},
                       "failed to run warmup sample 'bad': bad sample; "),
    "too_big": ("max_batch_size: 2\n" + IO + "model_warmup [ " + zero("big", 3) + " ]", "ok", {},
                "failed to run warmup sample 'big': " + "batch size 3 for 'too_big_0', max allowed is 2; " * 3),
    "not_batching": (IO + "model_warmup [ " + zero("nb", 2) + " ]", "ok", {},
                     "failed to run warmup sample 'nb': " +
                     "batch size 2 for 'not_batching_0', max allowed is 0; " * 2),
    "no_file": (IO + 'model_warmup [ { name: "nf" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 '
                'dims: [ 2 ] input_data_file: "missing.bin" } } } ]', "ok", {},
                "failed to open text file for read {dir}/warmup/missing.bin: No such file or directory"),
    "short_file": (IO + 'model_warmup [ { name: "sf" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 '
                   'dims: [ 4 ] input_data_file: "x.bin" } } } ]', "ok", {"x.bin": b"\0" * 8},
                   "[request id: <id_unknown>] warmup setting expects 16 bytes, but the data provided from "
                   "x.binonly has 8 bytes"),
    "no_data": (IO + 'model_warmup [ { name: "nd" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 '
                'dims: [ 2 ] } } } ]', "ok", {},
                "[request id: <id_unknown>] warmup setting expects input 'X' to have input_data_type set"),
    "wrong_type": (IO + "model_warmup [ " + zero("wt", 1, dtype="TYPE_INT32") + " ]", "ok", {},
                   "[request id: <id_unknown>] inference input 'X' data-type is 'INT32', but model 'wrong_type' "
                   "expects 'FP32'"),
    "wrong_shape": (IO + "model_warmup [ " + zero("ws", 1, dims="3") + " ]", "ok", {},
                    "[request id: <id_unknown>] unexpected shape for input 'X' for model 'wrong_shape'. "
                    "Expected [2], got [3]. "),
}


def test_a_failing_sample_fails_the_load_with_tritons_text(tmp_path: Path):
    repository = tmp_path / "models"
    logs = {}
    for name, (config, mode, files, _) in FAILURES.items():
        logs[name] = write_model(repository, name, config, mode)
        for file_name, data in files.items():
            (repository / name / "warmup").mkdir(exist_ok=True)
            (repository / name / "warmup" / file_name).write_bytes(data)
    write_model(repository, "fine", IO + "model_warmup [ " + zero("ok", 1) + " ]")
    with Backend(repository, "--exit-on-error=false") as backend:
        client = HTTP(backend)
        try:
            index = {row["name"]: row for row in client.get_model_repository_index()}
            assert client.is_model_ready("fine") and not client.is_model_ready("raises")
        finally:
            client.close()
        log_text = backend.log()
    for name, (_, _, _, text) in FAILURES.items():
        expected = text.replace("{dir}", str(repository / name))
        assert (index[name]["state"], index[name]["reason"]) == ("UNAVAILABLE", expected), name
        # the log escapes line breaks of a message (backend.log): the At: tail is one line there
        logged = expected.replace("\n", "\\n")
        assert f"failed to load '{name}' version 1: Internal: {logged}" in log_text
    # The samples that reached the model ran once; the ones refused before did not run at all.
    assert [len(executes(logs[name])) for name in ("raises", "error_response", "too_big", "wrong_type")] == [1, 1, 0, 0]
