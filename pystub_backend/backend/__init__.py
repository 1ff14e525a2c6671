"""The parent process, `pystub-backend`: frontends, models, schedulers, stub supervision.

How a request travels, one folder per layer:

    command line ── cli.py + arguments.py (flags.py: the flag table) ──▶ options.ServerOptions ──▶ server.serve
                                                                                                              │
    client ──HTTP/gRPC──▶ frontends/http/server.py, frontends/grpc/listener.py (+ health, reflection)
                            │  decode into inference.InferRequest (tensor data = views of the message)
                            ▼
                          core.Core.infer ── models/validation.validate_request
                            │
                            ▼
                          models/version.ModelVersion ── scheduling/ picks one of:
                            │     default (next free instance), dynamic (gathers batches),
                            │     sequence (correlation ids, slots, eviction), multiplex (sub-models)
                            │   (models/ensemble.py runs `platform: "ensemble"` steps through the core)
                            ▼
                          supervision/instance.py (restart, health) ──▶
                          supervision/stub_process.py   inputs → p2s arena (one copy), EXECUTE
    ═══════════════════ process boundary: ipc/ arenas + SEQPACKET channel ═══════════════════
                          pystub_backend/stub/: views of the arena → TritonPythonModel.execute → s2p arena
                          (BLS: stub/features/bls.py → BLS frames → backend/features/bls/ → core)
    ═════════════════════════════════════════════════════════════════════════════════════════
                          RESPONSE / EXECUTE_DONE frames → response_stream.py of
                          inference.InferResponse (views of s2p; credits bound what is buffered)
                            │
                            ▼
                          frontend encodes (one copy out), then InferResponse.release() → RELEASE frame
                          telemetry/ counts it (statistics, latency summaries) for /metrics

The public face, loaded on first use so that importing a submodule stays cheap: `main` (the
`pystub-backend` command), `parse_args`, `ServerOptions`, `serve`, `FLAGS` (the flag table) and
`stubctl_main` (the `stubctl` command).
"""

from __future__ import annotations

import importlib

__all__ = ["main", "parse_args", "ServerOptions", "serve", "FLAGS", "stubctl_main"]

_HOMES = {"main": ("cli", "main"), "parse_args": ("arguments", "parse_args"),
          "ServerOptions": ("options", "ServerOptions"), "serve": ("server", "serve"), "FLAGS": ("flags", "FLAGS"),
          "stubctl_main": ("stubctl", "main")}


def __getattr__(name: str) -> object:
    """The public names, imported from their modules when first asked for (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _HOMES[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
