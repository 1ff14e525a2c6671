"""Shared-weights frames (kinds 80-89): the template stub that forks a model's instances.

    backend -> template                      template -> backend
    -------------------                      -------------------
    ForkCheck                                ForkCheckDone (refusal: why it cannot fork, or None)
    Fork (token, instance, base)             ForkDone (token, pid, error)
      + SCM_RIGHTS: the child's channel end,   + SCM_RIGHTS: the child's pidfd
        control block, stdout, stderr        ForkedExit (pid, status): a child reaped

ForkCheck and ForkCheckDone travel on the template's channel, after INIT_DONE: the template stops
pystub's own threads, freezes the collector's objects and says whether it holds one thread and no
GPU context. The three others travel on the template's fork socket (`--fork-fd`), a second
SOCK_SEQPACKET pair that carries nothing but them, because their descriptors must not be mistaken
for arena segments (the channel hands every descriptor that arrives to its arena). `status` is
what `subprocess.Popen.returncode` would say: the exit code, or minus the signal that killed it.
"""

from __future__ import annotations

from typing import NamedTuple

from pystub_backend.ipc.wire import message

__all__ = ["ForkCheck", "ForkCheckDone", "Fork", "ForkDone", "ForkedExit", "FORK_FDS"]

# The descriptors that ride on a Fork frame, in this order.
FORK_FDS = ("channel", "control", "stdout", "stderr")


@message(80)
class ForkCheck(NamedTuple):
    pass


@message(81)
class ForkCheckDone(NamedTuple):
    refusal: str | None  # None: the template can fork; else why not, in words for the log


@message(82)
class Fork(NamedTuple):
    token: int
    instance: str  # the child's instance name
    base: str  # the label of the child's arenas


@message(83)
class ForkDone(NamedTuple):
    token: int
    pid: int  # 0 when the fork failed
    error: str | None


@message(84)
class ForkedExit(NamedTuple):
    pid: int
    status: int
