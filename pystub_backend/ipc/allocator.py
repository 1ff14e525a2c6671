"""A first-fit free-list allocator over one contiguous range, with coalescing.

It manages offsets only: no memory is touched, so it is easy to test exhaustively. Free blocks are
kept sorted by offset; a free merges with both neighbours at once, so a long mixed workload ends
up with as few, as large, free blocks as the live allocations allow.

Invariants (checked by `check()` and by the property tests):
- free and allocated blocks never overlap and lie inside [0, size);
- used + free == size;
- no two free blocks touch (they would have been merged).
"""

from __future__ import annotations

import bisect

__all__ = ["Allocator", "ALIGNMENT"]

# 64 bytes: a cache line, and enough for any numpy dtype's alignment.
ALIGNMENT = 64


def _align(nbytes: int) -> int:
    return max(ALIGNMENT, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


class Allocator:
    """Offsets within `[0, size)`; `allocate` returns an offset or None when nothing fits."""

    def __init__(self, size: int) -> None:
        if size <= 0 or size % ALIGNMENT:
            raise ValueError(f"allocator size must be a positive multiple of {ALIGNMENT}, got {size}")
        self.size = size
        self._free_offsets: list[int] = [0]
        self._free_sizes: dict[int, int] = {0: size}
        self._allocated: dict[int, int] = {}
        self.used = 0

    def allocate(self, nbytes: int) -> int | None:
        """Reserve `nbytes` (rounded up to ALIGNMENT); None when no free block is large enough."""
        need = _align(nbytes)
        for index, offset in enumerate(self._free_offsets):
            block = self._free_sizes[offset]
            if block < need:
                continue
            del self._free_sizes[offset]
            if block == need:
                del self._free_offsets[index]
            else:
                self._free_offsets[index] = offset + need
                self._free_sizes[offset + need] = block - need
            self._allocated[offset] = need
            self.used += need
            return offset
        return None

    def free(self, offset: int) -> None:
        """Return the block at `offset`. Raises KeyError if it is not allocated (a double free)."""
        size = self._allocated.pop(offset)
        self.used -= size
        index = bisect.bisect_left(self._free_offsets, offset)
        # Merge with the following free block.
        if index < len(self._free_offsets) and self._free_offsets[index] == offset + size:
            size += self._free_sizes.pop(self._free_offsets[index])
            del self._free_offsets[index]
        # Merge with the preceding free block.
        if index > 0:
            previous = self._free_offsets[index - 1]
            if previous + self._free_sizes[previous] == offset:
                self._free_sizes[previous] += size
                return
        self._free_offsets.insert(index, offset)
        self._free_sizes[offset] = size

    def is_allocated(self, offset: int) -> bool:
        return offset in self._allocated

    def block_size(self, offset: int) -> int:
        """The (aligned) size of the allocation at `offset`. Raises KeyError if there is none."""
        return self._allocated[offset]

    @property
    def free_bytes(self) -> int:
        return self.size - self.used

    @property
    def largest_free(self) -> int:
        return max(self._free_sizes.values(), default=0)

    @property
    def allocation_count(self) -> int:
        return len(self._allocated)

    def check(self) -> None:
        """Assert the invariants in the module docstring (for tests and debugging)."""
        blocks = sorted([(o, s, "free") for o, s in self._free_sizes.items()]
                        + [(o, s, "used") for o, s in self._allocated.items()])
        position = 0
        previous_kind = ""
        for offset, size, kind in blocks:
            assert offset == position, f"gap or overlap at {offset} (expected {position})"
            assert not (kind == previous_kind == "free"), f"unmerged free blocks at {offset}"
            position += size
            previous_kind = kind
        assert position == self.size, f"blocks cover {position} of {self.size} bytes"
        assert self.used == sum(self._allocated.values())
        assert self._free_offsets == sorted(self._free_sizes)
