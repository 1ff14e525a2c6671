"""A model instance forked from its shared-weights template (stub/fork_server.py): from the fork
on, an ordinary stub with the template's model object.

    os.fork() in the template ──▶ become_instance: own session (the backend kills its group),
        parent-death signal on the template, stdout/stderr onto the pipes that came with the
        Fork frame, the template's channel, fork socket and arenas closed (the child holds no
        descriptor of the template's but the model's own), a ForkedInstanceStub on the channel
        and control block that came with the frame, the "forked" phase (features forget the
        template's stub), then the stub's own main loop
    INIT from the backend ──▶ no import, no `initialize`: the model's `initialize_instance(args)`
        runs if it has one (per-instance state; `args` name this instance), then INIT_DONE

The child's pages are the template's until one side writes them: weights stay shared as long as
nothing writes them, and `gc.freeze()` in the template keeps the collector from writing the
headers of the objects that existed before the fork.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import traceback
from typing import Any, NamedTuple, NoReturn

from pystub_backend.ipc.control_block import StubState
from pystub_backend.ipc.exit_codes import StubExitCode
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.forks import Fork
from pystub_backend.stub.batched import BatchedExecute
from pystub_backend.stub.executor import format_traceback, model_frames
from pystub_backend.stub.liveness import set_parent_death_signal
from pystub_backend.stub.loader import LoadError
from pystub_backend.stub.pb_utils import _runtime
from pystub_backend.stub.stub import Stub, StubOptions

__all__ = ["SharedModel", "ForkedInstanceStub", "become_instance", "INSTANCE_HOOK"]

INSTANCE_HOOK = "initialize_instance"  # the model's per-instance hook, run in each child


class SharedModel(NamedTuple):
    """What a template hands its children: the initialized model and the file it came from."""

    model: Any
    model_path: str


class ForkedInstanceStub(Stub):
    """A stub whose model was initialized by its template: INIT runs the per-instance hook only."""

    def __init__(self, options: StubOptions, shared: SharedModel) -> None:
        super().__init__(options)
        self._shared = shared

    def _init(self, message: msg.Init) -> None:
        args = message.args
        self.model_name = args["model_name"]
        self.model_version = int(args["model_version"])
        self.decoupled = bool(message.settings.get("decoupled", False))
        _runtime.set_model_dir(os.path.dirname(message.model_path))
        _runtime.set_instance_name(self.instance)
        self.handlers.notify_phase(self, "initializing")
        self.boot_failure = StubExitCode.INITIALIZE_FAILED
        try:
            if os.path.abspath(message.model_path) != self._shared.model_path:
                raise LoadError(f"instance '{self.instance}' was forked from a template of "
                                f"{self._shared.model_path}, not {message.model_path}")
            model = self._shared.model
            self.batched = BatchedExecute.create(type(model), args.get("model_config", "{}"), self.instance,
                                                 self.decoupled)
            self.model = model
            hook = getattr(model, INSTANCE_HOOK, None)
            if hook is not None:
                hook(args)
        except Exception as exc:
            text = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}{model_frames(exc)}"
            self.send(msg.InitDone(text, format_traceback(exc), False))
            return  # run() exits with self.boot_failure
        self.boot_failure = None
        self.control.set_state(StubState.READY)
        self.handlers.notify_phase(self, "ready")
        self.send(msg.InitDone(None, None, callable(getattr(self.model, "is_ready", None))))


def become_instance(template: Stub, shared: SharedModel, request: Fork, fds: list[int],
                    template_fds: list[int]) -> NoReturn:
    """The child's side of a fork: never returns. `fds` came with the Fork frame (channel end,
    control block, stdout, stderr); `template_fds` are the template's own (fork socket, its
    wake-up pipe), closed here."""
    code: int = StubExitCode.BOOT_FAILED
    try:
        template_pid = os.getppid()
        os.setsid()  # its own process group: the backend's SIGKILL to the group ends it and its children
        set_parent_death_signal(template_pid)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        channel_fd, control_fd, stdout_fd, stderr_fd = fds
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        for fd in (stdout_fd, stderr_fd, *template_fds):
            os.close(fd)
        for resource in (template.channel, template.p2s, template.s2p, template.control):
            resource.close()  # this process's copies; the template keeps its own
        options = dataclasses.replace(template.options, instance=request.instance, base=request.base,
                                      fd=channel_fd, control_fd=control_fd, parent_pid=template_pid, fork_fd=-1)
        stub = ForkedInstanceStub(options, shared)
        stub.handlers.notify_phase(stub, "forked")
        code = stub.run()
    except BaseException:  # noqa: BLE001 - whatever happened, the child must not return into the template's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
