"""Instance placement on a machine without a GPU: Triton 2.51 vs pystub.

The `placed` model is loaded with one instance-group configuration per case (a config override
on the repository API). Compared: the load's answer (KIND_GPU groups fail with Triton's text),
the repository index row, the normalized instance groups of `/config`, and what each instance's
`initialize` saw (kind, name, device id), read from the file the model writes in its directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calls import agree, raw
from oracle import Endpoint, Pair

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
