"""The issue's targets, judged on the medians of this run (ratios within the same run only)."""

from __future__ import annotations

import statistics

from compare import pipelines
from compare.loadgen import Point, Sample
from compare.report import Results, size_text

MIB = 1 << 20


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def _pick(results: Results, server: str, point: Point, prefer: tuple[str, ...]) -> tuple[Sample | None, str]:
    """The median from the first load generator in `prefer` that measured this point on this server."""
    for loadgen in prefer:
        sample = results.median(loadgen, server, point)
        if sample is not None:
            return sample, loadgen
    return None, ""


def _throughput_16b(results: Results) -> list[str]:
    point = Point("identity_fp32", 16, 8, "grpc")
    lines = []
    for peer, factor, prefer in (("mlserver", 5.0, ("asyncio",)), ("triton", 1.0, ("perf_analyzer", "asyncio"))):
        ours, loadgen = _pick(results, "pystub", point, prefer)
        theirs = results.median(loadgen, peer, point) if loadgen else None
        if ours is None or theirs is None:
            lines.append(f"  16 B c=8 gRPC throughput >= {factor:g}x {peer}: n/a (not measured)")
            continue
        ratio = ours.throughput / theirs.throughput
        lines.append(f"  16 B c=8 gRPC throughput >= {factor:g}x {peer} ({loadgen}): pystub {ours.throughput:.0f}, "
                     f"{peer} {theirs.throughput:.0f} infer/s = {ratio:.2f}x: {_verdict(ratio >= factor)}")
    return lines


def _p50_large(results: Results) -> list[str]:
    lines = []
    for nbytes in (MIB, 16 * MIB):
        point = Point("identity_fp32", nbytes, 1, "grpc")
        for peer, prefer in (("triton", ("perf_analyzer", "asyncio")), ("mlserver", ("asyncio",))):
            ours, loadgen = _pick(results, "pystub", point, prefer)
            theirs = results.median(loadgen, peer, point) if loadgen else None
            if ours is None or theirs is None:
                lines.append(f"  {size_text(nbytes)} c=1 gRPC p50 <= 1/2 {peer}: n/a (not measured)")
                continue
            ratio = ours.p50_ms / theirs.p50_ms
            lines.append(f"  {size_text(nbytes)} c=1 gRPC p50 <= 1/2 {peer} ({loadgen}): pystub {ours.p50_ms:.2f} ms, "
                         f"{peer} {theirs.p50_ms:.2f} ms = {ratio:.2f}x: {_verdict(ratio <= 0.5)}")
    return lines


def _shm(results: Results) -> list[str]:
    point = Point("identity_fp32", 16 * MIB, 1, "grpc", shm=True)
    ours, loadgen = _pick(results, "pystub", point, ("perf_analyzer", "asyncio"))
    if ours is None:
        return ["  16 MiB c=1 with client system shared memory p50 <= 3 ms: n/a (not measured; see notes)"]
    return [f"  16 MiB c=1 with client system shared memory p50 <= 3 ms ({loadgen}): pystub {ours.p50_ms:.2f} ms: "
            f"{_verdict(ours.p50_ms <= 3.0)}"]


def _p99_c32(results: Results) -> list[str]:
    lines = []
    for loadgen in ("asyncio", "perf_analyzer"):
        met, missed = 0, []
        for point in results.points(loadgen):
            if point.concurrency != 32:
                continue
            ours = results.median(loadgen, "pystub", point)
            for peer in results.servers:
                peer_point = point
                if peer == "mlserver" and point.protocol == "http":
                    peer_point = Point(point.model, point.nbytes, point.concurrency, "http-json", point.shm)
                theirs = results.median(loadgen, peer, peer_point) if peer != "pystub" else None
                if ours is None or theirs is None:
                    continue
                if ours.p99_ms <= theirs.p99_ms:
                    met += 1
                else:
                    what = "add_sub" if point.model == "add_sub" else size_text(point.nbytes)
                    missed.append(f"{what}{' shm' if point.shm else ''} {point.protocol} vs {peer}"
                                  f" ({ours.p99_ms:.1f} > {theirs.p99_ms:.1f} ms)")
        if met or missed:
            lines.append(f"  p99 at c=32 <= each peer's ({loadgen}): {met}/{met + len(missed)} comparisons: "
                         f"{_verdict(not missed)}" + (f"; over: {'; '.join(missed)}" if missed else ""))
    return lines or ["  p99 at c=32 <= each peer's: n/a (not measured)"]


def _probes(results: Results) -> list[str]:
    lines = []
    for server, runs in results.probes.items():
        if not runs:
            continue
        health = statistics.median(r["health_p99_ms"] for r in runs)
        metadata = statistics.median(r["metadata_p99_ms"] for r in runs)
        line = (f"health p99 {health:.1f} ms, metadata p99 {metadata:.1f} ms while 32 gRPC identity requests are "
                f"in flight")
        if server == "pystub":
            lines.insert(0, f"  health/metadata p99 < 20 ms under saturation: pystub {line}: "
                            f"{_verdict(max(health, metadata) < 20)}")
        else:
            lines.append(f"    ({server}: {line})")
    return lines or ["  health/metadata p99 < 20 ms under saturation: n/a (not measured)"]


_PREFER = ("perf_analyzer", "asyncio")


def _against(results: Results, point: Point, peer: str, what: str, goal: float,
             prefer: tuple[str, ...] = _PREFER) -> str:
    """One 'pystub vs peer' target: throughput >= goal x peer's, or p50 <= goal x peer's."""
    label = f"{size_text(point.nbytes) if point.model == 'identity_fp32' else point.model} c={point.concurrency} " \
            f"{point.protocol} {what} {'>=' if what == 'throughput' else '<='} {goal:g}x {peer}"
    ours, loadgen = _pick(results, "pystub", point, prefer)
    theirs = results.median(loadgen, peer, point) if loadgen else None
    if ours is None or theirs is None:
        return f"  {label}: n/a (not measured)"
    if what == "throughput":
        ratio, text = ours.throughput / theirs.throughput, f"{ours.throughput:.0f} vs {theirs.throughput:.0f} infer/s"
        return f"  {label} ({loadgen}): {text} = {ratio:.2f}x: {_verdict(ratio >= goal)}"
    ratio, text = ours.p50_ms / theirs.p50_ms, f"{ours.p50_ms:.2f} vs {theirs.p50_ms:.2f} ms"
    return f"  {label} ({loadgen}): {text} = {ratio:.2f}x: {_verdict(ratio <= goal)}"


def _ceilings(results: Results) -> list[str]:
    """How far pystub gets of what each bare frontend serves (16 B, c=8)."""
    lines = []
    for protocol in ("grpc", "http", "json"):
        point = Point("identity_fp32", 16, 8, protocol)
        ours, loadgen = _pick(results, "pystub", point, ("prebuilt", *_PREFER) if protocol == "json" else _PREFER)
        bare = [(name, results.median(loadgen, name, point)) for name in results.servers
                if name.startswith("bare-") and loadgen]
        cells = [f"{name} {sample.throughput:.0f}/s (pystub {ours.throughput / sample.throughput:.2f}x)"
                 for name, sample in bare if sample is not None and ours is not None]
        if cells:
            head = f"  ceilings 16 B c=8 {protocol} ({loadgen}): pystub {ours.throughput:.0f}/s; "
            lines.append(head + "; ".join(cells))
    return lines


def _issue_20(results: Results) -> list[str]:
    """Performance II: the per-request cost."""
    lines = ["Targets (per-request cost):"]
    for protocol in ("http", "grpc"):
        lines.append(_against(results, Point("identity_fp32", 16, 8, protocol), "triton", "throughput", 1.0))
    json_mib = Point("identity_fp32", MIB, 1, "json")
    json_prefer = ("prebuilt", "asyncio")
    lines.append(_against(results, json_mib, "triton", "p50", 1.0, json_prefer))
    lines.append(_against(results, json_mib, "mlserver", "p50", 0.5, json_prefer))
    lines.append(_against(results, Point("identity_fp32", 16, 8, "json"), "triton", "throughput", 1.0, json_prefer))
    for protocol in ("grpc", "http"):
        lines.append(_against(results, Point("identity_fp32", MIB, 1, protocol), "triton", "p50", 1.0))
    return lines + _ceilings(results)


def _streaming(results: Results) -> list[str]:
    """Performance III: streamed responses at least as fast as Triton's."""
    lines = []
    for point in results.points("stream"):
        ours, theirs = results.median("stream", "pystub", point), results.median("stream", "triton", point)
        label = f"  streamed 16 B responses, {point.concurrency} stream(s), {point.protocol}: responses/s >= 1x triton"
        if ours is None or theirs is None:
            lines.append(f"{label}: n/a (not measured)")
            continue
        ratio = ours.throughput / theirs.throughput
        lines.append(f"{label}: {ours.throughput:.0f} vs {theirs.throughput:.0f} = {ratio:.2f}x: "
                     f"{_verdict(ratio >= 1.0)}; CPU per response server + stubs {ours.cpu_server_us:.0f} + "
                     f"{ours.cpu_children_us:.0f} us vs {theirs.cpu_server_us:.0f} + {theirs.cpu_children_us:.0f} us")
    return ["Targets (streaming):", *lines] if lines else []


def request_path(results: Results) -> list[str]:
    """The lean request path: a small request's CPU (server + model processes) at most 0.8x
    Triton's and 3x the floor's, per load generator, protocol and concurrency; the pipeline cells
    at least Triton's throughput, and step at c=1 at most Triton's p50."""
    lines = []
    for loadgen in ("wrk-h2load", "perf_analyzer"):
        for point in results.points(loadgen):
            if point.model != "identity_fp32" or point.shm or point.nbytes != 16 or point.protocol == "json":
                continue
            ours = results.median(loadgen, "pystub", point)
            for peer, goal in (("triton", 0.8), ("floor", 3.0)):
                theirs = results.median(loadgen, peer, point)
                label = f"  16 B c={point.concurrency} {point.protocol} CPU per request <= {goal:g}x {peer} ({loadgen})"
                if ours is None or theirs is None:
                    lines.append(f"{label}: n/a (not measured)")
                    continue
                mine = ours.cpu_server_us + ours.cpu_children_us
                other = theirs.cpu_server_us + theirs.cpu_children_us
                lines.append(f"{label}: {mine:.0f} vs {other:.0f} us = {mine / other:.2f}x: "
                             f"{_verdict(mine <= goal * other)}")
    for point in pipelines.CELLS:
        if point.model == "step" and point.concurrency == 1:
            lines.append(_against(results, point, "triton", "p50", 1.0, ("perf_analyzer",)))
        elif point.model != "step":
            lines.append(_against(results, point, "triton", "throughput", 1.0, ("perf_analyzer",)))
    measured = [line for line in lines if "n/a" not in line]
    return ["Targets (the request path):", *lines] if measured else []


def summary(results: Results) -> list[str]:
    """The targets of the issues, each with its measurement and verdict."""
    lines = ["Targets (medians of this run):"]
    for part in (_throughput_16b, _p50_large, _shm, _p99_c32, _probes, _issue_20, _streaming, request_path):
        lines += part(results)
    return lines
