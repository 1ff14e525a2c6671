"""Client shared memory without a server: the backend's registry
(pystub_backend.backend.features.client_shm), the stub's mappings (pystub_backend.stub.features.client_shm),
region handles (pystub_backend.ipc.tensors) and the stub writing outputs
(pystub_backend.stub.translate), on real /dev/shm objects that the test creates and unlinks itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.client_shm import (
    ClientShmRegistry,
    ShmOutput,
    ShmTensor,
    attach_regions,
    region_handle,
)
from pystub_backend.backend.inference import InferRequest, RequestedOutput, Tensor
from pystub_backend.backend.models.validation import validate_request
from pystub_backend.ipc import names, tensors
from pystub_backend.ipc.arena import ArenaWriter
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.client_shm import ClientShmForget
from pystub_backend.ipc.status import Status
from pystub_backend.stub import pb_utils
from pystub_backend.stub.features import client_shm as stub_shm
from pystub_backend.stub.translate import response_to_wire

_counter = iter(range(1_000_000))


@contextlib.contextmanager
def shm_object(data: bytes) -> Iterator[str]:
    """A client's shm object holding `data`; yields its key and unlinks it afterwards."""
    key = f"/clientshm_unit_{os.getpid()}_{next(_counter)}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        yield key
    finally:
        os.unlink("/dev/shm" + key)


def mapped(key: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(("/dev/shm" + key) in line for line in maps)


def held(key: str) -> bool:
    """An fd of this process is open on the object (the backend holds regions by fd, unmapped)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "/dev/shm" + key:
                return True
        except OSError:
            continue
    return False


def status_of(error: pytest.ExceptionInfo[ServerError]) -> Status:
    return error.value.status


# -- registration --------------------------------------------------------------------------------------
def test_register_status_unregister() -> None:
    registry = ClientShmRegistry(enabled=True)
    with shm_object(bytes(100)) as key:
        registry.register("a", key, 10, 90)
        registry.register("b", key, 0, 100)
        assert registry.status() == [{"name": "a", "key": key, "offset": 10, "byte_size": 90},
                                     {"name": "b", "key": key, "offset": 0, "byte_size": 100}]
        assert registry.status("b") == [{"name": "b", "key": key, "offset": 0, "byte_size": 100}]
        assert held(key) and not mapped(key)  # held by fd, never mapped: a truncation cannot SIGBUS us
        registry.unregister("a")
        registry.unregister("unknown")
        assert [r["name"] for r in registry.status()] == ["b"]
        registry.unregister()
        assert registry.status() == [] and not held(key)
        assert os.path.exists("/dev/shm" + key)  # unregistering never unlinks


@pytest.mark.parametrize("name, key_of, offset, size, status, text", [
    ("r", lambda k: k + "_missing", 0, 8, Status.INVALID_ARG, "Unable to open shared memory region"),
    ("r", lambda k: "/a/b", 0, 8, Status.INVALID_ARG, "not a POSIX shared memory name"),
    ("r", lambda k: "/..", 0, 8, Status.INVALID_ARG, "not a POSIX shared memory name"),
    ("r", lambda k: "/", 0, 8, Status.INVALID_ARG, "not a POSIX shared memory name"),
    ("r", lambda k: "/pystub_123_abc_ctl", 0, 8, Status.INVALID_ARG, "pystub's own objects"),
    ("r", lambda k: k, 60, 8, Status.INVALID_ARG, "failed to register shared memory region 'r': invalid args"),
    ("r", lambda k: k, 0, 65, Status.INVALID_ARG, "failed to register shared memory region 'r': invalid args"),
    ("r", lambda k: k, -1, 8, Status.INVALID_ARG, "must not be negative"),
    ("r", lambda k: k, 0, True, Status.INVALID_ARG, "integers"),
    ("r", lambda k: 5, 0, 8, Status.INVALID_ARG, "'key' must be a string"),
    ("", lambda k: k, 0, 8, Status.INVALID_ARG, "non-empty name"),
])
def test_registration_errors(name: str, key_of: Any, offset: Any, size: Any, status: Status, text: str) -> None:
    registry = ClientShmRegistry(enabled=True)
    with shm_object(bytes(64)) as key:
        with pytest.raises(ServerError) as error:
            registry.register(name, key_of(key), offset, size)
        assert status_of(error) == status and text in error.value.message
        assert registry.status() == [] and not mapped(key)


def test_duplicate_name_and_empty_object() -> None:
    registry = ClientShmRegistry(enabled=True)
    with shm_object(bytes(8)) as key, shm_object(b"") as empty:
        registry.register("r", key, 0, 8)
        with pytest.raises(ServerError) as error:
            registry.register("r", key, 0, 8)
        assert status_of(error) == Status.ALREADY_EXISTS
        assert error.value.message == "shared memory region 'r' already in manager"
        with pytest.raises(ServerError) as error:
            registry.register("e", empty, 0, 0)
        assert status_of(error) == Status.INVALID_ARG
        registry.close()
        assert not mapped(key)


def test_disabled_registry_refuses_clearly() -> None:
    registry = ClientShmRegistry(enabled=False)
    for call in (lambda: registry.register("r", "/x", 0, 8), registry.status, registry.unregister):
        with pytest.raises(ServerError) as error:
            call()
        assert status_of(error) == Status.UNSUPPORTED and "--allow-client-shm=true" in error.value.message
    request = InferRequest("m", inputs=[Tensor("I", "FP32", (1,), b"", {"shared_memory_region": "r",
                                                                          "shared_memory_byte_size": 4})])
    with pytest.raises(ServerError) as error:
        registry.resolve(request)
    assert status_of(error) == Status.INVALID_ARG and "Unable to find shared memory region: 'r'" in error.value.message


def test_cuda_on_a_cpu_only_server() -> None:
    registry = ClientShmRegistry(enabled=False)
    assert registry.cuda_status() == []
    registry.cuda_unregister()
    registry.cuda_unregister("x")
    with pytest.raises(ServerError) as error:
        registry.cuda_status("x")
    assert status_of(error) == Status.NOT_FOUND
    with pytest.raises(ServerError) as error:
        registry.cuda_register("x")
    assert status_of(error) == Status.INVALID_ARG  # Triton 2.51 without a GPU (tests/differential/test_without_gpu.py)


# -- requests --------------------------------------------------------------------------------------------
def shm_parameters(region: str, size: Any, offset: Any = None) -> dict[str, Any]:
    parameters = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset is not None:
        parameters["shared_memory_offset"] = offset
    return parameters


def test_resolve_views_inputs_and_marks_outputs() -> None:
    data = np.arange(8, dtype=np.float32)
    registry = ClientShmRegistry(enabled=True)
    with shm_object(b"\xee" * 16 + data.tobytes()) as key:
        registry.register("r", key, 8, 40)
        inode = os.stat("/dev/shm" + key).st_ino
        regular = Tensor("J", "FP32", (2,), np.zeros(2, np.float32).tobytes())
        request = InferRequest("m", inputs=[Tensor("I", "FP32", (8,), b"", shm_parameters("r", 32, 8)), regular],
                               outputs=[RequestedOutput("O", shm_parameters("r", 16, 24)), RequestedOutput("P")])
        lease = registry.resolve(request)
        shm_input, shm_output = request.inputs[0], request.outputs[0]
        assert isinstance(shm_input, ShmTensor) and request.inputs[1] is regular
        assert bytes(shm_input.data) == data.tobytes() and shm_input.nbytes == 32
        assert region_handle(shm_input) == [1, 16, 32, key, inode] and region_handle(regular) is None
        assert isinstance(shm_output, ShmOutput) and shm_output.handle == [1, 32, 16, key, inode]
        assert type(request.outputs[1]) is RequestedOutput
        assert shm_input.region is not None and shm_input.region.holds == 2
        lease.release()
        lease.release()  # idempotent
        assert shm_input.region.holds == 0
        with pytest.raises(ValueError):
            bytes(shm_input.data)  # a released lease releases the views its inputs carried
        registry.close()


def test_resolve_without_shm_is_free() -> None:
    registry = ClientShmRegistry(enabled=True)
    request = InferRequest("m", inputs=[Tensor("I", "FP32", (1,), bytes(4))], outputs=[RequestedOutput("O")])
    first, second = registry.resolve(request), registry.resolve(request)
    assert first is second  # one shared no-op lease, no allocation per request


@pytest.mark.parametrize("parameters, text", [
    (shm_parameters("nope", 4), "Unable to find shared memory region: 'nope'"),
    (shm_parameters("r", 4, 29), "Invalid offset + byte size for shared memory region: 'r'"),
    (shm_parameters("r", 33), "Invalid offset + byte size for shared memory region: 'r'"),
    ({"shared_memory_region": "r"}, "has no 'shared_memory_byte_size'"),
    (shm_parameters("r", -4), "non-negative integers"),
    (shm_parameters("r", 4, -1), "non-negative integers"),
    (shm_parameters("r", 4.0), "non-negative integers"),
    (shm_parameters(3, 4), "must be a string"),
])
def test_resolve_errors(parameters: dict[str, Any], text: str) -> None:
    registry = ClientShmRegistry(enabled=True)
    with shm_object(bytes(32)) as key:
        registry.register("r", key, 0, 32)
        good = Tensor("A", "FP32", (1,), b"", shm_parameters("r", 4))
        for request in (InferRequest("m", inputs=[good, Tensor("B", "FP32", (1,), b"", parameters)]),
                        InferRequest("m", inputs=[good], outputs=[RequestedOutput("O", parameters)])):
            with pytest.raises(ServerError) as error:
                registry.resolve(request)
            assert status_of(error) == Status.INVALID_ARG and text in error.value.message
            assert request.inputs[0].region.holds == 0  # type: ignore[attr-defined]
        registry.unregister()
        assert not mapped(key)


def test_validation_checks_the_shm_byte_size() -> None:
    from pystub_backend.backend.config.model_config import config_from_json
    config = config_from_json('{"name": "m", "backend": "python", "max_batch_size": 0, '
                              '"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [4]}], '
                              '"output": [{"name": "O", "data_type": "TYPE_FP32", "dims": [4]}]}')
    registry = ClientShmRegistry(enabled=True)
    with shm_object(bytes(64)) as key:
        registry.register("r", key, 0, 64)
        request = InferRequest("m", inputs=[Tensor("I", "FP32", (4,), b"", shm_parameters("r", 12))])
        with registry.resolve(request), pytest.raises(ServerError) as error:
            validate_request(request, config)
        assert "Expected 16, got 12" in error.value.message
        request = InferRequest("m", inputs=[Tensor("I", "FP32", (4,), b"", shm_parameters("r", 16))])
        with registry.resolve(request):
            assert validate_request(request, config) == 1
        registry.close()


def test_a_region_its_owner_truncated_is_an_error_never_a_fault() -> None:
    """The backend reads regions with preadv, never through a mapping: a region that
    shrank under its registration gives INVALID_ARG for the request that reads it, and a plain
    input's size is checked without reading it at all."""
    from pystub_backend.backend.config.model_config import config_from_json
    config = config_from_json('{"name": "m", "backend": "python", "max_batch_size": 0, '
                              '"input": [{"name": "I", "data_type": "TYPE_STRING", "dims": [2]}], '
                              '"output": [{"name": "O", "data_type": "TYPE_STRING", "dims": [2]}]}')
    payload = b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    registry = ClientShmRegistry(enabled=True)
    with shm_object(payload) as key:
        registry.register("r", key, 0, len(payload))
        os.truncate("/dev/shm" + key, 3)
        request = InferRequest("m", inputs=[Tensor("I", "BYTES", (2,), b"", shm_parameters("r", len(payload)))])
        with registry.resolve(request), pytest.raises(ServerError) as error:
            validate_request(request, config)
        assert error.value.status == Status.INVALID_ARG and "it was truncated" in error.value.message
        plain = InferRequest("m", inputs=[Tensor("I", "FP32", (2,), b"", shm_parameters("r", 8))])
        with registry.resolve(plain):
            shm_input = plain.inputs[0]
            assert shm_input.nbytes == 8  # known without reading the region
            with pytest.raises(ServerError, match="truncated"):
                bytes(shm_input.data)
        os.truncate("/dev/shm" + key, len(payload))  # grown back: readable again (zeros past byte 3)
        with registry.resolve(request):
            assert bytes(request.inputs[0].data) == payload[:3] + bytes(len(payload) - 3)
        registry.close()


class _FakeChannel:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send(self, frame: bytes, timeout: float, what: str) -> None:
        self.frames.append(frame)


class _FakeStub:
    def __init__(self) -> None:
        self.alive = True
        self.channel = _FakeChannel()
        self.instance_name = "fake_0"

        class _Settings:
            stub_timeout_seconds = 1.0

        self.settings = _Settings()

    async def send(self, message: Any, timeout: float | None = None) -> None:
        """As StubProcess.send: the one way features send to a stub."""
        await self.channel.send(msg.encode(message), timeout or self.settings.stub_timeout_seconds,
                                type(message).__name__)


class _FakeStream:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def when_final(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def finish(self) -> None:
        for callback in self.callbacks:
            callback(self)


def test_unregister_waits_for_requests_in_flight_then_tells_the_stubs() -> None:
    async def scenario() -> None:
        registry = ClientShmRegistry(enabled=True)
        with shm_object(bytes(64)) as key:
            registry.register("in", key, 0, 32)
            registry.register("out", key, 32, 32)
            generations = [1, 2]
            request = InferRequest("m", inputs=[Tensor("I", "FP32", (8,), b"", shm_parameters("in", 32))],
                                   outputs=[RequestedOutput("O", shm_parameters("out", 32))])
            lease = registry.resolve(request)
            stub, stream = _FakeStub(), _FakeStream()
            outputs = attach_regions(request, stub, stream)
            assert outputs == {"O": request.outputs[0].handle}  # type: ignore[attr-defined]
            lease.release()  # the core is done with it; the stub round trip still holds it
            registry.unregister()
            assert registry.status() == [] and held(key) and not mapped(key)
            await asyncio.sleep(0)
            assert stub.channel.frames == []
            stream.finish()  # the final response is in
            await asyncio.sleep(0.01)
            assert not held(key)
            forgets = [msg.decode(frame) for frame in stub.channel.frames]
            assert sorted(g for f in forgets for g in f.generations) == generations
            assert all(isinstance(f, ClientShmForget) for f in forgets)
            # the name can be registered again at once, as a new generation
            registry.register("in", key, 0, 32)
            assert registry._regions["in"].generation == 3
            registry.close()

    asyncio.run(scenario())


def test_a_cuda_unregister_answers_once_every_live_stub_closed_the_handle() -> None:
    from pystub_backend.backend.features import client_shm as backend_shm
    from pystub_backend.ipc.messages.client_shm import ClientShmForgotten

    async def scenario() -> None:
        registry = ClientShmRegistry(enabled=True, gpus=(0,))
        registry.cuda_register("c", bytes(64), 0, 64)
        generation = registry._regions["c"].generation
        first, second = _FakeStub(), _FakeStub()
        registry._regions["c"].stubs.update((first, second))  # both opened its handle
        done = asyncio.ensure_future(registry.cuda_unregister_closed("c", timeout=30))
        await asyncio.sleep(0.05)
        assert not done.done() and registry.cuda_status() == []  # the name is gone, the answer waits
        assert [type(msg.decode(f)).__name__ for s in (first, second) for f in s.channel.frames] == [
            "ClientShmForget", "ClientShmForget"]
        backend_shm._on_forgotten(first, ClientShmForgotten([generation]))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not done.done()
        second.alive = False  # a stub that dies never answers, and is not waited for
        await asyncio.wait_for(done, 5)
        assert backend_shm._closing == {}

    asyncio.run(scenario())


# -- the stub's side ------------------------------------------------------------------------------------
def test_stub_maps_inputs_read_only_and_writes_outputs() -> None:
    regions = stub_shm.ClientRegions()
    with shm_object(bytes(range(64))) as key:
        inode = os.stat("/dev/shm" + key).st_ino
        handle = tensors.region_handle(7, 8, 16, key, inode)
        array = tensors.to_array(None, ["I", "UINT8", [16], handle], regions)  # type: ignore[arg-type]
        assert bytes(array) == bytes(range(8, 24)) and not array.flags.writeable
        target = tensors.region_handle(7, 32, 8, key, inode)
        wire = tensors.place_in_region(regions, "O", "UINT8", [4], np.arange(4, dtype=np.uint8) + 200, target)
        assert list(wire) == ["O", "UINT8", [4], [-1, 0, 0]]
        with open("/dev/shm" + key, "rb") as file:
            assert file.read()[32:36] == bytes([200, 201, 202, 203])
        with pytest.raises(tensors.RegionTooSmallError) as error:
            tensors.place_in_region(regions, "O", "FP32", [4], np.zeros(4, np.float32), target)
        assert str(error.value) == ("shared memory size specified with the request for output 'O' (8 bytes) "
                                    "should be at least 16 bytes to hold the results")
        with pytest.raises(stub_shm.RegionError):
            regions.view(tensors.region_handle(7, 60, 8, key, inode))  # beyond the object
        assert regions.mapped == 2  # one read-only and one writable mapping, cached
        regions.forget([7])
        assert regions.mapped == 0
        assert bytes(array) == bytes(range(8, 24))  # an array the model kept stays valid
        with pytest.raises(stub_shm.RegionError, match="unregistered"):
            regions.view(handle)
        del array
        gc.collect()
        assert not mapped(key)


def test_stub_refuses_an_object_replaced_behind_the_key() -> None:
    regions = stub_shm.ClientRegions()
    with shm_object(bytes(16)) as key:
        stale_inode = os.stat("/dev/shm" + key).st_ino + 1
        with pytest.raises(stub_shm.RegionError, match="replaced"):
            regions.view(tensors.region_handle(1, 0, 4, key, stale_inode))
        with pytest.raises(ValueError, match="cannot map"):
            wire = ["I", "UINT8", [4], tensors.region_handle(1, 0, 4, key, 0)]
            tensors.to_array(None, wire)  # type: ignore[arg-type]
    regions.close()


def test_output_targets_live_as_long_as_the_sender() -> None:
    class Sender:
        pass

    sender = Sender()
    stub_shm.expect_outputs(12345, sender, {"O": [1, 0, 4, "/k", 1]})
    assert stub_shm.output_targets(12345) == {"O": [1, 0, 4, "/k", 1]}
    del sender
    gc.collect()
    assert stub_shm.output_targets(12345) is None
    # a rescheduled request runs again under its rid with a new sender: the old one's end is harmless
    first, second = Sender(), Sender()
    stub_shm.expect_outputs(12346, first, {"O": [1, 0, 4, "/k", 1]})
    stub_shm.expect_outputs(12346, second, {"O": [1, 0, 4, "/k", 1]})
    del first
    gc.collect()
    assert stub_shm.output_targets(12346) is not None
    del second
    gc.collect()
    assert stub_shm.output_targets(12346) is None


def test_response_to_wire_writes_region_outputs_and_rolls_back_on_errors() -> None:
    base = names.stub_base_name("pystub")
    writer = ArenaWriter(base, "s2p", 16384, 16384)

    class Sender:
        pass

    sender = Sender()
    try:
        with shm_object(bytes(16)) as key:
            inode = os.stat("/dev/shm" + key).st_ino
            stub_shm.expect_outputs(777, sender, {"O": tensors.region_handle(99, 0, 16, key, inode)})
            # P is larger than tensors.INLINE_BYTES: it goes into the arena (a small one would ride inline)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("P", np.ones(1024, np.float32)),
                                                   pb_utils.Tensor("O", np.full(4, 2.5, np.float32))])
            rid, _, error, outputs, _ = response_to_wire(777, response, 1, set(), writer)
            assert (rid, error) == (777, None)
            assert [o[0] for o in outputs] == ["P", "O"] and outputs[1][3] == [-1, 0, 0]
            assert np.fromfile("/dev/shm" + key, dtype=np.float32).tolist() == [2.5] * 4
            writer.free(outputs[0][3])
            too_big = pb_utils.InferenceResponse([pb_utils.Tensor("P", np.ones(1024, np.float32)),
                                                  pb_utils.Tensor("O", np.zeros(5, np.float32))])
            _, _, error, outputs, _ = response_to_wire(777, too_big, 1, set(), writer)
            assert list(error) == [int(Status.INVALID_ARG), "shared memory size specified with the request for output "
                             "'O' (16 bytes) should be at least 20 bytes to hold the results"]
            assert outputs == [] and writer.used == 0  # the arena output placed before it was freed
            stub_shm.REGIONS.forget([99])
    finally:
        del sender
        writer.close()
        names.unlink_entries(names.owned_entries(base))
