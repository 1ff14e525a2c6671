#!/usr/bin/env python3
"""Side-by-side benchmark: pystub against Triton 2.51 (Python backend), MLServer 1.7.1 and the floor.

The peers are installed once into their own virtual environment, .bench/venv (never the
project's .venv; see tools/compare/environment.py for what and why). Every server runs on
loopback with the same models (examples/models/identity_fp32 and add_sub for pystub and Triton,
equivalent MLServer runtimes) and one instance / worker. All servers are up for the whole run
and measured in turn for each point, rounds rotating the order, so that they share the machine's
mood; the table shows medians over the rounds and the ratio of pystub to each peer.

Load generators:
    asyncio         tritonclient's grpc.aio / http.aio clients (Python), C requests in flight for a
                    time window; drives all three servers (MLServer's HTTP rows use JSON tensors)
    perf_analyzer   the C++ load generator from the tritonclient 2.50.0 wheel, time-window mode;
                    pystub, Triton and the floor (it needs the model-config endpoint MLServer lacks)
    stream          a decoupled model's 16 B responses (as an LLM sends tokens) over gRPC
                    ModelStreamInfer and HTTP SSE (generate_stream), 1 and 8 streams: responses/s and
                    CPU per response of the server and its stubs (compare/streaming.py); pystub, Triton
    wrk-h2load      wrk (HTTP) and h2load (gRPC), C load generators posting one pre-built request,
                    installed with apt-get when missing (compare/wrk_h2load.py); not by default

The request path (`--request-path`): the floor (tools/floor, pystub's design reduced to what one
request needs, in pure Python), Triton and pystub (and `--pystub-rev REV`, pystub at another
revision), 16 B over HTTP and gRPC at c=1 and 8 with wrk/h2load and perf_analyzer, and the
pipeline cells (BLS, ensemble, dynamic batching; compare/pipelines.py): markdown tables of CPU
per request of each server process and its model processes, throughput, p50 and the ratios to
Triton and to the floor.

Also measured: client system shared memory at the largest size (pystub when its server metadata
lists `system_shared_memory`, Triton always), and health / metadata latency from a separate
process while 32 small gRPC inferences are in flight. Exits 0 whether targets are met or not.

    .venv/bin/python tools/bench_compare.py                   # everything, 3 rounds (~45 min)
    .venv/bin/python tools/bench_compare.py --quick           # one short round
    .venv/bin/python tools/bench_compare.py --servers pystub,triton --sizes 16,1M --concurrency 8
    .venv/bin/python tools/bench_compare.py --servers pystub,triton --loadgen stream --ceilings none --no-probe
    .venv/bin/python tools/bench_compare.py --request-path --pystub-rev main   # ~10 min; --quick: ~2 min
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _use_project_venv() -> None:
    """Started by another python (e.g. through the shebang): continue in the project's .venv."""
    try:
        import tritonclient.grpc.aio  # noqa: F401
    except ImportError:
        venv_python = ROOT / ".venv" / "bin" / "python"
        if venv_python.exists() and Path(sys.executable).resolve() != venv_python.resolve():
            os.execv(str(venv_python), [str(venv_python), *sys.argv])
        raise SystemExit("tritonclient is missing: run with the project's .venv (./dev.sh test sets it up)") from None


_use_project_venv()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare.main import main  # noqa: E402 - after the interpreter check

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
