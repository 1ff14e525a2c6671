"""Command line of tools/bench_compare.py: options, server start-up, the run, the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from compare import environment, path_report, pipelines, report, revision, servers, stopping, streaming, targets
from compare.runner import Plan, run_rounds

SERVERS = ("pystub", "triton", "mlserver", "floor")
DEFAULT_SERVERS = ("pystub", "triton", "mlserver")
CEILINGS = ("bare-http", "bare-grpc-aio", "bare-grpc-sync", "bare-grpc-sync-hop", "bare-grpc-reuse4")
# gRPC on HTTP/2 servers other than grpcio's (docs/grpc-candidates.md), under their own venv
# (environment.ensure_candidates); the two that went furthest are measured by default, the rest
# with `--ceilings all` or by name
PYPI_CEILINGS = ("bare-grpc-native-aio", "bare-grpc-ngh2-asyncio", "bare-grpc-native-sync", "bare-grpc-native-front",
                 "bare-grpclib", "bare-grpc-hypercorn", "bare-grpc-h2corn", "bare-grpc-ngh2")
DEFAULT_CEILINGS = (*CEILINGS, *PYPI_CEILINGS[:2])
LOADGENS = ("asyncio", "perf_analyzer", "prebuilt", "stream", "wrk-h2load")
DEFAULT_LOADGENS = ("asyncio", "perf_analyzer", "prebuilt", "stream")
MODELS = (*servers.MODELS, "pipelines")
# --request-path: the cells of the lean request path (flags given beside it still win)
REQUEST_PATH = {"servers": ["floor", "triton", "pystub"], "sizes": [16], "concurrency": [1, 8],
                "protocols": ["http", "grpc"], "models": ["identity_fp32", "pipelines"],
                "loadgen": ["wrk-h2load", "perf_analyzer"], "ceilings": ["none"], "no_shm": True, "no_probe": True}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20}


def parse_size(text: str) -> int:
    """'16', '1M', '16MiB' -> bytes; raises argparse.ArgumentTypeError."""
    text = text.strip().upper()
    digits = text.rstrip("KMIB")
    try:
        return int(digits) * _UNITS[text[len(digits):]]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 16, 64K, 1M") from None


def _list(choices: tuple[str, ...] | None = None, convert=str):  # noqa: ANN001, ANN202 - argparse type factory
    def parse(text: str) -> list:
        values = [convert(v) for v in text.split(",") if v.strip()]
        bad = [v for v in values if choices and v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices or ())}: got {text!r}")
        return values
    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None) or __doc__

    parser = argparse.ArgumentParser(prog="bench_compare.py", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--request-path", action="store_true",
                        help="the request path's cells: the floor (tools/floor), Triton and pystub, identity_fp32 "
                             "16 B over HTTP and gRPC at c=1,8 with wrk/h2load and perf_analyzer, and the pipeline "
                             "cells; prints their markdown tables (other flags given with it still apply)")
    parser.add_argument("--servers", type=_list(SERVERS), default=list(DEFAULT_SERVERS),
                        help=f"from {', '.join(SERVERS)} (floor: the request path's pure-Python floor, "
                             "tools/floor); default pystub,triton,mlserver")
    parser.add_argument("--sizes", type=_list(convert=parse_size), default=[16, 1 << 20, 16 << 20],
                        help="bytes per input tensor (default 16,1M,16M)")
    parser.add_argument("--concurrency", type=_list(convert=int), default=[1, 8, 32], help="default 1,8,32")
    parser.add_argument("--protocols", type=_list(("grpc", "http", "json")), default=["grpc", "http", "json"],
                        help="http: binary tensors; json: JSON tensors (asyncio only); default all three")
    parser.add_argument("--ceilings", type=_list(("none", "all", *CEILINGS, *PYPI_CEILINGS)),
                        default=list(DEFAULT_CEILINGS),
                        help="bare-frontend ceilings measured beside the servers (compare/bare.py); 'none' for "
                             f"none, 'all' adds the gRPC candidates from PyPI ({', '.join(PYPI_CEILINGS)}); "
                             f"default {', '.join(DEFAULT_CEILINGS)}")
    parser.add_argument("--loadgen", type=_list(LOADGENS), default=list(DEFAULT_LOADGENS),
                        help="asyncio (all servers), perf_analyzer (pystub, triton, floor; binary tensors), prebuilt "
                             "(JSON tensors, the body serialised once: compare/prebuilt.py), stream (a decoupled "
                             "model's responses over gRPC streams and SSE: compare/streaming.py), wrk-h2load (wrk "
                             "for HTTP, h2load for gRPC, installed with apt-get when missing: compare/wrk_h2load.py); "
                             "default all but wrk-h2load")
    parser.add_argument("--streams", type=_list(convert=int), default=[1, 8],
                        help="concurrent streams of the stream cells (default 1,8)")
    parser.add_argument("--stream-protocols", type=_list(streaming.PROTOCOLS), default=list(streaming.PROTOCOLS),
                        help="grpc (ModelStreamInfer), sse (generate_stream); default both")
    parser.add_argument("--stream-responses", type=int, default=500,
                        help="16 B responses per streamed request (default 500)")
    parser.add_argument("--models", type=_list(MODELS), default=list(MODELS),
                        help="identity_fp32 at every size; add_sub (fixed 4 x FP32) at 16 B only; pipelines: the "
                             "BLS, ensemble and dynamic-batching cells (compare/pipelines.py, perf_analyzer only)")
    parser.add_argument("--rounds", type=int, help="rounds; medians are reported (default 3, --quick 1)")
    parser.add_argument("--seconds", type=float, help="measurement window per point (default 3 s, --quick 1 s)")
    parser.add_argument("--warmup", type=float, help="warm-up per point before the window (default 1 s, --quick 0.3 s)")
    parser.add_argument("--quick", action="store_true", help="one round of 1 s windows: a smoke run")
    parser.add_argument("--no-shm", action="store_true", help="skip the client shared-memory rows")
    parser.add_argument("--no-probe", action="store_true", help="skip health/metadata under saturation")
    parser.add_argument("--no-install", action="store_true", help="fail instead of installing the peers")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also run pystub from this checkout (e.g. a `git worktree` of the commit before a change)"
                             " as server 'pystub-base', measured in the same rounds")
    parser.add_argument("--pystub-rev", metavar="REV",
                        help="also run pystub at this git revision (exported with `git archive` into a temporary "
                             "folder under /tmp) as server 'pystub-base', measured in the same rounds")
    parser.add_argument("--pystub-cpus", metavar="LIST", help="pin pystub (and pystub-base) to these CPUs "
                        "(taskset -c LIST, e.g. 0 or 0,1); the peers and the client are not pinned")
    parser.add_argument("--baseline-cpus", metavar="LIST", help="pin pystub-base to these CPUs instead "
                        "(with --baseline set to this checkout: one core against two in the same run)")
    parser.add_argument("--pystub-args", type=shlex.split, default=[], metavar="FLAGS",
                        help="extra pystub flags for server 'pystub' only, e.g. \"--frontend-workers 2\"")
    parser.add_argument("--baseline-args", type=shlex.split, default=[], metavar="FLAGS",
                        help="extra pystub flags for server 'pystub-base'")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server logs)")
    args = parser.parse_args(argv)
    if args.request_path:  # the preset becomes the defaults; flags given beside it still win
        parser.set_defaults(**REQUEST_PATH)
        args = parser.parse_args(argv)
    if args.pystub_rev and args.baseline:
        parser.error("--pystub-rev and --baseline both name pystub-base: give one")
    rounds, seconds, warmup = (1, 1.0, 0.3) if args.quick else (3, 3.0, 1.0)
    args.rounds = rounds if args.rounds is None else max(1, args.rounds)
    args.seconds = seconds if args.seconds is None else args.seconds
    args.warmup = warmup if args.warmup is None else args.warmup
    if "all" in args.ceilings:
        args.ceilings = [*CEILINGS, *PYPI_CEILINGS]
    args.ceilings = [c for c in args.ceilings if c != "none"]
    return args


def _candidates_python(args: argparse.Namespace, notes: list[str]) -> Path | None:
    """The candidates' venv python when a PyPI ceiling is asked for; without it (not installed and
    --no-install, or the install failed) those ceilings are dropped from `args` with a note."""
    wanted = [name for name in args.ceilings if name in PYPI_CEILINGS]
    if not wanted:
        return None
    try:
        return environment.ensure_candidates(install=not args.no_install)
    except SystemExit as error:
        notes.append(f"ceilings {', '.join(wanted)} skipped: {error}")
        args.ceilings = [name for name in args.ceilings if name not in wanted]
        return None


def _start(args: argparse.Namespace, env: environment.BenchEnv | None, repositories: dict[str, Path],
           workdir: Path, started: list[servers.Server], candidates: Path | None) -> None:
    """Start every requested server into `started` (so a failure still stops the others)."""
    for name in args.servers:
        if name == "pystub":
            started.append(servers.start_pystub(repositories, workdir, client_shm=True, cpus=args.pystub_cpus,
                                                extra=args.pystub_args))
        elif name == "triton":
            started.append(servers.start_triton(env, repositories, workdir))
        elif name == "floor":
            started.append(servers.start_floor(workdir))
        else:
            started.append(servers.start_mlserver(env, repositories, workdir))
    if args.baseline:
        started.append(servers.start_pystub(repositories, workdir, client_shm=True, name="pystub-base",
                                            root=args.baseline.resolve(),
                                            cpus=args.baseline_cpus or args.pystub_cpus, extra=args.baseline_args))
    for name in args.ceilings:
        started.append(servers.start_bare(name, workdir, candidates if name in PYPI_CEILINGS else None))
    try:
        servers.wait_ready(started)
    except RuntimeError as error:
        pystub = next((s for s in started if s.name == "pystub"), None)
        if pystub is None or "allow-client-shm" not in str(error):
            raise
        # a pystub without the client-shm extension refuses the flag: run it without
        servers.stop(pystub)
        started[started.index(pystub)] = servers.start_pystub(repositories, workdir, client_shm=False)
        servers.wait_ready(started)


def _environment(args: argparse.Namespace, results: report.Results) -> environment.BenchEnv | None:
    if "wrk-h2load" in args.loadgen:
        problem = environment.ensure_load_tools(install=not args.no_install)
        if problem:
            results.notes.append(f"the wrk-h2load cells are skipped: {problem}")
            args.loadgen = [g for g in args.loadgen if g != "wrk-h2load"]
    needs_env = any(s not in ("pystub", "floor") for s in args.servers) or "perf_analyzer" in args.loadgen
    if not needs_env:
        return None
    env = environment.ensure(install=not args.no_install)
    if "perf_analyzer" in args.loadgen:
        problem = environment.perf_analyzer_works(env)
        if problem:
            results.notes.append(f"perf_analyzer does not run here ({problem}): asyncio load generator only")
            args.loadgen = [g for g in args.loadgen if g != "perf_analyzer"]
    return env


def _baseline(args: argparse.Namespace, stack: contextlib.ExitStack) -> str | None:
    """What pystub-base is, in words; with --pystub-rev, its tree exported (removed at the end)."""
    if args.pystub_rev:
        args.baseline, commit = revision.export(environment.ROOT, args.pystub_rev)
        stack.callback(shutil.rmtree, args.baseline, ignore_errors=True)
        print(f"pystub-base: {args.pystub_rev} = {commit[:10]}, exported to {args.baseline}", file=sys.stderr)
        return args.pystub_rev if args.pystub_rev.startswith(commit[:7]) else f"{args.pystub_rev} ({commit[:10]})"
    return str(args.baseline) if args.baseline else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    stopping.install()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        baseline = _baseline(args, stack)
        results = _run(args)
    load_after = os.getloadavg()
    _print(results, args, baseline, (load_before, load_after))
    if args.json:
        args.json.write_text(json.dumps(results.as_json(), indent=1))
    return 128 + signal_number if (signal_number := stopping.signal_number()) else 0


def _run(args: argparse.Namespace) -> report.Results:
    """Start the servers, measure every round, stop them; the results, partial after a signal."""
    base = ["pystub-base"] if args.baseline else []
    notes: list[str] = []
    candidates = _candidates_python(args, notes)
    results = report.Results(servers=[*args.servers, *base, *args.ceilings])
    results.notes.extend(notes)
    env = _environment(args, results)
    began = time.monotonic()
    with contextlib.ExitStack() as inner:
        workdir = Path(tempfile.mkdtemp(prefix="pystub-bench-compare-")) if args.keep else \
            Path(inner.enter_context(tempfile.TemporaryDirectory(prefix="pystub-bench-compare-")))
        repositories = servers.write_repositories(workdir)
        streaming.write_model(repositories["models"])
        if "pipelines" in args.models:
            pipelines.write_models(repositories["models"])
        started: list[servers.Server] = []
        try:
            _start(args, env, repositories, workdir, started, candidates)
            for server in started:
                print(f"started {server.name} pid {server.process.pid} (http {server.http_port}, grpc "
                      f"{server.grpc_port}; {', '.join(server.extensions)})", file=sys.stderr, flush=True)
            plan = Plan.from_args(args, {s.name: s for s in started}, env, results)
            run_rounds(plan)
        except stopping.StopRequested as stop:
            results.notes.append(f"{stop}: the results below are partial")
        finally:
            for server in reversed(started):
                servers.stop(server)
            servers.sweep_shm(started)  # again: a stub may have been mid-create when its group was killed
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
    results.minutes = (time.monotonic() - began) / 60
    return results


def _print(results: report.Results, args: argparse.Namespace, baseline: str | None,
           load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    averages = "; ".join(f"{when} {' '.join(f'{v:.2f}' for v in values)}"
                         for when, values in zip(("before", "after"), load, strict=True))
    print(f"pystub vs {', '.join(s for s in args.servers if s != 'pystub') or 'nobody'}"
          f"{f' and pystub-base = {baseline}' if baseline else ''}: one instance / worker each, loopback, "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s window per point, {results.rounds} round(s), "
          f"{results.minutes:.1f} min; load average (1, 5, 15 min) {averages}")
    for loadgen in [] if args.request_path else args.loadgen:
        if any(key[0] == loadgen for key in results.samples):
            print()
            table = report.stream_table if loadgen == "stream" else report.table
            print("\n".join(table(results, loadgen)))
            if loadgen in ("perf_analyzer", "wrk-h2load"):
                print("\n".join(["", *report.cpu_table(results, loadgen)]))
    names = path_report.labels(baseline)
    if args.request_path or "floor" in args.servers or "wrk-h2load" in args.loadgen:
        print("\n".join(path_report.identity_tables(results, names)))
    print("\n".join(path_report.pipeline_table(results, names)))
    print()
    for note in results.notes:
        print(f"note: {note}")
    print("\n".join(targets.request_path(results) if args.request_path else targets.summary(results)))
