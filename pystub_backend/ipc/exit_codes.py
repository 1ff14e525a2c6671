"""Named exit codes of a stub process, shared by the stub (which exits with them) and the backend
(which reads them from the reaped process and decides whether a restart can help).

    code  name                  meaning                                          restart?
    ----  --------------------  -----------------------------------------------  --------
      0   OK                    FINALIZE or AUTO_COMPLETE done                    -
     64   BAD_ARGUMENTS         the command line was malformed (a backend bug)    no
     70   BOOT_FAILED           could not attach the control block, arenas, fd    no
     71   MODEL_IMPORT_FAILED   model.py could not be imported / has no execute   no
     72   INITIALIZE_FAILED     the model's initialize() raised                   no
     73   PARENT_GONE           the backend process died                          -
     74   CHANNEL_CLOSED        the backend closed the channel without FINALIZE   -

The codes sit above 63 (sysexits' range) so that they do not collide with the small codes a
model might pass to `sys.exit`/`os._exit` (1, 2, 3...), which stay "the stub died". A boot code
only means a boot failure while the stub has not yet reported READY; after that, an exit with any
code is a death and the supervisor restarts the stub (gunicorn's WORKER_BOOT_ERROR / APP_LOAD_ERROR
work the same way).
"""

from __future__ import annotations

import enum

__all__ = ["StubExitCode", "BOOT_FAILURES", "describe_exit"]


class StubExitCode(enum.IntEnum):
    OK = 0
    BAD_ARGUMENTS = 64
    BOOT_FAILED = 70
    MODEL_IMPORT_FAILED = 71
    INITIALIZE_FAILED = 72
    PARENT_GONE = 73
    CHANNEL_CLOSED = 74


# Exits after which starting the same stub again would fail the same way.
BOOT_FAILURES = frozenset({StubExitCode.BAD_ARGUMENTS, StubExitCode.BOOT_FAILED,
                           StubExitCode.MODEL_IMPORT_FAILED, StubExitCode.INITIALIZE_FAILED})


def describe_exit(code: int) -> str:
    """`exited with code N` plus the code's name when it is one of ours."""
    try:
        return f"exited with code {code} ({StubExitCode(code).name})"
    except ValueError:
        return f"exited with code {code}"
