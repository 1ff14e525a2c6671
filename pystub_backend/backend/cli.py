"""`pystub-backend`: parse the command line (arguments.py; docs/command-line.md), configure logging, serve.

The server is imported only once the flags are parsed, so `--help` and a usage error stay fast.
"""

from __future__ import annotations

import logging
import sys

from pystub_backend.backend import event_loop
from pystub_backend.backend.arguments import parse_args
from pystub_backend.backend.flags import flag_named
from pystub_backend.backend.log import configure_logging
from pystub_backend.backend.options import ServerOptions
from pystub_backend.backend.telemetry import latency
from pystub_backend.ipc.heap import raise_malloc_thresholds

__all__ = ["main"]

log = logging.getLogger("pystub.cli")


# Triton's deprecation warnings of the old trace flags (the placeholder of each).
_TRACE_PLACEHOLDERS = {"file": "triton,file=<path/to/your/file>", "level": "level=<OFF|TIMESTAMPS|TENSORS>",
                       "rate": "rate=<rate value>", "count": "count=<count value>",
                       "log-frequency": "triton,log-frequency=<log frequency value>"}


def _log_ignored(options: ServerOptions) -> None:
    for name in options.deprecated:
        log.warning("'--trace-%s' has been deprecated and will be removed in future releases. Please use "
                    "'--trace-config %s' instead", name, _TRACE_PLACEHOLDERS[name])
    for name in options.ignored:
        log.info("%s is accepted and has no effect: %s", name, flag_named(name).note)
    for name in latency.parse_config(options.metrics_config)[1]:
        log.info("--metrics-config %s is accepted and has no effect: Triton 2.51 has no such metrics", name)
    if options.load_models and options.model_control_mode != "explicit":
        log.warning("--load-model is ignored: it applies only with --model-control-mode=explicit")


def main(argv: list[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(options.log)
    _log_ignored(options)
    latency.configure(latency.parse_config(options.metrics_config)[0])  # before any model loads
    raise_malloc_thresholds()  # tensor-sized buffers are reused, not faulted in per request
    from pystub_backend.backend.server import serve  # imported late: keeps `--help` fast

    sys.exit(event_loop.run(serve(options)))
