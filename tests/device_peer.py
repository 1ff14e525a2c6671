"""Another process on the fake machine, for the device tests: it runs a script with the handle and
says what it saw, line by line; `finish()` lets it go on past its `sys.stdin.readline()`."""

from __future__ import annotations

import subprocess
import sys

# Opens the handle, reads the raw bytes (what the pages hold, without CUDA), writes one, holds the
# mapping until told, then closes it.
MAP_AND_HOLD = '''
import ctypes, sys
from pystub_backend.devices import fake_engine, fake_memory
memory = fake_memory(SHAPE)
try:
    base = memory.open_handle(DEVICE, HANDLE)
except Exception as exc:
    print("error", exc, flush=True)
    sys.exit(0)
print("raw", list((ctypes.c_float * 4).from_address(base + OFFSET)), flush=True)
(ctypes.c_float * 1).from_address(base + OFFSET)[0] = 42.0
print("wrote", flush=True)
sys.stdin.readline()
memory.close_handle(DEVICE, base)
print("closed", fake_engine.live(), flush=True)
'''


class Peer:
    """The other process, running `script` with HANDLE, OFFSET, DEVICE and SHAPE defined."""

    def __init__(self, handle: bytes, offset: int, device: int, shape: str = "13", script: str = MAP_AND_HOLD) -> None:
        prelude = f"HANDLE = bytes.fromhex({handle.hex()!r}); OFFSET = {offset}; DEVICE = {device}; SHAPE = {shape!r}\n"
        self.process = subprocess.Popen([sys.executable, "-c", prelude + script], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()  # the child exits, closing it, if anything fails

    def finish(self) -> str:
        """Let it go on; what it says until it exits."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write("\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it exited already
        rest = self.process.stdout.read().strip()
        self.process.wait(timeout=60)
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # the "\n" above is still buffered when the child had exited: close flushes it
        self.process.stdout.close()
        return rest

    def kill(self) -> None:
        self.process.kill()
        self.finish()
