"""Entry point of a stub process: `python -m pystub_backend.stub.triton_python_backend_stub <instance> ...`.

The module name puts `triton_python_backend_stub` on the command line, where tools that look for
Triton's stubs (and `pgrep`) find it.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["parse_args", "run"]


def parse_args(argv: list[str]) -> StubOptions:  # noqa: F821 - imported lazily below
    from pystub_backend.stub.stub import StubOptions
    parser = argparse.ArgumentParser(prog="triton_python_backend_stub")
    parser.add_argument("instance")
    parser.add_argument("--base", required=True, help="shm base name of this stub incarnation")
    parser.add_argument("--fd", type=int, required=True, help="the stub's end of the channel")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--shm-default", type=int, required=True)
    parser.add_argument("--shm-growth", type=int, required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=0.25)
    parser.add_argument("--send-timeout", type=float, default=30.0)
    parser.add_argument("--rlimit", action="append", default=[], metavar="as|cpu|nofile=N")
    args = parser.parse_args(argv)
    rlimits = {}
    for entry in args.rlimit:
        name, _, value = entry.partition("=")
        if name not in ("as", "cpu", "nofile") or not value.isdigit():
            parser.error(f"bad --rlimit {entry!r}")
        rlimits[name] = int(value)
    return StubOptions(instance=args.instance, base=args.base, fd=args.fd, parent_pid=args.parent_pid,
                       shm_default=args.shm_default, shm_growth=args.shm_growth,
                       heartbeat_interval=args.heartbeat_interval, send_timeout=args.send_timeout,
                       rlimits=rlimits)


def run(argv: list[str] | None = None) -> None:
    from pystub_backend.ipc.exit_codes import StubExitCode
    from pystub_backend.stub.stub import main
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse said why on stderr
        os._exit(StubExitCode.OK if exc.code == 0 else StubExitCode.BAD_ARGUMENTS)
    code = main(options)
    # os._exit: threads a model started must not keep a finished stub alive.
    os._exit(code)


if __name__ == "__main__":
    run()
