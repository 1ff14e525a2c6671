"""The backend's handler of SequenceRescheduled frames (pystub_backend/ipc/messages/sequences.py).

The state of sequences shared with the stubs (frames on their way, the running batches, what the
model rescheduled) is owned by the sequence batcher's `StubSequences`
(pystub_backend/backend/scheduling/sequence_stubs.py); this handler hands the frame to it.
"""

from __future__ import annotations

from typing import Any

from pystub_backend.backend.scheduling.sequence_stubs import NOT_ITERATIVE, rescheduled
from pystub_backend.backend.supervision.handlers import handles
from pystub_backend.ipc.messages.sequences import SequenceRescheduled

__all__ = ["NOT_ITERATIVE"]


@handles(SequenceRescheduled)
def _on_rescheduled(stub: Any, message: SequenceRescheduled) -> None:
    """Runs before the batch's EXECUTE_DONE: the batcher learns which of its requests run again."""
    rescheduled(stub, message.rids)
