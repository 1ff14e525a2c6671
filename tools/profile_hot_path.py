#!/usr/bin/env python3
"""Where a small request's time goes in pystub: py-spy samples of the backend and its stubs under load.

Starts pystub-backend on examples/models, drives identity_fp32 with 16 B tensors (--size) (asyncio load
generator of tools/compare, or perf_analyzer from .bench when present) at concurrency C for S
seconds, while `py-spy record --subprocesses --format raw` samples the backend and the stub. Each
sample is charged to the hot-path step of its innermost pystub frame:

    grpc decode, http codec    frontends/*/codec: wire message -> InferRequest (HTTP: and back)
    validate                   backend/validation
    core + schedule            core, model_version, scheduler, model_instance, statistics, ...
    arena write                ipc/tensors, ipc/arena, ipc/allocator (inputs into p2s, views of s2p)
    queue (frames)             ipc/channel, ipc/wire, msgpack: EXECUTE / RESPONSE / RELEASE frames
    response                   stub_process, response_stream, stub_output (frames -> InferResponse)
    grpc encode                InferResponse -> wire message
    grpc runtime / aiohttp     grpc.aio and aiohttp internals (no pystub frame on the stack)
    asyncio loop               the event loop itself (select, callbacks, tasks)
    stub: ...                  the stub process: receive, translate, model execute, send

and the step's CPU time per request is its samples / rate / requests. Only threads holding the GIL
are sampled (--gil): Python work, not waits (grpc's C core runs without the GIL and is not counted).
Needs py-spy (installed into .bench/venv on first use; root or ptrace permission). Exits 0.

    .venv/bin/python tools/profile_hot_path.py                       # gRPC, concurrency 1, 10 s
    .venv/bin/python tools/profile_hot_path.py --protocol http --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import loadgen, servers  # noqa: E402
from compare.environment import BENCH  # noqa: E402

# (step, pattern on "function (path:line)"), first match from the innermost frame outwards wins
_BACKEND_STEPS = [
    ("grpc encode", r"^(encode_infer_response|serialize_infer_response|_response_head|_output_view) "
                    r"\(pystub_backend/backend/frontends/grpc/codec\.py|^append_length_delimited "),
    ("grpc decode", r"pystub_backend/backend/frontends/grpc/(codec|protobuf_wire)\.py"),
    ("http codec", r"frontends/http/(codec|json_tensors|raw)\.py"),
    ("validate", r"backend/models/validation\.py"),
    ("client shm", r"backend/features/client_shm\.py"),
    ("arena write", r"ipc/(tensors|arena|allocator|segment)\.py"),
    ("queue (frames)", r"ipc/(channel|wire|records|messages/\w+)\.py|supervision/(frames|outbox)\.py|msgpack"),
    ("response", r"backend/supervision/(exchange|stub_process|response_stream|output)\.py"),
    ("core + schedule", r"backend/(core/\w+|models/version|scheduling/\w+|supervision/instance|"
                        r"telemetry/\w+|inference)\.py"),
    ("grpc frontend", r"frontends/grpc/\w+\.py"),
    ("http frontend", r"frontends/http/\w+\.py"),
    ("metrics/logging", r"prometheus|backend/log\.py|logging/"),
    ("grpc runtime", r"grpc/|_cython|cygrpc"),
    ("aiohttp", r"aiohttp|multidict|yarl"),
    ("asyncio loop + grpc callbacks", r"asyncio/|selectors\.py"),
]
_STUB_STEPS = [
    ("stub: model execute", r"model\.py"),
    ("stub: translate", r"stub/(translate|output_buffers)\.py|pb_utils"),
    ("stub: arena", r"ipc/(tensors|arena|allocator|segment)\.py"),
    ("stub: frames", r"ipc/(channel|wire|records|messages/\w+)\.py|msgpack|socket"),
    ("stub: executor", r"stub/(executor|senders|batched)\.py"),
    ("stub: main loop", r"stub/\w+\.py"),
]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^:()]*)(?::\d+)?\)$")


def _py_spy() -> Path:
    """py-spy beside this interpreter (pip install py-spy), else from .bench/venv, installed there on first use."""
    here = Path(sys.executable).parent / "py-spy"
    if here.exists():
        return here
    binary = BENCH / "venv" / "bin" / "py-spy"
    if not binary.exists():
        if not (BENCH / "venv" / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(BENCH / "venv")], check=True, timeout=300)
        subprocess.run([str(BENCH / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "py-spy"],
                       check=True, timeout=600)
    return binary


def classify(stack: list[str], stub: bool) -> str:
    """The step a sampled stack (outermost frame first) is charged to."""
    steps = _STUB_STEPS if stub else _BACKEND_STEPS
    for frame in reversed(stack):
        for step, pattern in steps:
            if re.search(pattern, frame):
                return step
    return "stub: other" if stub else "other"


def parse_raw(text: str) -> tuple[Counter, Counter]:
    """py-spy raw (collapsed) output -> samples per backend step and per stub step."""
    backend, stub = Counter(), Counter()
    for line in text.splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        frames = stack_text.split(";")
        # with --subprocesses a stub's stacks start "process <backend>;process <stub>;..."
        is_stub = any(f.startswith("process ") and "triton_python_backend_stub" in f for f in frames)
        frames = [f for f in frames if not f.startswith("process ")]
        (stub if is_stub else backend)[classify(frames, is_stub)] += int(count)
    return backend, stub


async def _drive(server: servers.Server, protocol: str, concurrency: int, seconds: float,
                 nbytes: int = 16) -> loadgen.Sample:
    point = loadgen.Point("identity_fp32", nbytes, concurrency, protocol)
    return await loadgen.measure(server.url(protocol), point, 0.0, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--size", type=int, default=16, help="bytes per input tensor (default 16)")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's collapsed stacks here")
    parser.add_argument("--native", action="store_true", help="sample native frames too (grpc's cython layer)")
    args = parser.parse_args()
    py_spy = _py_spy()
    with tempfile.TemporaryDirectory(prefix="pystub-profile-") as tmp:
        workdir = Path(tmp)
        repositories = servers.write_repositories(workdir)
        server = servers.start_pystub(repositories, workdir, client_shm=False)
        try:
            servers.wait_ready([server])
            asyncio.run(_drive(server, args.protocol, args.concurrency, 1.0, args.size))  # warm-up
            raw = workdir / "profile.txt"
            mode = ["--native"] if args.native else ["--nonblocking"]  # py-spy cannot combine the two
            spy = subprocess.Popen([str(py_spy), "record", "--pid", str(server.process.pid), "--subprocesses", *mode,
                                    "--gil", "--rate", str(args.rate), "--format", "raw", "--output", str(raw),
                                    "--duration", str(int(args.seconds) + 1)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(0.5)
            sample = asyncio.run(_drive(server, args.protocol, args.concurrency, args.seconds, args.size))
            _, err = spy.communicate(timeout=args.seconds + 60)
            if not raw.exists():
                raise SystemExit(f"py-spy wrote nothing: {err[-2000:]}")
            backend, stub = parse_raw(raw.read_text())
            if args.raw:
                args.raw.write_text(raw.read_text())
        finally:
            servers.stop(server)
    _report(args, sample, backend, stub)
    return 0


def _report(args: argparse.Namespace, sample: loadgen.Sample, backend: Counter, stub: Counter) -> None:
    requests = sample.throughput * args.seconds
    print(f"identity_fp32 {args.size} B over {args.protocol}, concurrency {args.concurrency}: "
          f"{sample.throughput:.0f} infer/s, p50 {sample.p50_ms:.2f} ms, p99 {sample.p99_ms:.2f} ms "
          "(client: tritonclient asyncio)")
    print(f"CPU per request by step (py-spy at {args.rate} Hz; samples / rate / {requests:.0f} requests):")
    for title, counter in (("backend process", backend), ("stub process", stub)):
        total = sum(counter.values())
        print(f"  {title}: {total / args.rate / max(1, requests) * 1e6:7.0f} us/request")
        for step, count in counter.most_common():
            per_request = count / args.rate / max(1, requests) * 1e6
            print(f"    {step:22} {per_request:7.1f} us  {100 * count / max(1, total):5.1f}%")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
