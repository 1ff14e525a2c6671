"""The original's native module, as far as test code uses it: `shared_memory.free_memory()`."""

from pystub_backend.stub.pb_utils import _runtime

__all__ = ["shared_memory"]


class _SharedMemory:
    """Stands in for the stub's shared-memory manager."""

    def free_memory(self) -> int:
        """Free bytes in the stub's shared memory as the stub reports them (0 when unknown)."""
        return _runtime.shm_free_memory()


shared_memory = _SharedMemory()
