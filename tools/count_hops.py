#!/usr/bin/env python3
"""How many times a unary HTTP request crosses from one pystub_backend source file into another.

Runs the server core and its HTTP frontend in this process (examples/models/identity_fp32, real
stubs), warms up, then profiles the event-loop thread with `sys.setprofile` while one request is
served, its tail included (the RELEASE frame after the response, the worker's next turn). A
hop is a Python call whose callee and direct caller are both in pystub_backend, in
different files; coroutine resumptions are not calls and are not counted. The client runs in
another thread (not profiled) and keeps its connection, as tritonclient and perf_analyzer do (the
connection's own setup is not a request's). Two bodies: the v2 JSON form (`data` in the JSON) and
the binary form clients send by default (`binary_data_size`, the tensor after the JSON). Prints,
for each, the hop count (the median of several requests, so a background timer firing during one
of them does not count) and the files entered most often.

    .venv/bin/python tools/count_hops.py [--requests 7] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import statistics
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGE = str(ROOT / "pystub_backend") + "/"
_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR
JSON_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                    "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()
_BINARY_HEADER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                         "parameters": {"binary_data_size": 16}}],
                             "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
BODIES = {"json": (JSON_BODY, {"Content-Type": "application/json"}),
          "binary": (_BINARY_HEADER + bytes(16), {"Content-Type": "application/octet-stream",
                                                   "Inference-Header-Content-Length": str(len(_BINARY_HEADER))})}


class HopCounter:
    """Counts file-to-file calls inside the package on the thread it is installed on."""

    def __init__(self) -> None:
        self.hops = 0
        self.entries: collections.Counter[str] = collections.Counter()
        self.edges: list[tuple[str, str]] = []
        self._started: set[FrameType] = set()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        if frame.f_code.co_flags & _RESUMABLE:
            # A coroutine or generator fires "call" on every resumption: count only its start.
            if frame in self._started:
                return
            self._started.add(frame)
        if callee.startswith(PACKAGE) and caller.startswith(PACKAGE) and callee != caller:
            name = callee[len(PACKAGE):]
            self.hops += 1
            self.entries[name] += 1
            self.edges.append((caller[len(PACKAGE):], f"{name}:{frame.f_code.co_name}"))


class _Client:
    """One kept-alive connection, posting one body."""

    def __init__(self, port: int, body: bytes, headers: dict[str, str]) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self._body, self._headers = body, headers

    def post(self) -> None:
        self._connection.request("POST", "/v2/models/identity_fp32/infer", body=self._body, headers=self._headers)
        response = self._connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"the server answered {response.status}")

    def close(self) -> None:
        self._connection.close()


async def _count(client: _Client, requests: int) -> list[HopCounter]:
    for _ in range(20):  # warm-up: imports, caches, first arena allocations, the connection
        await asyncio.to_thread(client.post)
    counters: list[HopCounter] = []
    for _ in range(requests):
        counter = HopCounter()
        done = threading.Event()
        thread = threading.Thread(target=lambda done=done: (client.post(), done.set()))
        await asyncio.sleep(0.05)  # the previous request's tail (RELEASE frames, the worker's next turn) is over
        sys.setprofile(counter)
        try:
            thread.start()
            while not done.is_set():
                await asyncio.sleep(0.0005)
            await asyncio.sleep(0.02)  # this request's tail belongs to it
        finally:
            sys.setprofile(None)
        thread.join(30)
        counters.append(counter)
    return counters


async def _serve_and_count(requests: int) -> dict[str, list[HopCounter]]:
    from pystub_backend.backend.core import Core, CoreOptions
    from pystub_backend.backend.frontends.http.server import create_http_app
    from pystub_backend.backend.server import Listeners

    core = Core(CoreOptions(repositories=[str(ROOT / "examples" / "models")], model_control_mode="explicit",
                            startup_models=["identity_fp32"]))
    listeners = Listeners()
    counted: dict[str, list[HopCounter]] = {}
    try:
        failed = await core.load_repository()
        if failed:
            raise SystemExit(f"failed to load {failed}")
        port = await listeners.start_inference_http(create_http_app(core), "127.0.0.1", 0)
        for kind, (body, headers) in BODIES.items():
            client = _Client(port, body, headers)
            try:
                counted[kind] = await _count(client, requests)
            finally:
                client.close()
    finally:
        sys.setprofile(None)
        core.begin_shutdown()
        await listeners.stop()
        await core.unload_all()
    return counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="print the hops of one request of each body")
    args = parser.parse_args()
    for kind, counters in asyncio.run(_serve_and_count(args.requests)).items():
        median = statistics.median_low(c.hops for c in counters)
        typical = next(c for c in counters if c.hops == median)
        print(f"hops per unary HTTP request ({kind} body): {median} (all: {sorted(c.hops for c in counters)}); "
              f"files entered: {len(typical.entries)}")
        if args.verbose:
            for edge in typical.edges:
                print(f"    {edge[0]} -> {edge[1]}")
        for name, count in typical.entries.most_common(12):
            print(f"  {count:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
