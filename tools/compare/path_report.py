"""The request path's report, in markdown: what a small request costs each server, and the pipelines.

    identity_fp32 tables   one per load generator (wrk/h2load, perf_analyzer): a row per protocol,
                           size, concurrency and server (the floor, Triton, pystub, pystub at
                           another revision): CPU per request of the server's process + its model
                           processes, requests/s, p50, and the ratios ÷ Triton (throughput), CPU ÷
                           Triton, CPU ÷ floor; the load generator's own CPU per request beside them
    pipeline table         the pipeline cells (compare/pipelines.py), Triton against pystub

Every figure is the median of the run's rounds; ratios are of medians of the same run.
"""

from __future__ import annotations

from compare import pipelines
from compare.loadgen import Point, Sample
from compare.report import Results, size_text

LOADGENS = {"wrk-h2load": "wrk (HTTP, 1 thread, C connections) and h2load (gRPC, 1 connection, C streams)",
            "perf_analyzer": "perf_analyzer 2.50 (C++, time windows)"}
ORDER = ("floor", "triton", "pystub", "pystub-base")
_SERVER_LABELS = {"floor": "the floor (tools/floor)", "triton": "Triton 2.51", "pystub": "pystub"}


def labels(baseline: str | None) -> dict[str, str]:
    """Each server's name in the tables; `baseline`: what pystub-base is (a revision, a checkout)."""
    return {**_SERVER_LABELS, "pystub-base": f"pystub {baseline}" if baseline else "pystub-base"}


def _servers(results: Results, loadgen: str) -> list[str]:
    measured = {key[1] for key in [*results.samples, *results.failures] if key[0] == loadgen}
    return [name for name in ORDER if name in measured]


def _cpu(sample: Sample | None) -> float:
    return float("nan") if sample is None else sample.cpu_server_us + sample.cpu_children_us


def _ratio(ours: float, theirs: float) -> str:
    return "–" if not theirs or ours != ours or theirs != theirs else f"{ours / theirs:.2f}"


def _row(point: Point, name: str, title: str, sample: Sample | None, failure: str | None,
         triton: Sample | None, floor: Sample | None) -> str:
    protocol = "HTTP" if point.protocol == "http" else "gRPC"
    head = f"| {protocol} | {size_text(point.nbytes)} | {point.concurrency} | {title}"
    if sample is None:
        return f"{head} | {'failed: ' + failure if failure else '–'} | | | | | | |"
    p50 = "–" if sample.p50_ms != sample.p50_ms else f"{sample.p50_ms:.2f}"
    ratio = _ratio(sample.throughput, triton.throughput if triton else 0.0)
    if name.startswith("pystub") and ratio != "–":
        ratio = f"**{ratio}**"  # the figure the request path's work moves
    return (f"{head} | {_cpu(sample):.0f} ({sample.cpu_server_us:.0f} + {sample.cpu_children_us:.0f}) | "
            f"{sample.throughput:,.0f} | {p50} | {ratio} | "
            f"{_ratio(_cpu(sample), _cpu(triton))} | {_ratio(_cpu(sample), _cpu(floor))} | "
            f"{sample.cpu_client_us:.0f} |")


def identity_tables(results: Results, names: dict[str, str]) -> list[str]:
    """A markdown table per load generator of the identity_fp32 cells (binary tensors, no shm)."""
    lines: list[str] = []
    for loadgen, title in LOADGENS.items():
        points = sorted((p for p in results.points(loadgen)
                         if p.model == "identity_fp32" and not p.shm and p.protocol in ("http", "grpc")),
                        key=lambda p: (p.protocol != "http", p.nbytes, p.concurrency))
        servers = _servers(results, loadgen)
        if not points or not servers:
            continue
        lines += ["", f"identity_fp32 by {title}; median of {results.rounds} round(s). CPU: user + system per "
                      "completed request of the server's process + its model processes (the whole tree, /proc), "
                      "µs; generator µs: the load generator's own.", "",
                  "| proto | size | c | server | CPU µs per request (server + model) | requests/s | p50 ms | "
                  "÷ Triton (throughput) | CPU ÷ Triton | CPU ÷ floor | generator µs |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for point in points:
            triton, floor = results.median(loadgen, "triton", point), results.median(loadgen, "floor", point)
            lines += [_row(point, name, names.get(name, name), results.median(loadgen, name, point),
                           results.failures.get((loadgen, name, point)), triton, floor) for name in servers]
    return lines


def pipeline_table(results: Results, names: dict[str, str]) -> list[str]:
    """The pipeline cells, perf_analyzer over gRPC: inf/s (p50) of each server, pystub ÷ Triton."""
    servers = [name for name in _servers(results, "perf_analyzer") if name != "floor"]
    cells = [point for point in pipelines.CELLS if any(
        (key[0], key[2]) == ("perf_analyzer", point) for key in [*results.samples, *results.failures])]
    if not cells:
        return []
    peers = [name for name in servers if name.startswith("pystub")]
    lines = ["", f"Pipelines (compare/pipelines.py), perf_analyzer over gRPC, 16 B; median of {results.rounds} "
                 "round(s); inf/s (p50 ms), CPU µs per inference (server + model processes).", "",
             "| cell | " + " | ".join(f"{names.get(n, n)} inf/s" for n in servers) + " | "
             + " | ".join(f"{names.get(n, n)} ÷ Triton" for n in peers) + " | "
             + " | ".join(f"CPU {names.get(n, n)}" for n in servers) + " |",
             "|---|" + "---|" * (2 * len(servers) + len(peers))]
    for point in cells:
        medians = {name: results.median("perf_analyzer", name, point) for name in servers}
        figures = [("failed" if ("perf_analyzer", name, point) in results.failures else "–") if sample is None
                   else f"{sample.throughput:,.0f} ({sample.p50_ms:.2f})" for name, sample in medians.items()]
        triton = medians.get("triton")
        ratios = [_ratio(medians[n].throughput if medians[n] else float("nan"), triton.throughput if triton else 0.0)
                  for n in peers]
        cpus = ["–" if s is None else f"{_cpu(s):.0f}" for s in medians.values()]
        lines.append(f"| {pipelines.TITLES[point.model]}, c={point.concurrency} | " + " | ".join(figures) + " | "
                     + " | ".join(r if r == "–" else f"**{r}**" for r in ratios) + " | " + " | ".join(cpus) + " |")
    failed = sorted({(k[1], k[2].model, v) for k, v in results.failures.items()
                     if k[0] == "perf_analyzer" and k[2].model in pipelines.MODELS})
    return lines + [f"  failed on {server} ({model}): {reason}" for server, model, reason in failed]
