"""Collects the rounds' samples and prints the comparison table, the ratios and the issue's targets."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from compare.loadgen import Point, Sample

LOADGEN_TITLES = {"asyncio": "tritonclient asyncio clients (Python)", "perf_analyzer": "perf_analyzer 2.50 (C++)",
                  "prebuilt": "pre-built JSON bodies over aiohttp (JSON tensors; the client does no JSON work)",
                  "stream": "streamed responses of a decoupled model (grpc threads / aiohttp readers, raw bytes)",
                  "wrk-h2load": "wrk (HTTP) and h2load (gRPC), C, one pre-built request each"}


def size_text(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


@dataclass
class Results:
    """Every sample of the run, keyed by (load generator, server, point)."""

    servers: list[str]
    rounds: int = 0
    samples: dict[tuple[str, str, Point], list[Sample]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[tuple[str, str, Point], str] = field(default_factory=dict)
    probes: dict[str, list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))
    notes: list[str] = field(default_factory=list)
    minutes: float = 0.0  # how long the run took

    def add(self, loadgen: str, server: str, point: Point, sample: Sample) -> None:
        self.samples[(loadgen, server, point)].append(sample)

    def fail(self, loadgen: str, server: str, point: Point, reason: str) -> None:
        self.failures[(loadgen, server, point)] = reason.splitlines()[0][:160] if reason else "failed"

    def median(self, loadgen: str, server: str, point: Point) -> Sample | None:
        samples = self.samples.get((loadgen, server, point))
        if not samples:
            return None
        return Sample(throughput=statistics.median(s.throughput for s in samples),
                      p50_ms=statistics.median(s.p50_ms for s in samples),
                      p99_ms=statistics.median(s.p99_ms for s in samples),
                      count=sum(s.count for s in samples), errors=sum(s.errors for s in samples),
                      cpu_server_us=statistics.median(s.cpu_server_us for s in samples),
                      cpu_children_us=statistics.median(s.cpu_children_us for s in samples),
                      cpu_client_us=statistics.median(s.cpu_client_us for s in samples))

    def points(self, loadgen: str) -> list[Point]:
        seen = {_plain(key[2]) for key in list(self.samples) + list(self.failures) if key[0] == loadgen}
        return sorted(seen, key=lambda p: (p.model != "identity_fp32", p.model, p.shm, p.nbytes, p.concurrency,
                                           p.protocol.startswith("http")))

    def as_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "notes": self.notes, "probes": dict(self.probes),
                "samples": [{"loadgen": k[0], "server": k[1], **k[2].__dict__, "rounds": [s.as_dict() for s in v]}
                            for k, v in self.samples.items()],
                "failures": [{"loadgen": k[0], "server": k[1], **k[2].__dict__, "reason": v}
                             for k, v in self.failures.items()]}


def _plain(point: Point) -> Point:
    """MLServer's JSON rows sit in the HTTP row of the table."""
    if point.protocol == "http-json":
        return Point(point.model, point.nbytes, point.concurrency, "http", point.shm)
    return point


def _cell(sample: Sample | None, failure: str | None) -> str:
    if sample is None:
        return f"{'failed' if failure else '-':>22}"
    return f"{_num(sample.throughput, 8)} {_num(sample.p50_ms, 6)} {_num(sample.p99_ms, 6)}"


def _num(value: float, width: int) -> str:
    """Three significant digits at most, fixed width: 0.123, 1.23, 12.3, 1234."""
    if value != value:  # NaN
        return f"{'-':>{width}}"
    text = f"{value:.0f}" if value >= 100 else f"{value:.3g}"
    return f"{text:>{width}}"


def _ratio(ours: Sample | None, theirs: Sample | None) -> str:
    if ours is None or theirs is None or not theirs.throughput or not theirs.p50_ms:
        return f"{'':>17}"
    return (f"{ours.throughput / theirs.throughput:5.2f}x {ours.p50_ms / theirs.p50_ms:5.2f} "
            f"{ours.p99_ms / theirs.p99_ms if theirs.p99_ms else math.nan:5.2f}")


def _measured_servers(results: Results, loadgen: str) -> list[str]:
    """The servers with a sample from `loadgen`, in the run's order: a table's columns."""
    return [s for s in results.servers if any(k[0] == loadgen and k[1] == s for k in results.samples)]


def table(results: Results, loadgen: str) -> list[str]:
    """One table: a row per point, a cell per server (infer/s, p50 ms, p99 ms), ratios pystub/peer."""
    servers = _measured_servers(results, loadgen)
    peers = [s for s in servers if s != "pystub"]
    head = f"{'model':13} {'size':>6} {'shm':3} {'conc':>4} {'proto':5} |"
    head += "".join(f" {s + ': inf/s  p50  p99':>22} |" for s in servers)
    head += "".join(f" {'pystub/' + p + ' thr p50 p99':>17} |" for p in peers if "pystub" in servers)
    lines = [f"== load generator: {LOADGEN_TITLES[loadgen]}; median of {results.rounds} round(s); "
             "inf/s, p50 and p99 in ms ==", head, "-" * len(head)]
    for point in results.points(loadgen):
        proto = "http" if point.protocol.startswith("http") else point.protocol
        row = f"{point.model:13} {size_text(point.nbytes):>6} {'yes' if point.shm else '':3} " \
              f"{point.concurrency:>4} {proto:5} |"
        medians = {}
        for server in servers:
            key_point = point
            if server == "mlserver" and point.protocol == "http":
                key_point = Point(point.model, point.nbytes, point.concurrency, "http-json", point.shm)
            medians[server] = results.median(loadgen, server, key_point)
            row += f" {_cell(medians[server], results.failures.get((loadgen, server, key_point)))} |"
        if "pystub" in servers:
            row += "".join(f" {_ratio(medians['pystub'], medians[p])} |" for p in peers)
        lines.append(row)
    lines.append("ratios: thr = pystub throughput / peer's (higher is better); p50, p99 = pystub latency / "
                 "peer's (lower is better). MLServer's HTTP rows are JSON (it has no binary tensor extension); "
                 "json rows are JSON tensors on every server. bare-* columns are frontends with nothing behind them "
                 "(compare/bare.py): pystub/bare-* is the share of its frontend's ceiling pystub reaches.")
    failed = sorted({(k[1], v) for k, v in results.failures.items() if k[0] == loadgen})
    lines += [f"  failed on {server}: {reason}" for server, reason in failed[:12]]
    return lines


def cpu_table(results: Results, loadgen: str = "perf_analyzer") -> list[str]:
    """CPU microseconds per request of each server's process, its stubs and the load generator,
    a row per point (the perf_analyzer cells; compare/perf_analyzer.py says how it is read)."""
    servers = _measured_servers(results, loadgen)
    head = f"{'model':13} {'size':>6} {'shm':3} {'conc':>4} {'proto':5} |"
    head += "".join(f" {s + ': srv-us stub-us cli-us':>30} |" for s in servers)
    lines = [f"== CPU per request, {LOADGEN_TITLES[loadgen]}; median of {results.rounds} round(s) ==", head,
             "-" * len(head)]
    for point in results.points(loadgen):
        row = f"{point.model:13} {size_text(point.nbytes):>6} {'yes' if point.shm else '':3} " \
              f"{point.concurrency:>4} {point.protocol:5} |"
        for server in servers:
            sample = results.median(loadgen, server, point)
            row += f" {'-':>30} |" if sample is None else \
                f" {_num(sample.cpu_server_us, 14)} {_num(sample.cpu_children_us, 7)} {_num(sample.cpu_client_us, 6)} |"
        lines.append(row)
    lines.append("srv-us: CPU of the server's own process (pystub's backend, tritonserver); stub-us: of its "
                 "descendants (the stubs); cli-us: of perf_analyzer.")
    return lines


def stream_table(results: Results, loadgen: str = "stream") -> list[str]:
    """The streaming cells: responses/s and CPU per response (server process, stubs), pystub / peer."""
    servers = _measured_servers(results, loadgen)
    peers = [s for s in servers if s != "pystub"]
    head = f"{'proto':5} {'streams':>7} |" + "".join(f" {s + ': resp/s srv-us stub-us cli-us':>36} |" for s in servers)
    head += "".join(f" {'pystub/' + p:>15} |" for p in peers if "pystub" in servers)
    lines = [f"== {LOADGEN_TITLES[loadgen]}; median of {results.rounds} round(s); responses/s and CPU "
             "microseconds per response ==", head, "-" * len(head)]
    for point in results.points(loadgen):
        row = f"{point.protocol:5} {point.concurrency:>7} |"
        medians = {server: results.median(loadgen, server, point) for server in servers}
        for server, sample in medians.items():
            if sample is None:
                row += f" {'failed' if (loadgen, server, point) in results.failures else '-':>36} |"
            else:
                row += f" {_num(sample.throughput, 15)} {_num(sample.cpu_server_us, 6)} " \
                       f"{_num(sample.cpu_children_us, 7)} {_num(sample.cpu_client_us, 6)} |"
        if "pystub" in servers:
            for peer in peers:
                ours, theirs = medians["pystub"], medians[peer]
                ratio = ours.throughput / theirs.throughput if ours and theirs and theirs.throughput else math.nan
                row += f" {_num(ratio, 14)}x |"
        lines.append(row)
    lines.append("srv-us: CPU of the server's own process (pystub's backend, tritonserver); stub-us: of its "
                 "descendants (the stubs); cli-us: of the load generator, which must stay below the servers' sum.")
    failed = sorted({(k[1], v) for k, v in results.failures.items() if k[0] == loadgen})
    return lines + [f"  failed on {server}: {reason}" for server, reason in failed[:12]]
