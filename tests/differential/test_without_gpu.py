"""A machine without a GPU: Triton 2.51 vs pystub, for instance placement and CUDA shared memory.

The `placed` model is loaded with one instance-group configuration per case (a config override
on the repository API). Compared: the load's answer (KIND_GPU groups fail with Triton's text),
the repository index row, the normalized instance groups of `/config`, and what each instance's
`initialize` saw (kind, name, device id), read from the file the model writes in its directory.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from calls import agree, both, raw
from oracle import Endpoint, Pair

PAIR_MODELS: tuple[str, ...] = ()  # `placed` is loaded, case by case, through the repository API

_IO = {"backend": "python", "max_batch_size": 0,
       "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
       "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}]}
CASES = {
    "gpu": [{"kind": "KIND_GPU"}],
    "gpu_listed": [{"kind": "KIND_GPU", "gpus": [0]}],
    "gpu_two_listed": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}],
    "gpu_named_group": [{"name": "grp", "kind": "KIND_GPU", "count": 2}],
    "cpu_then_gpu": [{"kind": "KIND_CPU"}, {"kind": "KIND_GPU"}],
    "auto": [{"kind": "KIND_AUTO"}],
    "auto_two": [{"kind": "KIND_AUTO", "count": 2}],
    "cpu_two": [{"kind": "KIND_CPU", "count": 2}],
    "model": [{"kind": "KIND_MODEL"}],
    "default": [],
}


def _repository(pair: Pair, endpoint: Endpoint) -> Path:
    return pair.triton_server.repository if endpoint is pair.triton else Path(pair.pystub_backend.repository)


def _placement(pair: Pair, endpoint: Endpoint, groups: list[dict[str, object]]) -> dict[str, object]:
    placed = _repository(pair, endpoint) / "placed" / "placed.jsonl"
    placed.unlink(missing_ok=True)
    config = json.dumps({**_IO, "instance_group": groups})
    load = raw(endpoint, "POST", "/v2/repository/models/placed/load", {"parameters": {"config": config}})
    index = raw(endpoint, "POST", "/v2/repository/index", {}).json()
    answer: dict[str, object] = {"load": [load.status, load.json()],
                                 "index": [row for row in index if row["name"] == "placed"]}
    shown = raw(endpoint, "GET", "/v2/models/placed/config")
    if shown.status == 200:
        answer["instance_group"] = shown.json()["instance_group"]
    if placed.exists():
        answer["initialize"] = sorted(json.loads(line) for line in placed.read_text().splitlines())
    raw(endpoint, "POST", "/v2/repository/models/placed/unload", {})
    return answer


@pytest.mark.parametrize("case", CASES)
def test_placement_without_a_gpu(pair: Pair, case: str) -> None:
    triton = _placement(pair, pair.triton, CASES[case])
    pystub = _placement(pair, pair.pystub, CASES[case])
    agree(triton, pystub)


@pytest.mark.parametrize("value", ["yes", "no", "maybe", ""])
def test_force_cpu_only_input_tensors_values(pair: Pair, value: str) -> None:
    """The python backend's FORCE_CPU_ONLY_INPUT_TENSORS: "yes" and "no" load, anything else is refused."""
    def load(endpoint: Endpoint) -> list[object]:
        config = json.dumps({**_IO, "instance_group": [{"kind": "KIND_CPU"}],
                             "parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": value}}})
        answer = raw(endpoint, "POST", "/v2/repository/models/placed/load", {"parameters": {"config": config}})
        raw(endpoint, "POST", "/v2/repository/models/placed/unload", {})
        return [answer.status, answer.json()]
    agree(*both(pair, load))


# -- CUDA shared memory on a server without a GPU -----------------------------------------------------
_HANDLE = base64.b64encode(bytes(range(64))).decode()  # well-formed, but no process exported it
HTTP_CUDA_SHM = {
    "status": ("GET", "/v2/cudasharedmemory/status", None),
    "region_status_unknown": ("GET", "/v2/cudasharedmemory/region/nope/status", None),
    "unregister_all": ("POST", "/v2/cudasharedmemory/unregister", None),
    "unregister_unknown": ("POST", "/v2/cudasharedmemory/region/nope/unregister", None),
    "register_bad_base64": ("POST", "/v2/cudasharedmemory/region/r/register",
                            {"raw_handle": {"b64": "%%%"}, "device_id": 0, "byte_size": 16}),
    "register_handle": ("POST", "/v2/cudasharedmemory/region/r/register",
                        {"raw_handle": {"b64": _HANDLE}, "device_id": 0, "byte_size": 16}),
    "register_no_device": ("POST", "/v2/cudasharedmemory/region/r/register", {"raw_handle": {"b64": _HANDLE}}),
    "register_no_device_id": ("POST", "/v2/cudasharedmemory/region/r/register",
                              {"raw_handle": {"b64": _HANDLE}, "byte_size": 16}),
    "register_no_handle": ("POST", "/v2/cudasharedmemory/region/r/register", {"device_id": 0, "byte_size": 16}),
    "register_no_b64": ("POST", "/v2/cudasharedmemory/region/r/register",
                        {"raw_handle": {}, "device_id": 0, "byte_size": 16}),
}


@pytest.mark.parametrize("case", sorted(HTTP_CUDA_SHM))
def test_cuda_shared_memory_http_without_a_gpu(pair: Pair, case: str) -> None:
    method, path, body = HTTP_CUDA_SHM[case]

    def call(endpoint: Endpoint) -> list[object]:
        reply = raw(endpoint, method, path, body)  # type: ignore[arg-type]
        return [reply.status, reply.json()]
    agree(*both(pair, call))


def test_cuda_shared_memory_grpc_without_a_gpu(pair: Pair) -> None:
    def calls(endpoint: Endpoint) -> list[object]:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        answers: list[object] = []
        try:
            for method, args in (("get_cuda_shared_memory_status", ()), ("get_cuda_shared_memory_status", ("nope",)),
                                 ("register_cuda_shared_memory", ("r", bytes(range(64)), 0, 16)),
                                 ("unregister_cuda_shared_memory", ("nope",)), ("unregister_cuda_shared_memory", ())):
                try:
                    answers.append(str(getattr(client, method)(*args)))
                except Exception as error:  # noqa: BLE001 - status and text are compared
                    answers.append([error.status(), error.message()])  # type: ignore[attr-defined]
        finally:
            client.close()
        return answers
    agree(*both(pair, calls))
