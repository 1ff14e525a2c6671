#!/usr/bin/env python3
"""Shared weights (PYSTUB_SHARE_WEIGHTS) against the ordinary mode, measured in one run.

For each model the same repository is loaded twice into a fresh `pystub-backend` (explicit model
control), once with the parameter "yes" and once "no":

    numpy     initialize makes --numpy-mib MiB of numpy weights; execute reads all of them
    torch     a PyTorch CPU MLP of --torch-mib MiB (4096x4096 fp32 layers, 64 MiB each), which
              initialize runs once on its intra-op threads; execute runs it
    slow      initialize computes for --slow-init-seconds of CPU time (a model that loads for
              seconds: eight of them share two cores in the ordinary mode)

and reports: the PSS (/proc/<pid>/smaps_rollup) of every instance plus the template, summed,
after --requests inferences; the time from the load request to the model being ready; the
time from `kill -9` of one instance to that instance serving again (restart). The ordinary mode
is the same-run baseline of every figure. `free -g` and the load average are printed first.

    .venv/bin/python tools/bench_shared_weights.py [--count 4] [--slow-count 8] [--numpy-mib 1024]
        [--torch-mib 384] [--only numpy,torch,slow]

Mind the memory: the ordinary numpy case holds count x --numpy-mib at once (4 GiB by default).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]

_CONFIG = """\
backend: "python"
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
parameters {{ key: "PYSTUB_SHARE_WEIGHTS", value: {{ string_value: "{share}" }} }}
parameters {{ key: "SIZE", value: {{ string_value: "{size}" }} }}
"""

_PARAMETERS = """\
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


def parameter(args):
    return json.loads(args["model_config"])["parameters"]["SIZE"]["string_value"]


def answer(requests, value):
    return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([value], np.float32))])
            for _ in requests]
"""

MODELS = {
    "numpy": _PARAMETERS + textwrap.dedent("""
        class TritonPythonModel:
            def initialize(self, args):
                self.weights = np.ones((int(parameter(args)) << 20) // 4, np.float32)

            def execute(self, requests):
                return answer(requests, float(self.weights.sum()))
        """),
    "torch": _PARAMETERS + textwrap.dedent("""
        import torch


        class TritonPythonModel:
            def initialize(self, args):
                layers = [torch.nn.Linear(4096, 4096, bias=False) for _ in range(int(parameter(args)) // 64)]
                self.model = torch.nn.Sequential(*layers).eval()
                with torch.inference_mode():
                    self.model(torch.randn(8, 4096))  # intra-op threads at work in initialize

            def execute(self, requests):
                with torch.inference_mode():
                    out = self.model(torch.ones(1, 4096))
                return answer(requests, float(out.sum()))
        """),
    "slow": _PARAMETERS + textwrap.dedent("""
        class TritonPythonModel:
            def initialize(self, args):
                until = time.process_time() + float(parameter(args))
                while time.process_time() < until:
                    sum(range(10000))

            def execute(self, requests):
                return answer(requests, 1.0)
        """),
}
WIDTH = {"numpy": 1, "torch": 4096, "slow": 1}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A pystub-backend on a repository, explicit model control, its own ports."""

    def __init__(self, repository: Path) -> None:
        self.http = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="bench-shared-", suffix=".log", delete=False)  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repository),
             "--http-port", str(self.http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
             "--model-control-mode=explicit"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while not self._live():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the backend did not start; its log: {self.log.name}")
            time.sleep(0.1)
        self.client = httpclient.InferenceServerClient(f"127.0.0.1:{self.http}", network_timeout=600)

    def _live(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/live", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stubs(self, model: str) -> dict[str, dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/pystub/stubs", timeout=30) as reply:
            return {row["instance"]: row for row in json.loads(reply.read())["stubs"] if row["model"] == model}

    def stop(self) -> None:
        self.client.close()
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


def pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:")) / 1024


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def infer(server: Server, model: str, requests: int, clients: int = 4) -> None:
    """`requests` inferences from `clients` threads, one client each (a client is not thread-safe)."""
    def some(share: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=600)
        try:
            for _ in range(share):
                tensor = httpclient.InferInput("INPUT0", [WIDTH[model]], "FP32")
                tensor.set_data_from_numpy(np.ones(WIDTH[model], np.float32))
                client.infer(model, [tensor])
        finally:
            client.close()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(some, [requests // clients] * clients))


def measure(kind: str, share: bool, count: int, size: str, requests: int, restart: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as folder:
        repository = Path(folder)
        (repository / kind / "1").mkdir(parents=True)
        (repository / kind / "1" / "model.py").write_text(MODELS[kind])
        (repository / kind / "config.pbtxt").write_text(
            _CONFIG.format(width=WIDTH[kind], count=count, share="yes" if share else "no", size=size))
        server = Server(repository)
        try:
            started = time.monotonic()
            server.client.load_model(kind)
            figures = {"ready_s": time.monotonic() - started}
            infer(server, kind, requests)
            pids = [row["pid"] for row in server.stubs(kind).values()]
            processes = set(pids) | {parent(pid) for pid in pids if parent(pid) != server.process.pid}
            figures["pss_mib"] = sum(pss_mib(pid) for pid in processes)
            figures["processes"] = len(processes)
            if restart:
                figures["restart_s"] = restart_time(server, kind)
            return figures
        finally:
            server.stop()


def restart_time(server: Server, model: str) -> float:
    name, row = sorted(server.stubs(model).items())[-1]
    started = time.monotonic()
    os.kill(row["pid"], signal.SIGKILL)
    while True:
        now = server.stubs(model)[name]
        if now["healthy"] and now["restarts"] > row["restarts"]:
            return time.monotonic() - started
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--slow-count", type=int, default=8)
    parser.add_argument("--numpy-mib", type=int, default=1024)
    parser.add_argument("--torch-mib", type=int, default=384)
    parser.add_argument("--slow-init-seconds", type=float, default=3.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--only", default="numpy,torch,slow")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `timeout` too stops the backends it started
    print(subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.rstrip())
    print("load average before:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    cases = {"numpy": (options.count, str(options.numpy_mib), False),
             "torch": (options.count, str(options.torch_mib), False),
             "slow": (options.slow_count, str(options.slow_init_seconds), True)}
    print(f"\n{'model':<8}{'count':>6} {'mode':<9}{'procs':>6}{'PSS MiB':>10}{'ready s':>9}{'restart s':>11}")
    for kind in options.only.split(","):
        count, size, restart = cases[kind]
        rows = {share: measure(kind, share, count, size, options.requests, restart) for share in (False, True)}
        for share, figures in rows.items():
            restart_text = f"{figures['restart_s']:>11.3f}" if "restart_s" in figures else f"{'':>11}"
            print(f"{kind:<8}{count:>6} {'shared' if share else 'ordinary':<9}{figures['processes']:>6.0f}"
                  f"{figures['pss_mib']:>10.0f}{figures['ready_s']:>9.2f}{restart_text}", flush=True)
        shared, ordinary = rows[True], rows[False]
        ratios = [f"PSS x{shared['pss_mib'] / ordinary['pss_mib']:.2f}",
                  f"ready x{shared['ready_s'] / ordinary['ready_s']:.2f}"]
        if restart:
            ratios.append(f"restart x{shared['restart_s'] / ordinary['restart_s']:.3f}")
        print(f"{'':<15}shared/ordinary: {', '.join(ratios)}", flush=True)
    print("load average after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
