"""pb_utils.new_output_array: outputs filled in shared memory reach the client without a copy, are
handed over once, and leave the arena as it was (zero copy)."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from harness import Backend, make_repository


def _arena(backend: Backend) -> dict:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return json.loads(response.read())["stubs"][0]


def test_arena_outputs_round_trip_and_are_freed_once(tmp_path):
    with Backend(make_repository(tmp_path, "arena_output")) as backend:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            for n in (5, 300_000, -4, -300_000, 0):
                tensor = grpcclient.InferInput("N", [1], "INT64")
                tensor.set_data_from_numpy(np.array([n], np.int64))
                result = client.infer("arena_output", [tensor])
                expected = np.arange(abs(n), dtype=np.float32)
                np.testing.assert_array_equal(result.as_numpy("OUT"), expected)
                if n < 0:
                    np.testing.assert_array_equal(result.as_numpy("AGAIN"), expected)
        finally:
            client.close()
        assert "unknown handle" not in backend.log()  # nothing was freed twice
        deadline = time.monotonic() + 10  # the stub publishes its arena with each heartbeat
        while time.monotonic() < deadline:
            row = _arena(backend)
            if row["s2p_total_bytes"] and not row["s2p_used_bytes"]:
                break
            time.sleep(0.1)
        row = _arena(backend)
        assert row["healthy"] and row["s2p_used_bytes"] == 0 and row["s2p_total_bytes"] >= 1_200_000
