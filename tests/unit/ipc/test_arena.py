"""pystub_backend.ipc.arena on real anonymous segments (sealed memfds): growth, views across two
mappings, ownership, frees, the reader's checks on handles, and the segments' seals.

The reader gets the writer's new descriptors before each view, as the channel delivers them with
the next frame (tests/unit/ipc/test_channel_segments.py covers that part over a real socket pair).
Every arena is labelled from `stub_base_name("pystub")`; the leak check sees any descriptor left.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pystub_backend.ipc import names
from pystub_backend.ipc.allocator import ALIGNMENT
from pystub_backend.ipc.arena import EMPTY_HANDLE, ArenaFullError, ArenaReader, ArenaWriter
from pystub_backend.ipc.segment import REQUIRED_SEALS, Segment, SegmentCreateError

PAGE = 4096


class HandedReader(ArenaReader):
    """An ArenaReader that receives the writer's new descriptors before each view, as the channel
    would hand them over with the next frame."""

    def __init__(self, writer: ArenaWriter) -> None:
        super().__init__(writer.base, writer.purpose)
        self.writer = writer

    def view(self, handle: tuple[int, int, int] | list[int]) -> memoryview:
        self.add_fds(self.writer.take_new_fds())
        return super().view(handle)


@contextlib.contextmanager
def arena(default: int = PAGE, growth: int = PAGE, max_size: int | None = None,
          ) -> Iterator[tuple[ArenaWriter, HandedReader]]:
    """A writer and a reader of one fresh arena; everything closed afterwards."""
    base = names.stub_base_name("pystub")
    writer = ArenaWriter(base, "p2s", default, growth, max_size)
    reader = HandedReader(writer)
    try:
        yield writer, reader
    finally:
        reader.close()
        writer.close()


def segment_sizes(writer: ArenaWriter) -> list[int]:
    """The sizes of the arena's segments as the kernel reports them for the descriptors handed
    over (fstat), in index order."""
    fds = writer.take_new_fds()
    try:
        return [os.fstat(fd).st_size for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


def memfd_descriptors() -> int:
    """How many memfd descriptors this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
        except OSError:
            continue
    return count


def pattern(nbytes: int, seed: int) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(nbytes))


# -- growth ------------------------------------------------------------------------------------
def test_first_segment_has_the_default_size_and_growth_adds_steps() -> None:
    with arena(default=2 * PAGE, growth=3 * PAGE) as (writer, _):
        first = writer.allocate(PAGE)
        assert first[0] == 0 and segment_sizes(writer) == [2 * PAGE]
        writer.allocate(PAGE)  # fills segment 0 exactly
        assert segment_sizes(writer) == []  # no new segment
        third = writer.allocate(1)
        assert third[0] == 1 and segment_sizes(writer) == [3 * PAGE]
        assert writer.total == 5 * PAGE


@given(nbytes=st.integers(1, 20 * PAGE), growth_pages=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_a_request_larger_than_the_step_gets_a_multiple_of_the_step(nbytes: int, growth_pages: int) -> None:
    growth = growth_pages * PAGE
    with arena(default=PAGE, growth=growth) as (writer, _):
        writer.allocate(PAGE)  # segment 0 is full: the next request must grow
        handle = writer.allocate(nbytes)
        size = segment_sizes(writer)[handle[0]]
        assert handle[0] == 1 and handle[1] == 0
        assert size % growth == 0 and size >= nbytes
        assert size - growth < max(nbytes, 1), "not the smallest multiple that fits"
        assert writer.total == PAGE + size


def test_growth_never_moves_data() -> None:
    with arena() as (writer, reader):
        written = [(writer.write(pattern(n, n)), pattern(n, n)) for n in (100, 4000, 9000, 50, 20000)]
        assert len(writer._segments) > 1
        for handle, data in written:
            assert bytes(reader.view(handle)) == data
            assert bytes(writer.view(handle)) == data


def test_max_size_refuses_growth_with_the_triton_text() -> None:
    with arena(default=PAGE, growth=PAGE, max_size=2 * PAGE) as (writer, _):
        writer.allocate(2 * PAGE - ALIGNMENT)  # segment 0 grows to 2 pages: the limit
        with pytest.raises(ArenaFullError, match="^Failed to increase the shared memory pool size"):
            writer.allocate(PAGE)
        assert writer.total == 2 * PAGE and writer.allocation_count == 1


def test_a_segment_that_cannot_be_reserved_fails_cleanly() -> None:
    """A petabyte is more memory than there is: refused before a page is taken, with the client
    text; no descriptor is left and the arena works as before."""
    with arena() as (writer, reader):
        kept = writer.write(b"kept")
        assert bytes(reader.view(kept)) == b"kept"  # segment 0 handed over
        held = memfd_descriptors()
        with pytest.raises(ArenaFullError, match="^Failed to increase the shared memory pool size") as error:
            writer.allocate(1 << 50)
        assert "memory" in str(error.value)
        assert len(writer._segments) == 1 and writer.take_new_fds() == []
        assert memfd_descriptors() == held
        assert bytes(reader.view(kept)) == b"kept"
        assert writer.write(b"after")[0] == 0


def test_a_segment_that_cannot_be_mapped_fails_cleanly_in_a_limited_process() -> None:
    """Out of address space (RLIMIT_AS, as STUB_MEMORY_LIMIT_BYTES sets it): the mapping fails,
    the arena raises the client text and keeps working, and the pages reserved for the failed
    segment are given back (its only descriptor is closed)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import resource, sys
        from pystub_backend.ipc.arena import ArenaWriter, ArenaFullError
        writer = ArenaWriter("pystub_test", "s2p", 1 << 20, 1 << 20)
        writer.write(b"kept")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * 4096
        resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), hard))
        try:
            writer.allocate(256 << 20)
        except ArenaFullError as exc:
            print("refused:", str(exc)[:46])
        print("after:", writer.write(b"after")[0], len(writer._segments))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: Failed to increase the shared memory pool size",
                                        "after: 0 1"], done.stdout


def test_segments_are_anonymous_sealed_and_handed_over_read_only() -> None:
    """Nothing in /dev/shm; the reader's descriptor cannot be mapped writable; nobody can shrink
    a segment (the seals); the writer keeps no descriptor once they are taken."""
    before = set(os.listdir(names.SHM_DIR))
    held = memfd_descriptors()
    with arena() as (writer, _):
        writer.write(b"x" * 100)
        assert set(os.listdir(names.SHM_DIR)) == before
        assert memfd_descriptors() == held + 1  # until handed over
        [fd] = writer.take_new_fds()
        try:
            assert memfd_descriptors() == held + 1  # only the one taken for the peer
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & REQUIRED_SEALS == REQUIRED_SEALS
            with pytest.raises(PermissionError):
                mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            with pytest.raises(OSError):
                os.ftruncate(fd, 0)
            assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{writer.base}_p2s0")
        finally:
            os.close(fd)
        assert memfd_descriptors() == held


def test_from_fd_refuses_what_is_not_a_sealed_segment() -> None:
    """A peer cannot hand over a plain file or an unsealed memfd (which it could shrink under our
    mapping), nor an empty segment."""
    with tempfile.TemporaryFile() as plain:
        plain.write(b"x" * PAGE)
        plain.flush()
        with pytest.raises(SegmentCreateError, match="not an anonymous segment"):
            Segment.from_fd(plain.fileno())
    unsealed = os.memfd_create("pystub_test_unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(unsealed, PAGE)
        with pytest.raises(SegmentCreateError, match="not sealed"):
            Segment.from_fd(unsealed)
        reader = ArenaReader("pystub_test", "p2s")
        reader.add_fds([os.dup(unsealed)])  # a refused descriptor takes its index; views say why
        with pytest.raises(SegmentCreateError, match="not sealed"):
            reader.view((0, 0, 1))
        reader.close()
    finally:
        os.close(unsealed)
    empty = os.memfd_create("pystub_test_empty", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        fcntl.fcntl(empty, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
        with pytest.raises(SegmentCreateError, match="cannot map"):
            Segment.from_fd(empty)
    finally:
        os.close(empty)


# -- views and ownership ---------------------------------------------------------------------
def test_reader_views_are_read_only_and_see_the_writers_bytes() -> None:
    with arena() as (writer, reader):
        array = np.arange(100, dtype=np.float32)
        handle = writer.write(array)
        view = reader.view(handle)
        assert view.readonly
        np.testing.assert_array_equal(np.frombuffer(view, dtype=np.float32), array)
        writer.view(handle)[:4] = np.float32(-1).tobytes()  # the writer's later writes show through
        assert np.frombuffer(view, dtype=np.float32)[0] == -1
        with pytest.raises(TypeError):
            view[0] = 1
        view.release()


def test_write_accepts_non_contiguous_buffers() -> None:
    with arena() as (writer, reader):
        array = np.arange(64, dtype=np.int16).reshape(8, 8)[:, ::2]
        handle = writer.write(array)
        assert bytes(reader.view(handle)) == np.ascontiguousarray(array).tobytes()


def test_owns_finds_arrays_that_live_in_the_arena() -> None:
    with arena() as (writer, reader):
        handle = writer.write(np.arange(32, dtype=np.int32))
        inside = np.frombuffer(writer.view(handle), dtype=np.int32)
        assert writer.owns(inside) == handle
        assert writer.owns(inside.reshape(4, 8)) == handle
        assert writer.owns(inside[:8]) == (handle[0], handle[1], 32)  # a prefix of the allocation
        assert writer.owns(inside[1:]) is None  # not at an allocation's start
        assert writer.owns(inside[::2]) is None  # not contiguous
        assert writer.owns(inside[:0]) is None  # empty
        assert writer.owns(np.arange(32, dtype=np.int32)) is None  # foreign memory
        assert writer.owns(b"bytes") is None
        # The reader's mapping of the same segment is another address: not the writer's memory.
        assert writer.owns(np.frombuffer(reader.view(handle), dtype=np.int32)) is None
        writer.free(handle)
        assert writer.owns(inside) is None  # no longer a live allocation
        del inside


# -- frees ---------------------------------------------------------------------------------------
def test_double_free_raises() -> None:
    with arena() as (writer, _):
        handle = writer.write(b"x" * 100)
        writer.free(handle)
        with pytest.raises(KeyError):
            writer.free(handle)
        with pytest.raises(KeyError):
            writer.free((-2, 0, 0))
        with pytest.raises(IndexError):
            writer.free((5, 0, 100))


def test_freed_memory_is_reused_without_growth() -> None:
    with arena() as (writer, _):
        first = writer.write(b"a" * 3000)
        writer.free(first)
        for _ in range(100):
            writer.free(writer.write(b"b" * 3000))
        assert len(writer._segments) == 1 and writer.used == 0


def test_zero_size_tensors_take_no_memory() -> None:
    with arena() as (writer, reader):
        handle = writer.write(b"")
        assert handle == EMPTY_HANDLE
        assert writer.write(np.empty((0, 5), dtype=np.float64)) == EMPTY_HANDLE
        assert writer.allocate(0) == EMPTY_HANDLE
        assert len(reader.view(handle)) == 0 and len(writer.view(handle)) == 0
        writer.free(handle)
        writer.free(list(handle))  # handles come back from the wire as lists
        assert writer.total == 0 and writer.take_new_fds() == []
        with pytest.raises(ValueError):
            writer.allocate(-1)


# -- the reader's checks -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    (0, PAGE - 8, 16),  # runs past the end
    (0, PAGE, 1),  # starts at the end
    (0, -64, 16),  # negative offset
    (0, 0, -1),  # negative size
    (0, 1 << 40, 8),  # far outside
    (-3, 0, 8),  # a negative segment that is not the empty handle
    (-1, 0, 8),
])
def test_reader_rejects_a_handle_outside_its_segment(bad: tuple[int, int, int]) -> None:
    with arena() as (writer, reader):
        writer.write(b"y" * 64)
        with pytest.raises(ValueError):
            reader.view(bad)
        with pytest.raises(ValueError):
            reader.view(list(bad))


def test_reader_rejects_a_segment_that_does_not_exist() -> None:
    with arena() as (writer, reader):
        writer.write(b"z")
        with pytest.raises(SegmentCreateError):
            reader.view((7, 0, 1))


def test_reader_maps_segments_handed_over_later() -> None:
    with arena() as (writer, reader):
        first = writer.write(b"1" * PAGE)
        assert bytes(reader.view(first)) == b"1" * PAGE
        second = writer.write(b"2" * 10)  # a segment created after the reader mapped segment 0
        assert second[0] == 1
        assert bytes(reader.view(second)) == b"2" * 10


# -- a random workload through writer and reader -------------------------------------------------
class ArenaMachine(RuleBasedStateMachine):
    """Writes, frees and reads in random order: every live handle keeps its bytes (nothing
    overlaps or moves), used matches the live allocations, and a fully freed arena serves its
    largest request again without growing."""

    @initialize(growth_pages=st.integers(1, 3))
    def create(self, growth_pages: int) -> None:
        self.context = arena(default=PAGE, growth=growth_pages * PAGE)
        self.writer, self.reader = self.context.__enter__()
        self.live: dict[tuple[int, int, int], bytes] = {}
        self.counter = 0

    @rule(nbytes=st.integers(0, 3 * PAGE))
    def write(self, nbytes: int) -> None:
        self.counter += 1
        data = pattern(nbytes, self.counter)
        handle = self.writer.write(data)
        if nbytes == 0:
            assert handle == EMPTY_HANDLE
            return
        assert handle not in self.live
        self.live[handle] = data

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        handle = data.draw(st.sampled_from(sorted(self.live)))
        self.writer.free(handle)
        del self.live[handle]

    @invariant()
    def bytes_intact(self) -> None:
        if not hasattr(self, "writer"):
            return
        for handle, data in self.live.items():
            assert bytes(self.reader.view(handle)) == data
        for allocator in self.writer._allocators:
            allocator.check()
        assert self.writer.allocation_count == len(self.live)
        assert self.writer.used == sum(max(ALIGNMENT, -(-len(d) // ALIGNMENT) * ALIGNMENT)
                                       for d in self.live.values())

    def teardown(self) -> None:
        if not hasattr(self, "writer"):
            return
        try:
            for handle in list(self.live):
                self.writer.free(handle)
            assert self.writer.used == 0
            segments = len(self.writer._segments)
            for index, allocator in enumerate(self.writer._allocators):
                assert allocator.largest_free == allocator.size
                assert self.writer.allocate(allocator.size)[0] == index  # reusable, in place
            assert len(self.writer._segments) == segments
        finally:
            self.context.__exit__(None, None, None)


TestArenaMachine = ArenaMachine.TestCase
TestArenaMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
