#!/usr/bin/env python3
"""How many times a unary HTTP request crosses from one pystub_backend source file into another.

Runs the server core and its HTTP frontend in this process (examples/models/identity_fp32, real
stubs), warms up, then profiles the event-loop thread with `sys.setprofile` while one request is
served, its tail included (the RELEASE frame after the response, the worker's next turn). A
hop is a Python call whose callee and direct caller are both in pystub_backend, in
different files; coroutine resumptions are not calls and are not counted. The client runs in
another thread (not profiled). Prints the hop count (the median of several requests, so a
background timer firing during one of them does not count) and the files entered most often.

    .venv/bin/python tools/count_hops.py [--requests 7]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import threading
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGE = str(ROOT / "pystub_backend") + "/"
_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


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


def _post(port: int) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/identity_fp32/infer", data=BODY,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


async def _serve_and_count(requests: int, verbose: bool) -> list[HopCounter]:
    from pystub_backend.backend.core import Core, CoreOptions
    from pystub_backend.backend.frontends.http.server import create_http_app
    from pystub_backend.backend.server import Listeners

    core = Core(CoreOptions(repositories=[str(ROOT / "examples" / "models")], model_control_mode="explicit",
                            startup_models=["identity_fp32"]))
    listeners = Listeners()
    counters: list[HopCounter] = []
    try:
        failed = await core.load_repository()
        if failed:
            raise SystemExit(f"failed to load {failed}")
        port = await listeners.start_inference_http(create_http_app(core), "127.0.0.1", 0)
        for _ in range(20):  # warm-up: imports, caches, first arena allocations
            await asyncio.to_thread(_post, port)
        for _ in range(requests):
            counter = HopCounter()
            done = threading.Event()
            thread = threading.Thread(target=lambda done=done: (_post(port), done.set()))
            await asyncio.sleep(0.05)  # the previous request's tail (RELEASE frames, the worker's next turn) is over
            sys.setprofile(counter)
            thread.start()
            while not done.is_set():
                await asyncio.sleep(0.0005)
            await asyncio.sleep(0.02)  # this request's tail belongs to it
            sys.setprofile(None)
            thread.join(30)
            counters.append(counter)
    finally:
        sys.setprofile(None)
        core.begin_shutdown()
        await listeners.stop()
        await core.unload_all()
    if verbose:
        for edge in counters[len(counters) // 2].edges:
            print(f"  {edge[0]} -> {edge[1]}")
    return counters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="print the hops of one request")
    args = parser.parse_args()
    counters = asyncio.run(_serve_and_count(args.requests, args.verbose))
    median = statistics.median_low(c.hops for c in counters)
    typical = next(c for c in counters if c.hops == median)
    print(f"hops per unary HTTP request: {median} (all: {sorted(c.hops for c in counters)}); "
          f"files entered: {len(typical.entries)}")
    for name, count in typical.entries.most_common(12):
        print(f"  {count:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
