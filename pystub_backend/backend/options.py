"""`ServerOptions`: what the command line decided, handed from `cli` to `server`.

Its own module so that `cli` (parsing) and `server` (running) both depend on it and not on each
other. The gRPC listener's settings and the restricted API groups have their own records because
the frontends receive them without the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.log import LogSettings
from pystub_backend.backend.scheduling.rate_limiter import ResourceLimit
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.telemetry.tracing.settings import TraceConfig

__all__ = ["ServerOptions", "GrpcOptions", "GRPC_STACKS", "OpenAIOptions", "TOOL_CALL_PARSERS", "TlsFiles",
           "Restriction", "Restrictions", "API_GROUPS", "STATE_GROUPS", "OPEN_FLAG"]

# Triton's API groups of --http-restricted-api / --grpc-restricted-protocol. pystub's admin
# endpoint (/v2/pystub/stubs) belongs to "model-repository": it restarts models; "openai" (pystub's)
# holds the OpenAI-compatible endpoints of --openai-port.
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging", "openai")

# The groups holding state-changing calls (frontends/access.py), which --allow-remote-control opens.
STATE_GROUPS = ("model-repository", "shared-memory", "logging", "trace")
OPEN_FLAG = "--allow-remote-control"


@dataclass(frozen=True)
class Restriction:
    """A request of the group must carry the header (metadata) `key` with exactly `value`."""

    key: str
    value: str


# API group -> its restriction; groups not listed are open.
Restrictions = dict[str, Restriction]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of --grpc-use-ssl; `root_cert` is required and checked when `mutual`."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


# --grpc-server's choices, the default first.
GRPC_STACKS = ("h2", "aio")


@dataclass
class GrpcOptions:
    """The gRPC listener: channel arguments (grpc core names), TLS, restrictions."""

    channel_args: dict[str, int] = field(default_factory=dict)
    reuse_port: bool = False
    tls: TlsFiles | None = None
    restrictions: Restrictions = field(default_factory=dict)
    header_forward_pattern: HeaderPattern | None = None  # metadata forwarded as request parameters
    remote_control: frozenset[str] = frozenset()  # --allow-remote-control: groups any peer may change
    trust_internal_peer: bool = False  # the core's private socket behind frontend workers (access.INTERNAL_PEER)
    stack: str = GRPC_STACKS[0]  # --grpc-server: "h2" (libnghttp2 on the event loop) or "aio" (grpc.aio)


# --tool-call-parser's names (frontends/openai/tool_calls has the parser of each)
TOOL_CALL_PARSERS = ("hermes", "qwen", "llama3", "llama3_json", "mistral")


@dataclass(frozen=True)
class OpenAIOptions:
    """The OpenAI-compatible listener (--openai-port; None there: off) and its chat template."""

    port: int | None = None
    address: str = "127.0.0.1"
    tokenizer: str = ""  # --tokenizer: a local tokenizer directory or tokenizer_config.json
    chat_template: str = ""  # --chat-template: a template file, or the template's text
    tool_call_parser: str = ""  # --tool-call-parser: one of TOOL_CALL_PARSERS; "" parses no tool calls
    max_model_len: int | None = None  # --max-model-len: the context length of models that declare none
    cors_origins: tuple[str, ...] = ()  # --openai-cors-origin: origins browsers may call from ("*": any)


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
    allow_gpu_metrics: bool = True  # nv_gpu_* of the visible GPUs (none: nothing)
    http_max_input_size: int = 64 * 2**20
    http_header_timeout_secs: float = 30.0  # the request head must arrive within (0: no limit)
    http_body_timeout_secs: float = 60.0  # the body, extended 1 s per 64 KiB received (0: no limit)
    exit_on_error: bool = True
    strict_readiness: bool = True
    auto_complete: bool = True
    server_id: str = "pystub"
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    allow_client_shm: bool = False
    settings: StubSettings = field(default_factory=StubSettings)
    log: LogSettings = field(default_factory=LogSettings)
    reuse_http_port: bool = False
    http_header_forward_pattern: HeaderPattern | None = None  # headers forwarded as request parameters
    http_restrictions: Restrictions = field(default_factory=dict)
    remote_control: frozenset[str] = frozenset()  # --allow-remote-control (frontends/access.py)
    grpc: GrpcOptions = field(default_factory=GrpcOptions)
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_config_name: str = ""
    backend_directory: str = ""
    metrics_config: dict[str, str] = field(default_factory=dict)
    # --cache-config=<cache>,<key>=<value> (and the deprecated --response-cache-byte-size N, which
    # means local,size=N): {"local": {"size": "1048576"}}; empty means no response cache.
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    rate_limit: str = "off"  # --rate-limit: off | execution_count
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)  # --rate-limit-resource
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config and the deprecated --trace-*
    deprecated: list[str] = field(default_factory=list)  # the --trace-<name> flags given, logged at start-up
    # Flags accepted without effect, in the order given: logged once at start-up.
    ignored: list[str] = field(default_factory=list)
    # --frontend-workers: worker processes serving the public HTTP/gRPC ports (0: this process does)
    frontend_workers: int = 0
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)
    argv: list[str] = field(default_factory=list)  # the command line, which frontend workers parse again
