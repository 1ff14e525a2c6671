"""Command line of tools/bench_compare.py: options, server start-up, the run, the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from compare import environment, report, servers, stopping, streaming, targets
from compare.runner import Plan, run_rounds

SERVERS = ("pystub", "triton", "mlserver")
CEILINGS = ("bare-http", "bare-grpc-aio", "bare-grpc-sync", "bare-grpc-sync-hop", "bare-grpc-reuse4")
# gRPC on HTTP/2 servers other than grpcio's (docs/grpc-candidates.md), under their own venv
# (environment.ensure_candidates); the two that went furthest are measured by default, the rest
# with `--ceilings all` or by name
PYPI_CEILINGS = ("bare-grpc-native-aio", "bare-grpc-ngh2-asyncio", "bare-grpc-native-sync", "bare-grpc-native-front",
                 "bare-grpclib", "bare-grpc-hypercorn", "bare-grpc-h2corn", "bare-grpc-ngh2")
DEFAULT_CEILINGS = (*CEILINGS, *PYPI_CEILINGS[:2])
LOADGENS = ("asyncio", "perf_analyzer", "prebuilt", "stream")
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
    parser.add_argument("--servers", type=_list(SERVERS), default=list(SERVERS), help="default: all three")
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
    parser.add_argument("--loadgen", type=_list(LOADGENS), default=list(LOADGENS),
                        help="asyncio (all servers), perf_analyzer (pystub, triton; binary tensors), prebuilt (JSON "
                             "tensors, the body serialised once: compare/prebuilt.py), stream (a decoupled model's "
                             "responses over gRPC streams and SSE: compare/streaming.py); default all four")
    parser.add_argument("--streams", type=_list(convert=int), default=[1, 8],
                        help="concurrent streams of the stream cells (default 1,8)")
    parser.add_argument("--stream-protocols", type=_list(streaming.PROTOCOLS), default=list(streaming.PROTOCOLS),
                        help="grpc (ModelStreamInfer), sse (generate_stream); default both")
    parser.add_argument("--stream-responses", type=int, default=500,
                        help="16 B responses per streamed request (default 500)")
    parser.add_argument("--models", type=_list(servers.MODELS), default=list(servers.MODELS),
                        help="identity_fp32 at every size; add_sub (fixed 4 x FP32) at 16 B only")
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
    needs_env = any(s != "pystub" for s in args.servers) or "perf_analyzer" in args.loadgen
    if not needs_env:
        return None
    env = environment.ensure(install=not args.no_install)
    if "perf_analyzer" in args.loadgen:
        problem = environment.perf_analyzer_works(env)
        if problem:
            results.notes.append(f"perf_analyzer does not run here ({problem}): asyncio load generator only")
            args.loadgen = [g for g in args.loadgen if g != "perf_analyzer"]
    return env


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    stopping.install()
    base = ["pystub-base"] if args.baseline else []
    notes: list[str] = []
    candidates = _candidates_python(args, notes)
    results = report.Results(servers=[*args.servers, *base, *args.ceilings])
    results.notes.extend(notes)
    env = _environment(args, results)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="pystub-bench-compare-")) if args.keep else \
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pystub-bench-compare-")))
        repositories = servers.write_repositories(workdir)
        streaming.write_model(repositories["models"])
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
    _print(results, args, time.monotonic() - began)
    if args.json:
        args.json.write_text(json.dumps(results.as_json(), indent=1))
    return 128 + signal_number if (signal_number := stopping.signal_number()) else 0


def _print(results: report.Results, args: argparse.Namespace, elapsed: float) -> None:
    print(f"pystub vs {', '.join(s for s in args.servers if s != 'pystub') or 'nobody'}: identity_fp32 "
          f"(FP32 [1, n]), add_sub and {streaming.MODEL} ({args.stream_responses} x 16 B responses per request), "
          f"one instance / worker each, loopback, {args.warmup:g} s warm-up + "
          f"{args.seconds:g} s window per point, {results.rounds} round(s), {elapsed / 60:.1f} min")
    for loadgen in args.loadgen:
        if any(key[0] == loadgen for key in results.samples):
            print()
            table = report.stream_table if loadgen == "stream" else report.table
            print("\n".join(table(results, loadgen)))
            if loadgen == "perf_analyzer":
                print("\n".join(["", *report.cpu_table(results, loadgen)]))
    print()
    for note in results.notes:
        print(f"note: {note}")
    print("\n".join(targets.summary(results)))
