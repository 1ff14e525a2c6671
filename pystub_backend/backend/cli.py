"""`pystub-backend`: the command line, compatible with `tritonserver`'s (PROTOCOL.md section 17).

Both `--flag=value` and `--flag value` work; an unknown flag is a usage error naming it; GPU-only
flags are accepted and ignored with one log line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass, field

from pystub_backend.backend.log import LogSettings, configure_logging
from pystub_backend.backend.supervision.settings import BackendConfigError, StubSettings, parse_backend_config

__all__ = ["ServerOptions", "parse_args", "main"]

log = logging.getLogger("pystub.cli")

_GPU_ONLY = ("--cuda-memory-pool-byte-size", "--pinned-memory-pool-byte-size",
             "--min-supported-compute-capability", "--allow-gpu-metrics")
_NO_OPS = ("--grpc-infer-allocation-pool-size", "--http-thread-count")
# Flags whose features arrive with later work; they fail clearly instead of being ignored.
_NOT_SUPPORTED_YET: tuple[str, ...] = ()


@dataclass
class ServerOptions:
    repositories: list[str]
    http_address: str = "127.0.0.1"
    http_port: int = 8000
    grpc_address: str = "127.0.0.1"
    grpc_port: int = 8001
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    metrics_interval_ms: int = 2000  # how often the polled gauges (CPU, memory, stub RSS) are sampled
    allow_cpu_metrics: bool = True
    http_max_input_size: int = 64 * 2**20
    exit_on_error: bool = True
    strict_readiness: bool = True
    auto_complete: bool = True
    server_id: str = "pystub"
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    allow_client_shm: bool = False
    backend_directory: str = ""  # Python-based backends: <dir>/<backend>/model.py
    settings: StubSettings = field(default_factory=StubSettings)
    log: LogSettings = field(default_factory=LogSettings)
    ignored: list[str] = field(default_factory=list)
    not_supported: dict[str, str] = field(default_factory=dict)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}'")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got '{text}'")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pystub-backend", allow_abbrev=False,
                                     description="Serve Triton Python-backend models over KServe v2.")
    add = parser.add_argument
    add("--model-repository", "--model-store", dest="repositories", action="append", required=True,
        metavar="DIR", help="model repository (repeatable)")
    add("--id", dest="server_id", default="pystub")
    for name, default in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        add(f"--{name}-port", type=int, default=default)
        add(f"--{name}-address", default="127.0.0.1")
        add(f"--allow-{name}", type=parse_bool, default=True, metavar="BOOL")
    add("--metrics-interval-ms", type=_positive_int, default=2000, metavar="MS",
        help="how often the polled metrics (CPU, memory, stub RSS) are sampled")
    add("--allow-cpu-metrics", type=parse_bool, default=True, metavar="BOOL")
    add("--http-max-input-size", type=int, default=64 * 2**20)
    add("--exit-on-error", type=parse_bool, default=True, metavar="BOOL")
    add("--exit-timeout-secs", type=float, default=30.0)
    add("--strict-readiness", type=parse_bool, default=True, metavar="BOOL")
    add("--strict-model-config", type=parse_bool, default=None, metavar="BOOL")
    add("--disable-auto-complete-config", action="store_true")
    add("--backend-config", action="append", default=[], metavar="python,KEY=VALUE")
    add("--backend-directory", default="", metavar="DIR",
        help="where Python-based backends live: <DIR>/<backend>/model.py")
    add("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    add("--load-model", dest="load_models", action="append", default=[], metavar="NAME",
        help="model to load at start-up in explicit mode (repeatable; '*' loads all)")
    add("--repository-poll-secs", type=_positive_seconds, default=15.0, metavar="N")
    add("--allow-client-shm", type=parse_bool, default=False, metavar="BOOL",
        help="enable the system shared memory extension (default false, as in Triton)")
    add("--log-verbose", type=int, default=0)
    add("--log-info", type=parse_bool, default=True, metavar="BOOL")
    add("--log-warning", type=parse_bool, default=True, metavar="BOOL")
    add("--log-error", type=parse_bool, default=True, metavar="BOOL")
    add("--log-file", default="")
    add("--log-format", choices=("default", "ISO8601"), default="default")
    for flag in _GPU_ONLY + _NO_OPS + _NOT_SUPPORTED_YET:
        add(flag, action="append", default=None, metavar="VALUE")
    return parser


def parse_args(argv: list[str]) -> ServerOptions:
    """Options from the command line. Exits with status 2 and a usage message on bad flags."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        settings = parse_backend_config(args.backend_config, StubSettings(exit_timeout_seconds=args.exit_timeout_secs))
    except BackendConfigError as exc:
        parser.error(str(exc))
    auto_complete = not args.disable_auto_complete_config and args.strict_model_config is not True
    options = ServerOptions(
        repositories=args.repositories, http_address=args.http_address, http_port=args.http_port,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port, metrics_address=args.metrics_address,
        metrics_port=args.metrics_port, allow_http=args.allow_http, allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics, http_max_input_size=args.http_max_input_size,
        exit_on_error=args.exit_on_error, strict_readiness=args.strict_readiness, auto_complete=auto_complete,
        server_id=args.server_id, model_control_mode=args.model_control_mode, load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs, allow_client_shm=args.allow_client_shm, settings=settings,
        log=LogSettings(log_file=args.log_file, log_info=args.log_info, log_warning=args.log_warning,
                        log_error=args.log_error, log_verbose_level=args.log_verbose, log_format=args.log_format))
    options.metrics_interval_ms, options.allow_cpu_metrics = args.metrics_interval_ms, args.allow_cpu_metrics
    options.backend_directory = settings.backend_directory = args.backend_directory  # config-sections hook
    for flag in _GPU_ONLY + _NO_OPS:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            options.ignored.append(flag)
    for flag in _NOT_SUPPORTED_YET:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            options.not_supported[flag] = ",".join(value)
    return options


def main(argv: list[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(options.log)
    for flag in options.ignored:
        log.info("%s is accepted and ignored: it has no effect in pystub (no GPU, or not applicable)", flag)
    if options.load_models and options.model_control_mode != "explicit":
        log.warning("--load-model is ignored: it applies only with --model-control-mode=explicit")
    if options.not_supported:
        flags = ", ".join(options.not_supported)
        log.error("not supported yet: %s", flags)
        print(f"pystub-backend: error: not supported yet: {flags}", file=sys.stderr)
        sys.exit(2)
    from pystub_backend.backend.server import serve  # imported late: keeps `--help` fast

    sys.exit(asyncio.run(serve(options)))
