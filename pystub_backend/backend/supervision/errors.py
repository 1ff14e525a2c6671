"""Errors of starting and reaching a stub."""

from __future__ import annotations

__all__ = ["StubStartError"]


class StubStartError(Exception):
    """The stub could not start or its model failed to initialize; the message says why.

    `boot_failure` is True when starting the same stub again would fail the same way (the model
    does not import, its initialize raised, the stub exited with a boot exit code): the
    supervisor then marks the instance FAILED instead of respawning it in a loop.
    """

    def __init__(self, message: str, boot_failure: bool = False) -> None:
        super().__init__(message)
        self.boot_failure = boot_failure
