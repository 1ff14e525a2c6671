"""The `pystub-backend` command line, compatible with `tritonserver`'s (docs/command-line.md).

Every tritonserver 2.51 flag is accepted (the list and what each does here: `flags.FLAGS`); both
`--flag=value` and `--flag value` work. A flag tritonserver does not have is a usage error naming
it (exit status 2). Flags without effect here are logged once at start-up with the reason.
"""

from __future__ import annotations

import argparse

from pystub_backend.backend import flag_values as values
from pystub_backend.backend.completion import SHELLS, PrintCompletion
from pystub_backend.backend.flags import FLAGS, Effect, flag_named
from pystub_backend.backend.log import CLI_LOG_FORMATS, LogSettings
from pystub_backend.backend.options import (
    GRPC_STACKS,
    TOOL_CALL_PARSERS,
    GrpcOptions,
    OpenAIOptions,
    ServerOptions,
    TlsFiles,
)
from pystub_backend.backend.scheduling.rate_limiter import RATE_LIMIT_MODES
from pystub_backend.backend.supervision.settings import BackendConfigError, StubSettings, parse_backend_config
from pystub_backend.backend.telemetry import latency
from pystub_backend.backend.telemetry.tracing.settings import TraceConfig, TraceConfigError, parse_trace_config

__all__ = ["build_parser", "parse_args"]

# Integer gRPC flags and the grpc core channel argument each one sets.
_GRPC_CHANNEL_ARGS = {
    "--grpc-keepalive-time": "grpc.keepalive_time_ms",
    "--grpc-keepalive-timeout": "grpc.keepalive_timeout_ms",
    "--grpc-http2-max-pings-without-data": "grpc.http2.max_pings_without_data",
    "--grpc-http2-min-recv-ping-interval-without-data": "grpc.http2.min_ping_interval_without_data_ms",
    "--grpc-http2-max-ping-strikes": "grpc.http2.max_ping_strikes",
    "--grpc-max-connection-age": "grpc.max_connection_age_ms",
    "--grpc-max-connection-age-grace": "grpc.max_connection_age_grace_ms",
    "--grpc-handshake-timeout": "grpc.server_handshake_timeout_ms",  # pystub's
    "--grpc-max-connection-idle": "grpc.max_connection_idle_ms",  # pystub's
    "--grpc-max-receive-message-length": "grpc.max_receive_message_length",  # pystub's
    "--grpc-max-metadata-size": "grpc.absolute_max_metadata_size",  # pystub's
    "--grpc-request-read-timeout": "pystub.request_read_timeout_ms",  # pystub's, the h2 stack's alone
    "--grpc-max-connection-memory": "pystub.max_connection_memory",  # pystub's, the h2 stack's alone
}


# The deprecated --trace-<name> flags (Triton keeps them; --trace-config overrides them).
_DEPRECATED_TRACE = ("file", "level", "rate", "count", "log-frequency")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _add_server_flags(add: _Adder) -> None:
    add("--model-repository", "--model-store", dest="repositories", action="append", required=True,
        metavar="DIR", help="model repository (repeatable)")
    add("--id", dest="server_id", default="pystub")
    add("--exit-on-error", type=values.parse_bool, default=True, metavar="BOOL")
    add("--exit-timeout-secs", type=float, default=30.0)
    add("--strict-readiness", type=values.parse_bool, default=True, metavar="BOOL")
    add("--strict-model-config", type=values.parse_bool, default=None, metavar="BOOL")
    add("--disable-auto-complete-config", action="store_true")
    add("--backend-config", action="append", default=[], metavar="python,KEY=VALUE")
    add("--backend-directory", default="", metavar="DIR")
    add("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    add("--load-model", dest="load_models", action="append", default=[], metavar="NAME",
        help="model to load at start-up in explicit mode (repeatable; '*' loads all)")
    add("--repository-poll-secs", type=values.positive_seconds, default=15.0, metavar="N")
    add("--model-config-name", default="", metavar="NAME")
    add("--model-load-thread-count", type=values.positive_int, default=4, metavar="N")
    add("--model-load-retry-count", type=values.non_negative_int, default=0, metavar="N")
    add("--allow-client-shm", type=values.parse_bool, default=False, metavar="BOOL",
        help="enable the system shared memory extension (default false)")
    add("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE")
    add("--response-cache-byte-size", type=values.non_negative_int, default=None, metavar="BYTES")
    # rate limiter hook: --rate-limit / --rate-limit-resource (pystub_backend.backend.scheduling.rate_limiter)
    add("--rate-limit", choices=RATE_LIMIT_MODES, default="off",
        help="execution_count: instances run when their rate_limiter resources are free")
    add("--rate-limit-resource", type=values.rate_limit_resource, action="append", default=[],
        metavar="NAME:COUNT[:DEVICE]", help="how many of a rate-limiter resource there are (repeatable)")
    add("--log-verbose", type=int, default=0)
    for level in ("info", "warning", "error"):
        add(f"--log-{level}", type=values.parse_bool, default=True, metavar="BOOL")
    add("--log-file", default="")
    add("--log-format", choices=CLI_LOG_FORMATS, default="default")
    add("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
        help="tracing (repeatable): level=, rate=, count=, mode=triton|opentelemetry, opentelemetry,url=, ...")
    for name in _DEPRECATED_TRACE:
        add(f"--trace-{name}", action="append", default=None, metavar="VALUE",
            help=f"deprecated: --trace-config {name}=VALUE")


def _add_listener_flags(add: _Adder) -> None:
    for name, default in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        add(f"--{name}-port", type=int, default=default)
        add(f"--{name}-address", default="127.0.0.1")
        add(f"--allow-{name}", type=values.parse_bool, default=True, metavar="BOOL")
    add("--metrics-interval-ms", type=values.positive_int, default=2000, metavar="MS",
        help="how often the polled metrics (CPU, memory, stub RSS) are sampled")
    add("--allow-cpu-metrics", type=values.parse_bool, default=True, metavar="BOOL")
    add("--allow-gpu-metrics", type=values.parse_bool, default=True, metavar="BOOL")
    add("--metrics-config", action="append", default=[], metavar="KEY=VALUE")
    add("--http-max-input-size", type=int, default=64 * 2**20)
    add("--http-header-timeout-secs", type=values.non_negative_seconds, default=30.0, metavar="SECONDS")
    add("--http-body-timeout-secs", type=values.non_negative_seconds, default=60.0, metavar="SECONDS")
    add("--frontend-workers", type=values.non_negative_int, default=0, metavar="N",
        help="worker processes serving the HTTP and gRPC ports (0: this process serves them)")
    add("--openai-port", type=values.non_negative_int, default=None, metavar="PORT")
    add("--openai-address", default="127.0.0.1")
    add("--tokenizer", default="", metavar="PATH")
    add("--chat-template", default="", metavar="FILE_OR_TEXT")
    add("--tool-call-parser", choices=TOOL_CALL_PARSERS, default="",
        help="how the OpenAI port reads tool calls in a model's text")
    add("--max-model-len", type=values.positive_int, default=None, metavar="TOKENS")
    add("--openai-cors-origin", action="append", default=[], metavar="ORIGIN[,ORIGIN...]")
    add("--reuse-http-port", type=values.parse_bool, default=False, metavar="BOOL")
    add("--http-restricted-api", action="append", default=[], metavar="API[,API...],KEY=VALUE")
    add("--reuse-grpc-port", type=values.parse_bool, default=False, metavar="BOOL")
    add("--grpc-server", choices=GRPC_STACKS, default=GRPC_STACKS[0],
        help="the gRPC serving stack: h2 (libnghttp2 on the event loop) or aio (grpc.aio)")
    add("--http-header-forward-pattern", type=values.header_pattern, default=None, metavar="RE2")
    add("--grpc-header-forward-pattern", type=values.header_pattern, default=None, metavar="RE2")
    add("--grpc-restricted-protocol", action="append", default=[], metavar="API[,API...],KEY=VALUE")
    add("--allow-remote-control", action="append", default=[], metavar="API[,API...]|all",
        help="state-changing API groups any peer may call (default: loopback peers only)")
    add("--grpc-use-ssl", type=values.parse_bool, default=False, metavar="BOOL")
    add("--grpc-use-ssl-mutual", type=values.parse_bool, default=False, metavar="BOOL")
    for name in ("server-cert", "server-key", "root-cert"):
        add(f"--grpc-{name}", default="", metavar="PEM_FILE")
    add("--grpc-infer-response-compression-level", type=values.compression_level, default=None,
        metavar="none|low|medium|high")
    add("--grpc-keepalive-permit-without-calls", type=values.parse_bool, default=None, metavar="BOOL")
    for flag in _GRPC_CHANNEL_ARGS:
        add(flag, type=values.non_negative_int, default=None, metavar="MS_OR_COUNT")


class _Adder:
    """`parser.add_argument` that records which flags got a typed definition."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self.defined: set[str] = set()

    def __call__(self, *names: str, **kwargs: object) -> None:
        self.parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]
        self.defined.update(names)


def _shown_default(action: argparse.Action) -> str:
    default = action.default
    if action.required:
        return "required"
    if default is None or default == []:
        return "unset"  # the flag's own default applies (Triton's, or grpc's for channel arguments)
    if default == "":
        return "none"
    if isinstance(default, bool):
        return ("on" if default else "off") if action.nargs == 0 else str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


def _document(parser: argparse.ArgumentParser) -> None:
    """Give every flag a line of help (what pystub does with it: the flag table's note, unless the
    definition says more) and its default, so `--help` lists all of them."""
    for action in parser._actions:
        names = [name for name in action.option_strings if name.startswith("--") and name != "--help"]
        if not names or isinstance(action, PrintCompletion):
            continue
        text = action.help or flag_named(names[0]).note
        if action.dest in ("repositories", "load_models") or isinstance(action.default, list):
            text += " (repeatable)" if "repeatable" not in text else ""
        # argparse formats help with %: a literal one must be doubled.
        action.help = f"{text} (default: {_shown_default(action)})".replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    """The parser: typed definitions for the flags with an effect, a generic one for the rest."""
    parser = argparse.ArgumentParser(prog="pystub-backend", allow_abbrev=False,
                                     usage="%(prog)s --model-repository DIR [flags]",
                                     description="Serve Triton Python-backend models over KServe v2. Every "
                                                 "tritonserver 2.51 flag is accepted; those without effect here "
                                                 "say so.")
    parser.add_argument("--print-completion", action=PrintCompletion, choices=SHELLS, metavar="{bash,zsh}",
                        help="print a shell completion script for pystub-backend and exit")
    add = _Adder(parser)
    _add_server_flags(add)
    _add_listener_flags(add)
    for flag in FLAGS:
        if flag.name in add.defined:
            continue
        if flag.effect is not Effect.NO_OP:
            raise AssertionError(f"{flag.name} has an effect but no definition in the parser")
        if flag.takes_value:
            add(flag.name, action="append", default=None, metavar="VALUE", help=f"no effect: {flag.note}")
        else:
            add(flag.name, action="store_true", default=None, help=f"no effect: {flag.note}")
    _document(parser)
    return parser


def _grpc_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> GrpcOptions:
    channel_args = {key: getattr(args, _dest(flag)) for flag, key in _GRPC_CHANNEL_ARGS.items()
                    if getattr(args, _dest(flag)) is not None}
    if args.grpc_keepalive_permit_without_calls is not None:
        channel_args["grpc.keepalive_permit_without_calls"] = int(args.grpc_keepalive_permit_without_calls)
    if args.grpc_infer_response_compression_level is not None:
        channel_args["grpc.default_compression_level"] = args.grpc_infer_response_compression_level
    tls = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if not args.grpc_server_cert or not args.grpc_server_key:
            parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
            parser.error("--grpc-use-ssl-mutual needs --grpc-root-cert")
        tls = TlsFiles(args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert, args.grpc_use_ssl_mutual)
    try:
        restricted = values.restrictions(args.grpc_restricted_protocol, "--grpc-restricted-protocol")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if "openai" in restricted:  # a silent no-op would leave the operator believing the port is protected
        parser.error("--grpc-restricted-protocol: the API group 'openai' has no gRPC methods; restrict the "
                     "--openai-port endpoints with --http-restricted-api openai:<key>=<value>")
    return GrpcOptions(channel_args=channel_args, reuse_port=args.reuse_grpc_port, tls=tls, restrictions=restricted,
                       header_forward_pattern=args.grpc_header_forward_pattern, stack=args.grpc_server)


def _base_options(args: argparse.Namespace, settings: StubSettings) -> ServerOptions:
    auto_complete = not args.disable_auto_complete_config and args.strict_model_config is not True
    return ServerOptions(
        repositories=args.repositories, http_address=args.http_address, http_port=args.http_port,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port, metrics_address=args.metrics_address,
        metrics_port=args.metrics_port, allow_http=args.allow_http, allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics, http_max_input_size=args.http_max_input_size,
        http_header_timeout_secs=args.http_header_timeout_secs, http_body_timeout_secs=args.http_body_timeout_secs,
        exit_on_error=args.exit_on_error, strict_readiness=args.strict_readiness, auto_complete=auto_complete,
        server_id=args.server_id, model_control_mode=args.model_control_mode, load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs, allow_client_shm=args.allow_client_shm, settings=settings,
        log=LogSettings(log_file=args.log_file, log_info=args.log_info, log_warning=args.log_warning,
                        log_error=args.log_error, log_verbose_level=args.log_verbose, log_format=args.log_format),
        metrics_interval_ms=args.metrics_interval_ms, allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        reuse_http_port=args.reuse_http_port, http_header_forward_pattern=args.http_header_forward_pattern,
        model_load_thread_count=args.model_load_thread_count,
        model_load_retry_count=args.model_load_retry_count, model_config_name=args.model_config_name,
        backend_directory=args.backend_directory,
        rate_limit=args.rate_limit, rate_limit_resources=args.rate_limit_resource)  # rate limiter hook


def _composite_options(options: ServerOptions, args: argparse.Namespace) -> None:
    """The key=value flags; raises argparse.ArgumentTypeError on a malformed entry."""
    options.http_restrictions = values.restrictions(args.http_restricted_api, "--http-restricted-api")
    options.remote_control = values.remote_control(args.allow_remote_control)
    options.grpc.remote_control = options.remote_control
    options.metrics_config = values.setting(args.metrics_config, "--metrics-config")
    try:
        latency.parse_config(options.metrics_config)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    options.trace = _trace_config(args)
    options.deprecated = [name for name in _DEPRECATED_TRACE if getattr(args, _dest(f"--trace-{name}"))]
    options.cache_config = values.cache_setting(args.cache_config, "--cache-config")
    if args.cache_config and args.response_cache_byte_size is not None:  # response cache hook: Triton's text
        raise argparse.ArgumentTypeError("Incompatible flags --response-cache-byte-size and --cache-config both "
                                         "provided. Please provide one or the other.")
    if args.response_cache_byte_size is not None:  # deprecated spelling of local,size=N
        options.cache_config.setdefault("local", {}).setdefault("size", str(args.response_cache_byte_size))


def _trace_config(args: argparse.Namespace) -> TraceConfig:
    """--trace-config over the deprecated --trace-* flags (level may repeat; the last of the
    others wins). Raises argparse.ArgumentTypeError."""
    deprecated = [(name, value) for name in _DEPRECATED_TRACE
                  for value in getattr(args, _dest(f"--trace-{name}")) or []]
    try:
        return parse_trace_config(list(args.trace_config), deprecated)
    except TraceConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str]) -> ServerOptions:
    """Options from the command line. Exits with status 2 and a usage message on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = parse_backend_config(args.backend_config, StubSettings(exit_timeout_seconds=args.exit_timeout_secs))
    except BackendConfigError as exc:
        parser.error(str(exc))
    options = _base_options(args, settings)
    options.grpc = _grpc_options(args, parser)
    options.frontend_workers = args.frontend_workers
    origins = tuple(origin.strip() for given in args.openai_cors_origin for origin in given.split(",")
                    if origin.strip())
    options.openai = OpenAIOptions(args.openai_port, args.openai_address, args.tokenizer, args.chat_template,
                                   args.tool_call_parser, args.max_model_len, origins)
    options.argv = list(argv)
    try:
        _composite_options(options, args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    options.ignored = [flag.name for flag in FLAGS
                       if flag.effect is Effect.NO_OP and getattr(args, _dest(flag.name)) is not None]
    return options
