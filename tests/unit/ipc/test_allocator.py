"""Property tests of pystub_backend.ipc.allocator: the free list never overlaps, loses or fragments bytes.

A reference model (the live blocks we were given) is checked against the allocator after every
step, on top of the allocator's own `check()` (blocks tile [0, size) exactly, used + free = size,
no two free blocks touch).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pystub_backend.ipc.allocator import ALIGNMENT, Allocator


def aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


def free_block_count(allocator: Allocator) -> int:
    return len(allocator._free_offsets)


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/free sequences; the invariants hold after every step."""

    @initialize(blocks=st.integers(1, 64))
    def create(self, blocks: int) -> None:
        self.allocator = Allocator(blocks * ALIGNMENT)
        self.live: dict[int, int] = {}  # offset -> aligned size

    @rule(nbytes=st.integers(0, 24 * ALIGNMENT))
    def allocate(self, nbytes: int) -> None:
        need = aligned(nbytes)
        largest_before = self.allocator.largest_free
        offset = self.allocator.allocate(nbytes)
        if offset is None:
            # Only a real lack of contiguous room may refuse a request.
            assert largest_before < need
            return
        assert offset % ALIGNMENT == 0
        assert offset >= 0 and offset + need <= self.allocator.size
        for other, size in self.live.items():
            assert offset + need <= other or other + size <= offset, "overlapping allocations"
        self.live[offset] = need

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.live)))
        self.allocator.free(offset)
        del self.live[offset]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def double_free_raises(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.live)))
        self.allocator.free(offset)
        del self.live[offset]
        with pytest.raises(KeyError):
            self.allocator.free(offset)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "allocator"):
            return
        self.allocator.check()
        assert self.allocator.used == sum(self.live.values())
        assert self.allocator.used + self.allocator.free_bytes == self.allocator.size
        assert self.allocator.allocation_count == len(self.live)
        # Coalescing: free blocks are separated by live ones, so there are at most live + 1.
        assert free_block_count(self.allocator) <= len(self.live) + 1

    def teardown(self) -> None:
        if not hasattr(self, "allocator"):
            return
        for offset in list(self.live):
            self.allocator.free(offset)
        # Everything freed is reusable: one allocation of the whole range succeeds.
        assert self.allocator.allocate(self.allocator.size) == 0
        self.allocator.check()


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@given(sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=80), seed=st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_free_all_in_any_order_restores_one_block(sizes: list[int], seed: random.Random) -> None:
    """Whatever the allocation sizes and the order of the frees, the range ends whole."""
    allocator = Allocator(sum(aligned(n) for n in sizes))
    offsets = [allocator.allocate(n) for n in sizes]
    assert None not in offsets, "sizes that sum to the range must all fit an empty allocator"
    assert allocator.free_bytes == 0 and allocator.allocate(1) is None
    seed.shuffle(offsets)
    for offset in offsets:
        allocator.free(offset)
        allocator.check()
    assert allocator.used == 0
    assert allocator.largest_free == allocator.size
    assert allocator.allocate(allocator.size) == 0


def test_long_mixed_workload_does_not_fragment() -> None:
    """50 000 operations, sizes from 64 B to 256 KiB, up to ~60% full: the free space is only ever
    split by live allocations, a refusal means no free block is large enough, and the end state
    is a single free block."""
    rng = random.Random(1234)
    allocator = Allocator(16 << 20)
    live: list[int] = []
    refusals = 0
    for _ in range(50_000):
        if live and (rng.random() < 0.5 or allocator.used > 0.6 * allocator.size):
            allocator.free(live.pop(rng.randrange(len(live))))
        else:
            nbytes = rng.choice((rng.randint(1, 4096), rng.randint(4096, 65536), rng.randint(65536, 262144)))
            largest = allocator.largest_free
            offset = allocator.allocate(nbytes)
            if offset is None:
                assert largest < aligned(nbytes)
                refusals += 1
            else:
                live.append(offset)
        assert free_block_count(allocator) <= len(live) + 1
    allocator.check()
    assert refusals == 0, "a 40%-free 16 MiB range refused a <= 256 KiB request"
    for offset in live:
        allocator.free(offset)
    assert free_block_count(allocator) == 1 and allocator.allocate(allocator.size) == 0


def test_first_fit_reuses_the_lowest_hole() -> None:
    allocator = Allocator(8 * ALIGNMENT)
    a, b, c = (allocator.allocate(ALIGNMENT) for _ in range(3))
    allocator.free(b)
    assert allocator.allocate(10) == b
    allocator.free(a)
    allocator.free(b)  # merges with a's block: one hole of two units at 0
    assert allocator.allocate(2 * ALIGNMENT) == 0
    assert c == 2 * ALIGNMENT


def test_zero_bytes_still_takes_an_aligned_block() -> None:
    allocator = Allocator(2 * ALIGNMENT)
    assert allocator.allocate(0) == 0
    assert allocator.used == ALIGNMENT


@pytest.mark.parametrize("size", [0, -ALIGNMENT, ALIGNMENT + 1, 100])
def test_size_must_be_a_positive_multiple_of_the_alignment(size: int) -> None:
    with pytest.raises(ValueError):
        Allocator(size)


def test_free_of_an_offset_never_allocated_raises() -> None:
    allocator = Allocator(4 * ALIGNMENT)
    offset = allocator.allocate(ALIGNMENT)
    with pytest.raises(KeyError):
        allocator.free(offset + ALIGNMENT)
    with pytest.raises(KeyError):
        allocator.free(offset + 1)
    allocator.check()
