"""Entry point of a stub process: `python -m pystub_backend.stub.triton_python_backend_stub <instance> ...`.

The module name puts `triton_python_backend_stub` on the command line, where tools that look for
Triton's stubs (and `pgrep`) find it.

Before any model code runs, the process is made to look like Triton's stub to a model: `sys.argv`
is `['']`, and neither the working directory (which `python -m` puts first on `sys.path`) nor the
directory holding `pystub_backend` (the backend puts it on PYTHONPATH) stays on `sys.path`, so a
model's helper module called `utils`, `backend` or `tools` is the model's own. pystub's own
modules keep importing: once `pystub_backend` is imported, its submodules resolve through the
package's `__path__`, not `sys.path`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystub_backend.stub.stub import StubOptions

__all__ = ["parse_args", "run", "isolate_model_imports"]

_SITE_DIRS = ("site-packages", "dist-packages")


def parse_args(argv: list[str]) -> StubOptions:
    from pystub_backend.stub.stub import StubOptions
    parser = argparse.ArgumentParser(prog="triton_python_backend_stub")
    parser.add_argument("instance")
    parser.add_argument("--base", required=True, help="label of this stub incarnation's shared memory")
    parser.add_argument("--fd", type=int, required=True, help="the stub's end of the channel")
    parser.add_argument("--control-fd", type=int, required=True, help="the control block's descriptor")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--shm-default", type=int, required=True)
    parser.add_argument("--shm-growth", type=int, required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=0.25)
    parser.add_argument("--send-timeout", type=float, default=30.0)
    parser.add_argument("--rlimit", action="append", default=[], metavar="as|cpu|nofile=N")
    parser.add_argument("--fork-fd", type=int, default=-1,
                        help="a shared-weights template's fork socket: run the template's loop")
    args = parser.parse_args(argv)
    rlimits = {}
    for entry in args.rlimit:
        name, _, value = entry.partition("=")
        if name not in ("as", "cpu", "nofile") or not value.isdigit():
            parser.error(f"bad --rlimit {entry!r}")
        rlimits[name] = int(value)
    return StubOptions(instance=args.instance, base=args.base, fd=args.fd, control_fd=args.control_fd,
                       parent_pid=args.parent_pid,
                       shm_default=args.shm_default, shm_growth=args.shm_growth,
                       heartbeat_interval=args.heartbeat_interval, send_timeout=args.send_timeout,
                       rlimits=rlimits, fork_fd=args.fork_fd)


def isolate_model_imports(working_dir: str) -> None:
    """Drop pystub's and the working directory's entries from `sys.path`, set `sys.argv` to
    `['']` (what a model sees on Triton). Call after `pystub_backend` is imported."""
    import pystub_backend
    project_root = os.path.dirname(os.path.dirname(os.path.abspath(pystub_backend.__file__)))
    drop = {working_dir}
    if os.path.basename(project_root) not in _SITE_DIRS:  # an installed package's site dir stays
        drop.add(project_root)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) not in drop]
    sys.argv[:] = [""]
    # multiprocessing's spawn re-imports the parent's __main__ in each child by its module name,
    # which no longer resolves once pystub's root is off sys.path; without a spec the child runs
    # this file by path instead, and it imports nothing of pystub at module level. (Triton's
    # stub has no Python __main__ at all.)
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__file__", None) == __file__:
        main.__spec__ = None


def run(argv: list[str] | None = None) -> None:
    working_dir = os.path.abspath(os.getcwd())
    from pystub_backend.ipc.exit_codes import StubExitCode
    from pystub_backend.stub.fork_server import run_template
    from pystub_backend.stub.stub import main
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse said why on stderr
        os._exit(StubExitCode.OK if exc.code == 0 else StubExitCode.BAD_ARGUMENTS)
    isolate_model_imports(working_dir)
    code = run_template(options) if options.fork_fd >= 0 else main(options)
    # os._exit: threads a model started must not keep a finished stub alive.
    os._exit(code)


if __name__ == "__main__":
    run()
