"""`InferenceResponseSender`: the one path from a request back to its client
(docs/reference/model-api.md#inferenceresponsesender, #decoupled-mode-and-senders).

The sender only enforces the rules; delivery is the stub's `send_callback`. The checks run in the
original's order, and the state is updated *before* delivery, as the original does, so a response
whose delivery failed still counts as sent.

Sends are serialized by a lock held across delivery: a model sending from several threads must
not have its FINAL overtake an earlier response on the way to the server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._binding import MODULE, UINT32, Arg, PybindRepr, binding
from ._constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from ._errors import TritonModelException

if TYPE_CHECKING:
    from ._response import InferenceResponse

__all__ = ["InferenceResponseSender", "SEND_FAILED"]

# For the stub: the text of a server-side send failure that came without a message.
SEND_FAILED = "An error occurred while sending a response."

SendCallback = Callable[["InferenceResponse | None", int], None]


def _is_response(value: object) -> bool:
    if value is None:
        return True
    global _response_class
    if _response_class is None:
        from ._response import InferenceResponse  # it imports this module: looked up once, when first needed

        _response_class = InferenceResponse
    return isinstance(value, _response_class)


_response_class: type | None = None


class InferenceResponseSender(PybindRepr):
    """Sends responses for one request: `send(response=None, flags=0)`.

    Works from any thread until FINAL has been sent; each call blocks until the server has taken
    the response.
    """

    def __init__(
        self, send_callback: SendCallback, is_cancelled_callback: Callable[[], bool], *, decoupled: bool
    ) -> None:
        self._send_callback = send_callback
        self._is_cancelled_callback = is_cancelled_callback
        self._decoupled = decoupled
        self._lock = threading.RLock()
        self._sent_count = 0
        self._responses_sent = 0
        self._final_sent = False
        self._cancelled = False

    @property
    def _responded(self) -> bool:
        """True once a send carrying a response object was accepted."""
        return self._responses_sent > 0

    @property
    def _closed(self) -> bool:
        """True once FINAL was accepted."""
        return self._final_sent

    @binding(f"(self: {MODULE}.InferenceResponseSender, response: {MODULE}.InferenceResponse = None, "
             "flags: int = 0) -> None", Arg("response", _is_response, None), Arg("flags", UINT32, 0))
    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send `response` and/or the FINAL flag.

        Raises TritonModelException with the docs/reference/model-api.md#inferenceresponsesender texts when the send
        breaks a rule, and whatever the delivery raises; TypeError (pybind11's text) for arguments of the wrong type.
        """
        with self._lock:
            _check_arguments(response, flags)
            self._update_state(response, flags)
            self._send_callback(response, flags)

    def _update_state(self, response: InferenceResponse | None, flags: int) -> None:
        if not self._decoupled:
            if response is not None and self._sent_count > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and self._sent_count == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before "
                    "sending a response."
                )
        if self._final_sent:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._final_sent = True
        self._sent_count += 1
        if response is not None:
            self._responses_sent += 1

    @binding(f"(self: {MODULE}.InferenceResponseSender) -> bool")
    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request; asks the server until it says yes."""
        if not self._cancelled:
            self._cancelled = bool(self._is_cancelled_callback())
        return self._cancelled


def _check_arguments(response: InferenceResponse | None, flags: int) -> None:
    if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
        raise TritonModelException("Unable to send response. Unsupported flag provided.")
    if flags == 0 and response is None:
        raise TritonModelException(
            "Inference Response object must be provided when the response flags is set to zero."
        )
