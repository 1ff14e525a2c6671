"""Every `tritonserver` 2.51 flag, as data: its value, and what pystub does with it.

`FLAGS` is the one list (the `--help` of the tritonserver 2.51 binary, in its order). Each entry
says whether the flag takes a value, an example value (the parse test and `docs/command-line.md`
use it), and its effect here:

    IMPLEMENTED  the flag does here what it does in Triton
    STORED       parsed and kept in `ServerOptions` for a feature that reads it; no behaviour yet
    NO_OP        accepted, and one log line at start-up names it and says why it has no effect

The parser (`arguments.py`) gives IMPLEMENTED and STORED flags their typed definitions; NO_OP flags get a
generic one from this table. A unit test checks that the parser and the table agree, and another
compares the table with the real binary's `--help` when it is installed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Effect", "Flag", "FLAGS", "PYSTUB_FLAGS", "flag_named"]


class Effect(enum.Enum):
    IMPLEMENTED = "implemented"
    STORED = "stored"
    NO_OP = "no-op"


@dataclass(frozen=True)
class Flag:
    name: str
    example: str | None  # None: the flag takes no value
    effect: Effect
    note: str  # for NO_OP: why it has no effect; otherwise what pystub does with it

    @property
    def takes_value(self) -> bool:
        return self.example is not None


_I, _S, _N = Effect.IMPLEMENTED, Effect.STORED, Effect.NO_OP
_GPU = "pystub runs no GPU code"
_TRACE = "deprecated in Triton: --trace-config overrides it (docs/tracing.md)"

FLAGS: tuple[Flag, ...] = (
    Flag("--id", "pystub", _I, "server name in the metadata responses"),
    Flag("--exit-timeout-secs", "30", _I, "bounds the wait for in-flight requests at shutdown"),
    Flag("--log-verbose", "1", _I, "verbose log level"),
    Flag("--log-info", "true", _I, "info lines on/off"),
    Flag("--log-warning", "true", _I, "warning lines on/off"),
    Flag("--log-error", "true", _I, "error lines on/off"),
    Flag("--log-format", "ISO8601", _I, "'default' (glog style), 'ISO8601' timestamps or 'json' (pystub)"),
    Flag("--log-file", "/tmp/pystub.log", _I, "log to this file instead of stderr"),
    Flag("--model-store", "/models", _I, "same as --model-repository"),
    Flag("--model-repository", "/models", _I, "model repository (repeatable)"),
    Flag("--exit-on-error", "true", _I, "exit when a model fails to load at start-up"),
    Flag("--disable-auto-complete-config", None, _I, "no auto_complete_config calls"),
    Flag("--strict-readiness", "true", _I, "ready only when every model is ready"),
    Flag("--model-control-mode", "explicit", _I, "none, poll or explicit"),
    Flag("--repository-poll-secs", "15", _I, "poll interval in poll mode"),
    Flag("--load-model", "add_sub", _I, "models loaded at start-up in explicit mode"),
    Flag("--model-config-name", "h100", _I, "<model>/configs/<name>.pbtxt replaces config.pbtxt where it exists"),
    Flag("--model-load-thread-count", "4", _I, "at most this many models load at the same time"),
    Flag("--model-load-retry-count", "0", _I, "a model that fails to load is tried this many more times"),
    Flag("--model-namespacing", "false", _N, "model names are unique across repositories in pystub"),
    Flag("--enable-peer-access", "true", _N, _GPU),
    Flag("--allow-http", "true", _I, "HTTP listener on/off"),
    Flag("--http-address", "127.0.0.1", _I, "HTTP bind address (pystub's default: 127.0.0.1)"),
    Flag("--http-port", "8000", _I, "HTTP port"),
    Flag("--reuse-http-port", "true", _I, "SO_REUSEPORT on the HTTP listener"),
    Flag("--http-header-forward-pattern", "^x-.*", _I, "matching headers become string request parameters"),
    Flag("--http-thread-count", "8", _N, "the HTTP frontend is one asyncio event loop, not a thread pool"),
    Flag("--http-restricted-api", "model-repository:admin-key=secret", _I,
         "API groups that need a header key=value (403 otherwise)"),
    Flag("--allow-grpc", "true", _I, "gRPC listener on/off"),
    Flag("--grpc-address", "127.0.0.1", _I, "gRPC bind address (pystub's default: 127.0.0.1)"),
    Flag("--grpc-port", "8001", _I, "gRPC port"),
    Flag("--reuse-grpc-port", "true", _I, "SO_REUSEPORT on the gRPC listener"),
    Flag("--grpc-header-forward-pattern", "^x-.*", _I, "matching metadata become string request parameters"),
    Flag("--grpc-infer-allocation-pool-size", "8", _N, "pystub keeps no pool of request objects"),
    Flag("--grpc-use-ssl", "true", _I, "TLS on the gRPC listener"),
    Flag("--grpc-use-ssl-mutual", "true", _I, "mutual TLS: clients must present a certificate"),
    Flag("--grpc-server-cert", "/certs/server.crt", _I, "PEM server certificate"),
    Flag("--grpc-server-key", "/certs/server.key", _I, "PEM server key"),
    Flag("--grpc-root-cert", "/certs/ca.crt", _I, "PEM root certificate clients are checked against"),
    Flag("--grpc-infer-response-compression-level", "low", _I,
         "grpc.default_compression_level of the server (none, low, medium, high)"),
    Flag("--grpc-keepalive-time", "7200000", _I, "grpc.keepalive_time_ms"),
    Flag("--grpc-keepalive-timeout", "20000", _I, "grpc.keepalive_timeout_ms"),
    Flag("--grpc-keepalive-permit-without-calls", "false", _I, "grpc.keepalive_permit_without_calls"),
    Flag("--grpc-http2-max-pings-without-data", "2", _I, "grpc.http2.max_pings_without_data"),
    Flag("--grpc-http2-min-recv-ping-interval-without-data", "300000", _I,
         "grpc.http2.min_ping_interval_without_data_ms"),
    Flag("--grpc-http2-max-ping-strikes", "2", _I, "grpc.http2.max_ping_strikes"),
    Flag("--grpc-max-connection-age", "60000", _I, "grpc.max_connection_age_ms"),
    Flag("--grpc-max-connection-age-grace", "10000", _I, "grpc.max_connection_age_grace_ms"),
    Flag("--grpc-restricted-protocol", "model-repository:admin-key=secret", _I,
         "protocol groups that need a metadata key=value (UNAVAILABLE otherwise)"),
    Flag("--allow-sagemaker", "false", _N, "pystub has no SageMaker endpoint"),
    Flag("--sagemaker-port", "8080", _N, "pystub has no SageMaker endpoint"),
    Flag("--sagemaker-safe-port-range", "8000-9000", _N, "pystub has no SageMaker endpoint"),
    Flag("--sagemaker-thread-count", "8", _N, "pystub has no SageMaker endpoint"),
    Flag("--allow-vertex-ai", "false", _N, "pystub has no Vertex AI endpoint"),
    Flag("--vertex-ai-port", "8080", _N, "pystub has no Vertex AI endpoint"),
    Flag("--vertex-ai-thread-count", "8", _N, "pystub has no Vertex AI endpoint"),
    Flag("--vertex-ai-default-model", "add_sub", _N, "pystub has no Vertex AI endpoint"),
    Flag("--allow-metrics", "true", _I, "metrics listener on/off"),
    Flag("--allow-gpu-metrics", "false", _I, "GPU gauges (nv_gpu_*) on/off; none without a GPU"),
    Flag("--allow-cpu-metrics", "true", _I, "CPU and memory gauges on/off"),
    Flag("--metrics-address", "127.0.0.1", _I, "metrics bind address"),
    Flag("--metrics-port", "8002", _I, "metrics port"),
    Flag("--metrics-interval-ms", "2000", _I, "sampling period of the polled gauges"),
    Flag("--metrics-config", "summary_latencies=true", _I,
         "counter_latencies, summary_latencies, summary_quantiles as in Triton 2.51; histogram_latencies "
         "adds pystub's nv_inference_*_histogram_us"),
    Flag("--trace-config", "mode=opentelemetry", _I,
         "tracing: level, rate, count, mode; opentelemetry,url= and resource= export spans over OTLP/HTTP; "
         "triton,file= and log-frequency= are kept but write no trace file"),
    Flag("--backend-directory", "/opt/backends", _I,
         "Python-based backends: a model with backend: \"<name>\" runs <dir>/<name>/model.py"),
    Flag("--backend-config", "python,shm-default-byte-size=4194304", _I, "python backend settings"),
    Flag("--repoagent-directory", "/opt/repoagents", _N, "pystub runs no repository agents"),
    Flag("--cache-config", "local,size=1048576", _I,
         "the response cache: 'local,size=<bytes>' (the only cache pystub has)"),
    Flag("--cache-directory", "/opt/caches", _N, "pystub loads no cache shared libraries"),
    Flag("--rate-limit", "off", _I, "off or execution_count: instances wait for their rate_limiter resources"),
    Flag("--rate-limit-resource", "R1:10:0", _I,
         "how many of a rate-limiter resource there are (devices other than 0 count for nothing)"),
    Flag("--pinned-memory-pool-byte-size", "268435456", _N, _GPU),
    Flag("--cuda-memory-pool-byte-size", "0:67108864", _N, _GPU),
    Flag("--cuda-virtual-address-size", "0:1073741824", _N, _GPU),
    Flag("--min-supported-compute-capability", "6.0", _N, _GPU),
    Flag("--buffer-manager-thread-count", "0", _N, "tensors are copied once, on the event loop"),
    Flag("--host-policy", "policy,numa-node=0", _N, "pystub applies no NUMA or CPU pinning policy"),
    Flag("--model-load-gpu-limit", "0:0.5", _N, _GPU),
    Flag("--strict-model-config", "false", _I, "true disables auto-complete (deprecated in Triton)"),
    Flag("--response-cache-byte-size", "1048576", _I,
         "same as --cache-config=local,size=<bytes> (deprecated in Triton)"),
    Flag("--trace-file", "/tmp/trace.json", _I, _TRACE),
    Flag("--trace-level", "TIMESTAMPS", _I, _TRACE),
    Flag("--trace-rate", "1000", _I, _TRACE),
    Flag("--trace-count", "-1", _I, _TRACE),
    Flag("--trace-log-frequency", "0", _I, _TRACE),
)

# pystub's own flags, which tritonserver does not have.
PYSTUB_FLAGS: tuple[Flag, ...] = (
    Flag("--allow-client-shm", "true", _I,
         "the system shared memory extension (off by default: pystub maps client memory only when asked)"),
    Flag("--http-max-input-size", "67108864", _I,
         "largest JSON part of an HTTP request (binary tensor data after it is not counted); later "
         "Triton releases have this flag, 2.51 does not"),
    Flag("--allow-remote-control", "model-repository,logging", _I,
         "state-changing API groups (model-repository, shared-memory, logging, trace, or all) that peers other "
         "than loopback may call without a --http-restricted-api / --grpc-restricted-protocol key"),
    Flag("--grpc-handshake-timeout", "30000", _I,
         "grpc.server_handshake_timeout_ms: a connection that has not sent the HTTP/2 preface (and TLS "
         "handshake) in time is closed; pystub's default 30000"),
    Flag("--grpc-max-connection-idle", "300000", _I,
         "grpc.max_connection_idle_ms: a connection without calls for this long gets GOAWAY (clients reconnect); "
         "pystub's default 300000"),
    Flag("--grpc-max-receive-message-length", "2147483647", _I,
         "grpc.max_receive_message_length: the largest request message, after decompression (RESOURCE_EXHAUSTED "
         "over it); pystub's default 2147483647, Triton's"),
    Flag("--grpc-max-metadata-size", "16384", _I,
         "grpc.absolute_max_metadata_size: the largest header list of one call (that call alone ends "
         "RESOURCE_EXHAUSTED); default 16384, grpc's"),
    Flag("--grpc-request-read-timeout", "60000", _I,
         "ms within which a gRPC call must have its first request message (else DEADLINE_EXCEEDED; a stream is "
         "exempt once its handler runs); h2 stack; 0: no limit; default 60000"),
    Flag("--grpc-max-connection-memory", "1073741824", _I,
         "bytes of requests the calls of one gRPC connection may hold (received, inflated, header lists); a call "
         "over it ends RESOURCE_EXHAUSTED; h2 stack; 0: no limit; default 1073741824"),
    Flag("--http-header-timeout-secs", "30", _I,
         "a request head (or an idle new connection) not complete after this many seconds is closed; 0: no limit"),
    Flag("--http-body-timeout-secs", "60", _I,
         "a request body not complete after this many seconds, plus one per 64 KiB received, is closed; 0: no limit"),
    Flag("--frontend-workers", "2", _I,
         "worker processes serve the HTTP and gRPC ports (SO_REUSEPORT) and send inference to this process; "
         "0 (the default): this process serves them (docs/frontend-workers.md)"),
    Flag("--grpc-server", "h2", _I,
         "the gRPC serving stack: h2 (the default: libnghttp2 on pystub's event loop, less CPU per call) or aio "
         "(grpcio's grpc.aio server); both serve the same services, flags and behaviour (docs/grpc-candidates.md)"),
    Flag("--openai-port", "9000", _I,
         "serve the OpenAI-compatible API (/v1/models, completions, chat completions, embeddings) on this "
         "port; off unless given (docs/openai.md)"),
    Flag("--openai-address", "127.0.0.1", _I, "OpenAI-compatible API bind address (default: 127.0.0.1)"),
    Flag("--tokenizer", "/models/llm/tokenizer", _I,
         "a local tokenizer directory (or its tokenizer_config.json) whose chat template renders chat "
         "messages; nothing is downloaded"),
    Flag("--chat-template", "/models/llm/template.jinja", _I,
         "the chat template: a Jinja file, or the template's text; overrides the tokenizer's"),
    Flag("--tool-call-parser", "hermes", _I,
         "read tool calls from the model's text: hermes (qwen), llama3 (llama3_json) or mistral; a model's "
         "config parameter tool_call_parser overrides it (docs/openai.md)"),
    Flag("--max-model-len", "8192", _I,
         "the context length of models whose config declares no max_model_len: a longer prompt plus max_tokens "
         "is a 400 context_length_exceeded before the model runs"),
    Flag("--openai-cors-origin", "https://app.example.com", _I,
         "an origin (or several, comma-separated; * for any) a browser may call the OpenAI port from; "
         "repeatable; none by default"),
)

_BY_NAME = {flag.name: flag for flag in FLAGS + PYSTUB_FLAGS}


def flag_named(name: str) -> Flag:
    """The entry for `name` (with its leading dashes). Raises KeyError for a flag not in the table."""
    return _BY_NAME[name]
