"""A model instance's stub forked from its shared-weights template (supervision.template): the
same process-facing face as any StubProcess (pid, alive from a pidfd, heartbeat, the stop
ladder, kill), so ModelInstance, the exchange and every scheduler treat it as any stub.

    spawn()        records the interpreter and limits only: whether this stub is forked or
                   spawned is known once the template answered, in initialize
    initialize()   template.ready()? ── no (it refused) ──▶ an ordinary spawn and INIT
                        │ yes
                        ▼
                   control block, arenas, channel pair, stdout/stderr pipes (as a spawn makes
                   them); FORK with the child's four ends, closed here once sent; the child's
                   pidfd (from the template: race-free, the backend is not its parent) watched
                   for its exit; then INIT on its own channel, which runs the model's
                   `initialize_instance(args)` if it has one, not `initialize`

The template reaps the child and reports its status (ForkedChild.returncode); the stop ladder
and `kill` signal the child's process group (it has its own session), as for any stub.
"""

from __future__ import annotations

import os

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.output import OutputForwarder
from pystub_backend.backend.supervision.services import StubServices
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.backend.supervision.template import WeightsTemplate
from pystub_backend.ipc.channel import make_pair
from pystub_backend.ipc.descriptors import close_all

__all__ = ["ForkedStub"]


class ForkedStub(StubProcess):
    def __init__(self, instance_name: str, settings: StubSettings, model_name: str, services: StubServices,
                 template: WeightsTemplate) -> None:
        super().__init__(instance_name, settings, model_name, services)
        self.template = template
        self.forked = False  # True once this incarnation is a child of the template
        self._python: list[str] | None = None
        self._rlimits: dict[str, int] | None = None

    def spawn(self, python: list[str] | None = None, rlimits: dict[str, int] | None = None) -> None:
        self._python, self._rlimits = python, rlimits  # the start is initialize's (see the module docstring)

    async def initialize(self, model_path: str, args: dict[str, str], settings: dict[str, object],
                         sources: dict[str, bytes] | None = None) -> None:
        """Fork from the template and run the per-instance hook, or (template refused) spawn and
        initialize as any stub. Raises StubStartError."""
        if not await self.template.ready():
            StubProcess.spawn(self, self._python, self._rlimits)
            await StubProcess.initialize(self, model_path, args, settings, sources)
            return
        child_fds = self._prepare_child()
        try:
            child, pidfd = await self.template.fork(self.instance_name, self.base, child_fds)
        finally:
            close_all(child_fds)  # in flight they were the kernel's; now the child's alone
        watch = self.watch(child, pidfd)
        child.exited = lambda: watch.exited
        self.forked = True
        await StubProcess.initialize(self, model_path, args, settings, None)  # the template imported the files

    def _prepare_child(self) -> list[int]:
        """What a spawn makes, for a child to come: returns its ends (channel, control block,
        stdout, stderr). Raises StubStartError (nothing left behind)."""
        parent_end, child_end = make_pair()
        ends, reads = [child_end.detach()], []
        try:
            ends.append(self.create_shared_objects())
            for _ in ("stdout", "stderr"):
                read, write = os.pipe()
                reads.append(read)
                ends.append(write)
        except Exception as exc:
            parent_end.close()
            close_all(ends + reads)
            self._release_shared_objects()
            raise StubStartError(f"failed to prepare forked instance '{self.instance_name}': {exc}") from exc
        stdout, stderr = (open(fd, "rb", buffering=0) for fd in reads)  # noqa: SIM115 - the forwarder closes them
        self._output = OutputForwarder(self.instance_name, stdout, stderr)
        self.open_link(parent_end)
        return ends
