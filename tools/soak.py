#!/usr/bin/env python3
"""Soak: mixed traffic against a real pystub-backend for a while, with leak checks.

    tools/soak.py                       2 minutes, 6 clients (what CI runs)
    tools/soak.py --seconds 3600        an hour
    tools/soak.py --chaos               with faults while the load runs (tools/soak_chaos.py)
    tools/soak.py --json report.json    the whole report, every sample included

Traffic (tools/soak_traffic.py): HTTP JSON and binary, BYTES, gRPC, gRPC streams of a decoupled
model, dynamic batching, sequences, BLS; every answer is checked. Every `--sample-every` seconds
the soak records the backend's and each stub's RSS and fds, the arenas' bytes and the backend's
/dev/shm entries. It prints requests and errors by cause, p50/p99 latency per kind, RSS over time
and the leak counts at start (after the warm-up) and end (after the load stopped and the server
settled), and exits 1 when a check fails:

    requests   every request sent has exactly one outcome (sent == ok + errors); without --chaos
               no errors at all; with it only errors a fault explains (stub died, shm full, model
               unloaded, sequence evicted, client closed), never a timeout, a wrong answer or an
               unexplained error; after the faults one request of every kind succeeds
    memory     backend RSS grows by at most max(--rss-tolerance-mib, --rss-tolerance-pct %) from
               start to end; so does every stub that lived through the run. With --chaos: so from
               the end of the faults to the end, and by at most 96 MiB from start to end (the
               faults cost memory once: 8 MiB messages served and failed while /dev/shm is full)
    shm        at the end every /dev/shm entry of the backend belongs to a live stub, there are no
               more than at the start, and no arena holds a byte (p2s and s2p used == 0)
    fds        the backend holds at most --fd-tolerance more descriptors than at the start; every
               stub that lived through the run as many as at the start

With --chaos the backend runs in a private mount namespace whose /dev/shm is a small tmpfs (when
`unshare` works here; the "fill shm" fault is skipped otherwise), in explicit model-control mode,
with a 2 s heartbeat timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_chaos import Chaos, ChaosOptions  # noqa: E402
from soak_traffic import EXPECTED_UNDER_FAULTS, KINDS, REQUESTS, Clients, Ledger, Worker  # noqa: E402

__all__ = ["run", "Options", "make_repository", "backend_flags", "format_report", "KINDS", "TMPFS_WRAPPER",
           "tmpfs_wrapper_works", "Launcher"]

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
TMPFS_MIB = 192
TMPFS_WRAPPER = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f'mount -t tmpfs -o size={TMPFS_MIB}m,mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]

LEAF = '''"""OUT = IN + 1 (the soak's BLS target)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() + 1)]) for r in requests]
'''
CALLER = '''"""OUT = soak_leaf(IN), through BLS; a BLS error becomes this request's error."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(model_name="soak_leaf", inputs=[pb_utils.Tensor("IN", data)],
                                             requested_output_names=["OUT"])
            response = call.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.copy())]))
        return responses
'''
BLS_CONFIG = '''backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
'''
BATCH_CONFIG = '''backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
'''


def make_repository(directory: Path) -> Path:
    """The soak's models: examples, repeat and flood (decoupled), accumulate (sequences), batch_identity
    (dynamic batching) and soak_bls -> soak_leaf (BLS)."""
    repository = Path(directory) / "models"
    repository.mkdir(parents=True, exist_ok=True)
    examples = ROOT / "examples"
    for name in ("identity_fp32", "add_sub", "string_identity"):
        shutil.copytree(examples / "models" / name, repository / name)
    shutil.copytree(examples / "sequence_models" / "accumulate", repository / "accumulate")
    for name in ("repeat", "flood"):  # flood: the chaos's unread and vanishing streams
        shutil.copytree(ROOT / "tests" / "models" / name, repository / name)
    for name, config, code in (("batch_identity", BATCH_CONFIG, (examples / "models" / "identity_fp32" / "1" /
                                                                 "model.py").read_text()),
                               ("soak_leaf", BLS_CONFIG, LEAF), ("soak_bls", BLS_CONFIG, CALLER)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(config)
        (repository / name / "1" / "model.py").write_text(code)
    return repository


def backend_flags(chaos: bool, heartbeat: float = 2.0) -> list[str]:
    if not chaos:
        return []
    return ["--model-control-mode=explicit", "--load-model=*", "--allow-client-shm=true",
            f"--backend-config=python,stub-heartbeat-timeout-seconds={heartbeat:g}",
            "--backend-config=python,stub-max-restarts=50",
            # the chaos's slow clients (tools/soak_chaos.py SLOW_CLIENT_TIMEOUT) are closed this soon
            "--http-header-timeout-secs=2", "--http-body-timeout-secs=2"]


def tmpfs_wrapper_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(TMPFS_WRAPPER + ["true"], capture_output=True, timeout=30)
    return probe.returncode == 0


# -- a backend of our own (the CLI; tests use tests/harness.Backend) ----------------------------------
_PORT_LINE = re.compile(r"Started (HTTPService|GRPCInferenceService) at [\d.]+:(\d+)")


class Launcher:
    """`python -m pystub_backend.backend` on ephemeral ports in its own session; `stop()` checks a clean exit."""

    def __init__(self, repository: Path, flags: list[str], wrapper: list[str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="soak-backend-", suffix=".log")[1])
        self.repository = str(repository)
        command = [*wrapper, sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repository),
                   "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *flags]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=ROOT, env=env, start_new_session=True)
        self.pid = self.process.pid
        ports = self._ports(timeout=120)
        self.http_url = f"127.0.0.1:{ports['HTTPService']}"
        self.grpc_url = f"127.0.0.1:{ports['GRPCInferenceService']}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _ports(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {m.group(1): int(m.group(2)) for m in _PORT_LINE.finditer(self.log())}
            if len(found) == 2:
                return found
            if self.process.poll() is not None:
                raise RuntimeError(f"the backend exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the backend did not listen within {timeout} s:\n{self.log()[-3000:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(90)
        except subprocess.TimeoutExpired:
            code = -9
        try:
            os.killpg(self.pid, signal.SIGKILL)  # anything left in its session
        except ProcessLookupError:
            pass
        self.process.wait(10)
        return code


# -- samples -------------------------------------------------------------------------------------------
@dataclass
class Sample:
    t: float
    backend_rss: int
    backend_fds: int
    stubs: dict[str, dict[str, int]]  # instance -> pid, rss, fds, p2s/s2p used/total
    shm_entries: int
    shm_orphans: list[str]  # entries that belong to no live stub

    @property
    def stub_rss(self) -> int:
        return sum(s["rss"] for s in self.stubs.values())

    @property
    def arena_used(self) -> int:
        return sum(s["p2s_used"] + s["s2p_used"] for s in self.stubs.values())

    @property
    def arena_total(self) -> int:
        return sum(s["p2s_total"] + s["s2p_total"] for s in self.stubs.values())


def stub_rows(server: Any) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/pystub/stubs", timeout=30) as response:
        return json.loads(response.read())["stubs"]


def _fds(pid: int | None) -> int:
    try:
        return psutil.Process(pid).num_fds() if pid else 0
    except psutil.Error:
        return 0


def _shm(server: Any) -> tuple[int, list[str]]:
    """(entries of the backend in its /dev/shm, those that belong to no live stub)."""
    prefix = f"pystub_{server.pid}_"
    try:
        entries = [n for n in os.listdir(f"/proc/{server.pid}/root/dev/shm") if n.startswith(prefix)]
    except OSError:
        return 0, []
    bases = []
    for child in psutil.Process(server.pid).children():
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if "--base" in command:
            bases.append(command[command.index("--base") + 1] + "_")
    return len(entries), sorted(n for n in entries if not n.startswith(tuple(bases)))


def take_sample(server: Any, started: float) -> Sample:
    backend = psutil.Process(server.pid)
    stubs = {}
    for row in stub_rows(server):
        stubs[row["instance"]] = {"pid": row["pid"] or 0, "rss": row["rss_bytes"], "fds": _fds(row["pid"]),
                                  "healthy": int(row["healthy"]), "restarts": row["restarts"],
                                  "p2s_used": row["arena_used_bytes"], "p2s_total": row["arena_total_bytes"],
                                  "s2p_used": row.get("s2p_used_bytes", 0), "s2p_total": row.get("s2p_total_bytes", 0),
                                  "in_flight": row["in_flight"]}
    entries, orphans = _shm(server)
    return Sample(round(time.monotonic() - started, 2), backend.memory_info().rss, backend.num_fds(), stubs,
                  entries, orphans)


class Sampler(threading.Thread):
    def __init__(self, server: Any, every: float, started: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.server, self.every, self.started = server, every, started
        self.samples: list[Sample] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            try:
                self.samples.append(take_sample(self.server, self.started))
            except (OSError, psutil.Error, ValueError):
                pass  # a sample missed under load is not a failure


def settle(server: Any, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The stub rows once nothing is in flight and no arena holds a byte (releases are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = stub_rows(server)
        idle = all(r["healthy"] and r["in_flight"] == 0 and r["arena_used_bytes"] == 0
                   and r.get("s2p_used_bytes", 0) == 0 for r in rows)
        if idle or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


# -- the run -------------------------------------------------------------------------------------------
@dataclass
class Options:
    seconds: float = 120.0
    clients: int = 6
    sample_every: float = 5.0
    warmup: float | None = None  # default: seconds / 8, at most 15
    chaos: bool = False
    chaos_options: ChaosOptions = field(default_factory=ChaosOptions)
    rss_tolerance_mib: float = 24.0
    rss_tolerance_pct: float = 10.0
    chaos_rss_tolerance_mib: float = 96.0  # start to end of a chaos run (see check())
    after_faults: float = 8.0  # with --chaos: seconds of load after the last fault, at least
    fd_tolerance: int = 8


def run(server: Any, options: Options) -> dict[str, Any]:
    """Drive the load (and the faults) against `server` (.pid, .http_url, .grpc_url, .log()) and
    return the report, with `report["failures"]` listing every failed check."""
    started = time.monotonic()
    ledger = Ledger()
    stop = threading.Event()
    workers = [Worker(i, server.http_url, server.grpc_url, ledger, stop) for i in range(options.clients)]
    for worker in workers:
        worker.start()
    warmup = options.warmup if options.warmup is not None else min(15.0, options.seconds / 8)
    chaos = None
    if options.chaos:
        chaos = Chaos(server.pid, server.http_url, server.grpc_url, ledger, options.chaos_options,
                      repository=getattr(server, "repository", ""))
        chaos.warm_up()
    time.sleep(max(0.0, warmup - (time.monotonic() - started)))
    start = recovered = take_sample(server, started)
    sampler = Sampler(server, options.sample_every, started)
    sampler.start()
    if chaos is not None:
        workers.append(chaos.start_abrupt_clients(stop))  # type: ignore[arg-type]
        chaos.run(stop)  # the schedule runs under load; the load goes on after it
        recovered = take_sample(server, started)
        time.sleep(max(options.after_faults, options.seconds - (time.monotonic() - started)))
    else:
        time.sleep(max(0.0, options.seconds - (time.monotonic() - started)))
    stop.set()
    for worker in workers:
        worker.join(60)
    sampler.stop_event.set()
    sampler.join(30)
    hung = [worker.name for worker in workers if worker.is_alive()]
    settled = settle(server)
    verification = verify_every_kind(server) if options.chaos else {}
    settle(server)
    end = take_sample(server, started)
    report = _report(options, ledger, start, end, sampler.samples, hung, settled, verification, chaos, started)
    report["recovered"] = asdict(recovered)
    report["failures"] = check(report, options, start, end, recovered)
    return report


def verify_every_kind(server: Any) -> dict[str, str]:
    """One request of every kind after the faults: each must succeed."""
    import random

    results = {}
    clients = Clients(server.http_url, server.grpc_url)
    rng = random.Random(5)
    try:
        for kind, function in [*REQUESTS.items(), ("sequence", None)]:
            try:
                if function is None:
                    worker = Worker(0, server.http_url, server.grpc_url, Ledger(), threading.Event())
                    worker._sequence(clients)
                    totals = worker.ledger.totals()
                    results[kind] = "ok" if totals["ok"] == totals["sent"] else str(worker.ledger.samples)
                else:
                    function(clients, rng)
                    results[kind] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported
                results[kind] = f"{type(exc).__name__}: {exc}"
    finally:
        clients.close()
    return results


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(options: Options, ledger: Ledger, start: Sample, end: Sample, samples: list[Sample], hung: list[str],
            settled: list[dict[str, Any]], verification: dict[str, str], chaos: Chaos | None,
            started: float) -> dict[str, Any]:
    kinds = {}
    for kind in sorted(set(ledger.sent) | set(ledger.errors)):
        latencies = ledger.latencies.get(kind, [])
        kinds[kind] = {"sent": ledger.sent.get(kind, 0), "ok": ledger.ok.get(kind, 0),
                       "errors": ledger.errors.get(kind, {}),
                       "p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
                       "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2)}
    everything = [x for values in ledger.latencies.values() for x in values]
    return {
        "options": {k: v for k, v in asdict(options).items() if k != "chaos_options"},
        "elapsed_s": round(time.monotonic() - started, 1),
        "totals": ledger.totals(),
        "p50_ms": round(_percentile(everything, 0.5) * 1000, 2),
        "p99_ms": round(_percentile(everything, 0.99) * 1000, 2),
        "kinds": kinds,
        "error_samples": ledger.samples,
        "hung_workers": hung,
        "start": asdict(start), "end": asdict(end),
        "series": [{"t": s.t, "backend_rss_mib": round(s.backend_rss / MIB, 1),
                    "stub_rss_mib": round(s.stub_rss / MIB, 1), "arena_used": s.arena_used,
                    "arena_total": s.arena_total, "shm": s.shm_entries, "backend_fds": s.backend_fds}
                   for s in [start, *samples, end]],
        "verification": verification,
        "faults": [{**e, "start": round(e["start"] - started, 2), "end": round(e["end"] - started, 2)}
                   for e in (chaos.events if chaos else [])],
        "restarts": sum(s["restarts"] for s in end.stubs.values()),
    }


def check(report: dict[str, Any], options: Options, start: Sample, end: Sample, recovered: Sample) -> list[str]:
    """Every failed check, as a sentence."""
    failures = []
    totals = report["totals"]
    if totals["lost"] or report["hung_workers"]:
        failures.append(f"{totals['lost']} request(s) without an outcome; workers still running: "
                        f"{report['hung_workers']}")
    causes = totals["by_cause"]
    allowed = EXPECTED_UNDER_FAULTS if options.chaos else set()
    bad = {cause: count for cause, count in causes.items() if cause not in allowed}
    if bad:
        failures.append(f"errors not explained by a fault: {bad}; e.g. "
                        f"{[m for c in bad for m in report['error_samples'].get(c, [])][:3]}")
    if options.chaos:
        broken = {kind: result for kind, result in report["verification"].items() if result != "ok"}
        if broken:
            failures.append(f"after the faults, requests still fail: {broken}")
        unapplied = [e for e in report["faults"] if e["detail"].startswith("could not")]
        if unapplied:
            failures.append(f"faults that could not be applied: {unapplied}")
    if options.chaos:
        # The faults cost memory once (8 MiB requests served and failed while /dev/shm was full,
        # restarted stubs): after them, no growth beyond the tolerance; over the whole run, no
        # more than the larger chaos tolerance.
        failures += _memory_checks(options, recovered, end, "after the faults")
        failures += _memory_checks(options, start, end, "over the run", options.chaos_rss_tolerance_mib)
    else:
        failures += _memory_checks(options, start, end, "over the run")
    if end.shm_orphans:
        failures.append(f"/dev/shm entries of no live stub: {end.shm_orphans}")
    if end.shm_entries > start.shm_entries:
        failures.append(f"/dev/shm entries grew from {start.shm_entries} to {end.shm_entries}")
    if end.arena_used:
        holding = {k: (s["p2s_used"], s["s2p_used"]) for k, s in end.stubs.items() if s["p2s_used"] or s["s2p_used"]}
        failures.append(f"arenas still hold {end.arena_used} bytes after the load (p2s, s2p): {holding}")
    if end.backend_fds > start.backend_fds + options.fd_tolerance:
        failures.append(f"backend fds grew from {start.backend_fds} to {end.backend_fds} "
                        f"(tolerance {options.fd_tolerance})")
    for name, stub in end.stubs.items():
        before = start.stubs.get(name)
        if before and before["pid"] == stub["pid"] and stub["fds"] > before["fds"]:
            failures.append(f"stub {name} fds grew from {before['fds']} to {stub['fds']}")
        if not stub["healthy"]:
            failures.append(f"stub {name} is not healthy at the end")
    return failures


def _memory_checks(options: Options, start: Sample, end: Sample, when: str,
                   tolerance_mib: float | None = None) -> list[str]:
    def allowed(before: int) -> float:
        return max((tolerance_mib or options.rss_tolerance_mib) * MIB, before * options.rss_tolerance_pct / 100)

    failures = []
    growth = end.backend_rss - start.backend_rss
    if growth > allowed(start.backend_rss):
        failures.append(f"backend RSS grew by {growth / MIB:.1f} MiB {when} ({start.backend_rss / MIB:.1f} -> "
                        f"{end.backend_rss / MIB:.1f}); tolerance {allowed(start.backend_rss) / MIB:.1f} MiB")
    for name, stub in end.stubs.items():
        before = start.stubs.get(name)
        if before and before["pid"] == stub["pid"] and stub["rss"] - before["rss"] > allowed(before["rss"]):
            failures.append(f"stub {name} RSS grew by {(stub['rss'] - before['rss']) / MIB:.1f} MiB {when}")
    return failures


def format_report(report: dict[str, Any]) -> str:
    totals = report["totals"]
    lines = [f"soak: {report['elapsed_s']} s, {report['options']['clients']} clients"
             f"{', chaos' if report['options']['chaos'] else ''}",
             f"requests: {totals['sent']} sent, {totals['ok']} ok, {totals['errors']} errors, {totals['lost']} lost; "
             f"p50 {report['p50_ms']} ms, p99 {report['p99_ms']} ms",
             f"errors by cause: {totals['by_cause'] or 'none'}"]
    lines.append(f"{'kind':<12} {'sent':>7} {'ok':>7} {'p50 ms':>8} {'p99 ms':>8}  errors")
    for kind, row in report["kinds"].items():
        lines.append(f"{kind:<12} {row['sent']:>7} {row['ok']:>7} {row['p50_ms']:>8} {row['p99_ms']:>8}  "
                     f"{row['errors'] or ''}")
    for fault in report["faults"]:
        lines.append(f"fault at {fault['start']:.1f} s: {fault['fault']}: {fault['detail']}")
    if report["verification"]:
        lines.append(f"after the faults: {report['verification']}")
    lines.append("t(s)    backend RSS MiB  stubs RSS MiB  arena used/total      shm  backend fds")
    for row in report["series"]:
        lines.append(f"{row['t']:<7} {row['backend_rss_mib']:>15} {row['stub_rss_mib']:>14}  "
                     f"{row['arena_used']:>9}/{row['arena_total']:<10} {row['shm']:>4} {row['backend_fds']:>12}")
    start, end = report["start"], report["end"]
    lines.append(f"start: shm {start['shm_entries']}, backend fds {start['backend_fds']}, stub fds "
                 f"{sum(s['fds'] for s in start['stubs'].values())}; end: shm {end['shm_entries']} "
                 f"(orphans {len(end['shm_orphans'])}), backend fds {end['backend_fds']}, stub fds "
                 f"{sum(s['fds'] for s in end['stubs'].values())}; stub restarts {report['restarts']}")
    lines.append("PASS" if not report["failures"] else "FAIL:\n  " + "\n  ".join(report["failures"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the load runs (default 120)")
    parser.add_argument("--clients", type=int, default=6, help="client threads (default 6)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--chaos", action="store_true", help="inject faults while the load runs")
    parser.add_argument("--rss-tolerance-mib", type=float, default=24.0)
    parser.add_argument("--rss-tolerance-pct", type=float, default=10.0)
    parser.add_argument("--fd-tolerance", type=int, default=8)
    parser.add_argument("--json", help="write the report (every sample included) to this file")
    parser.add_argument("--keep", action="store_true", help="keep the repository and the backend's log")
    args = parser.parse_args(argv)
    options = Options(seconds=args.seconds, clients=args.clients, sample_every=args.sample_every, chaos=args.chaos,
                      rss_tolerance_mib=args.rss_tolerance_mib, rss_tolerance_pct=args.rss_tolerance_pct,
                      fd_tolerance=args.fd_tolerance)
    workdir = Path(tempfile.mkdtemp(prefix="pystub-soak-"))
    wrapper = TMPFS_WRAPPER if args.chaos and tmpfs_wrapper_works() else []
    if args.chaos and not wrapper:
        print("note: cannot mount a private tmpfs on /dev/shm here; the 'fill shm' fault will be skipped")
    server = Launcher(make_repository(workdir), backend_flags(args.chaos, options.chaos_options.heartbeat_timeout),
                      wrapper)
    try:
        report = run(server, options)
    finally:
        code = server.stop()
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"pystub_{server.pid}_")]
    if code != 0 or left:
        report["failures"].append(f"backend exit status {code}, /dev/shm entries left after it stopped: {left}")
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    if args.keep:
        print(f"repository and log: {workdir}, {server.log_path}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        server.log_path.unlink(missing_ok=True)
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
