"""Running one batch through the model's `execute` and checking what it returns
(docs/reference/model-api.md#what-execute-may-return).

Default mode: `execute` returns a list with one entry per request: an `InferenceResponse`, or None
when the request's sender answered (or will answer) it. Decoupled mode: it returns None and every
response goes through a sender. An exception, or a return that breaks the rules, fails every
request of the batch that is not already closed, with Triton's texts. A model that defines
`execute_batch` (pystub extension) runs through `pystub_backend.stub.batched` instead.
"""

from __future__ import annotations

import inspect
import os
import sysconfig
import traceback
from collections.abc import Callable
from typing import Any

import pystub_backend
from pystub_backend.ipc.status import Status
from pystub_backend.stub import pb_utils
from pystub_backend.stub.event_loop import EscapedExit, InstanceLoop, unwrap

__all__ = ["ExecuteRuleError", "run_execute", "check_return", "failure_text", "model_frames"]

RELEASE_RESCHEDULE = 2


class ExecuteRuleError(Exception):
    """`execute` returned something the rules forbid; the message is Triton's text."""


def _type_name(value: Any) -> str:
    return str(type(value))


def check_return(result: Any, requests: list[Any], decoupled: bool, instance_name: str) -> list[Any]:
    """The per-request entries of a default-mode return (or [] for decoupled). Raises ExecuteRuleError."""
    if decoupled:
        if result is not None:
            raise ExecuteRuleError(f"Python model '{instance_name}' is using the decoupled mode and the "
                                   f"execute function must return None.")
        return []
    if result is None:
        return [None] * len(requests)
    if not isinstance(result, list):
        raise ExecuteRuleError(f"Expected a list in the execute return, found type '{_type_name(result)}'.")
    if len(result) != len(requests):
        raise ExecuteRuleError(
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n")
    for request, entry in zip(requests, result, strict=True):
        rescheduled = getattr(request, "_release_flags", 1) == RELEASE_RESCHEDULE
        if rescheduled and entry is not None:
            raise ExecuteRuleError("Expected a None object in the execute function return list for "
                                   f"reschduled request, found type '{_type_name(entry)}'.")
        if entry is not None and not isinstance(entry, pb_utils.InferenceResponse):
            raise ExecuteRuleError("Expected an 'InferenceResponse' object in the execute function return "
                                   f"list, found type '{_type_name(entry)}'.")
    return result


def failure_text(instance_name: str, exc: BaseException) -> str:
    """Triton's batch-failure text: rule errors carry their own text, exceptions `Type: text` and
    the model's frames (`model_frames`)."""
    exc = unwrap(exc)
    if isinstance(exc, ExecuteRuleError):
        return f"Failed to process the request(s) for model '{instance_name}', message: {exc}"
    detail = f"{type(exc).__name__}: {exc}{model_frames(exc)}"
    return f"Failed to process the request(s) for model '{instance_name}', message: {detail}"


# pystub's own frames: from its source files, and from its compiled modules, whose frames name their
# source relative to the package's parent (this module's __file__ may be its compiled extension's).
_PYSTUB_DIR = os.path.dirname(os.path.abspath(pystub_backend.__file__))
_PYSTUB_FRAMES = (_PYSTUB_DIR, "pystub_backend" + os.sep, "<frozen ")
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]


def model_frames(exc: BaseException) -> str:
    """The `\n\nAt:\n  <file>(<line>): <function>\n...` tail Triton's Python backend appends.

    Triton's stub calls `execute` from C++, and pybind11 lists the Python frames from the deepest
    one outwards until `execute`. Here `execute` is called from pystub's Python code, so the frames
    before the model's first one (pystub's and the standard library's wrappers) are dropped, and
    so are pystub's own frames inside (pb_utils is C++ on Triton). Empty without model frames.
    """
    frames: list[str] = []
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        ours = filename.startswith(_PYSTUB_FRAMES)
        wrapper = ours or (not frames and filename.startswith(_STDLIB_DIR))
        if not wrapper:
            frames.append(f"  {filename}({tb.tb_lineno}): {tb.tb_frame.f_code.co_name}\n")
        tb = tb.tb_next
    return "\n\nAt:\n" + "".join(reversed(frames)) if frames else ""


def run_execute(model: Any, requests: list[Any], decoupled: bool, loop: InstanceLoop,
                log_error: Callable[[str], None], batched: Any = None) -> Any:
    """Call execute. An `async def execute` runs on the instance loop: awaited in default mode,
    fire-and-forget in decoupled mode (the next batch starts while it awaits).

    `batched` (a `pystub_backend.stub.batched.BatchedExecute`, for models that define `execute_batch`) runs the
    batch through `execute_batch` instead and returns one response per request.
    """
    if batched is not None:
        return batched.run(model, requests, lambda awaitable: loop.submit(_as_coroutine(awaitable)).result(),
                           log_error)
    result = model.execute(requests)
    if result is None or type(result) is list:  # the common return: nothing to await
        return result
    if inspect.isawaitable(result):
        future = loop.submit(_as_coroutine(result))
        if decoupled:
            return None
        try:
            return future.result()
        except EscapedExit as exc:  # the model's sys.exit() in its coroutine: fail this batch only
            raise exc.original from None
    return result


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


STATUS_INTERNAL = int(Status.INTERNAL)
