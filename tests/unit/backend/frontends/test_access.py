"""The access policy's decision (frontends/access.py) and which calls it applies to; the real peers
are in tests/integration/test_access_policy.py."""

from __future__ import annotations

import pytest

from pystub_backend.backend.frontends.access import AccessPolicy, is_loopback, peer_address
from pystub_backend.backend.frontends.grpc.restrict import STATE_CHANGING, UPDATING, method_group
from pystub_backend.backend.frontends.http.restrict import _may_change_state, changes_state, path_group
from pystub_backend.backend.options import Restriction


@pytest.mark.parametrize("peer, loopback", [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("ipv4:127.0.0.1:5000", True), ("ipv6:[::1]:5000", True), ("ipv6:[::ffff:127.0.0.1]:5000", True),
    ("10.1.2.3", False), ("ipv4:192.0.2.2:5000", False), ("ipv6:[fe80::1%eth0]:5000", False),
    ("unix:/tmp/socket", False), ("", False), ("localhost", False)])
def test_loopback_peers(peer: str, loopback: bool) -> None:
    assert is_loopback(peer) is loopback


def test_peer_address_strips_the_transport_and_port() -> None:
    assert peer_address("ipv4:10.0.0.1:80") == "10.0.0.1"
    assert peer_address("ipv6:[2001:db8::1]:80") == "2001:db8::1"
    assert peer_address("10.0.0.1") == "10.0.0.1"


def test_refusal_names_the_peer_and_the_ways_out() -> None:
    policy = AccessPolicy.of({"logging": Restriction("k", "v")}, {"shared-memory"})
    text = policy.refusal("model-repository", "10.0.0.9")
    assert text is not None and "not from '10.0.0.9'" in text and "--allow-remote-control=model-repository" in text
    assert policy.refusal("model-repository", "127.0.0.1") is None
    assert policy.refusal("logging", "10.0.0.9") is None  # the key check guards it
    assert policy.refusal("shared-memory", "10.0.0.9") is None  # opened
    assert policy.refusal("inference", "10.0.0.9") is None  # not a state group


@pytest.mark.parametrize("method, path, changing", [
    ("POST", "/v2/repository/models/m/load", True), ("POST", "/v2/repository/models/m/unload", True),
    ("POST", "/v2/repository/models/index/load", True),
    ("POST", "/v2/repository/index", False), ("POST", "/v2/repository/r1/index", False),
    ("POST", "/v2/systemsharedmemory/region/r/register", True), ("GET", "/v2/systemsharedmemory/status", False),
    ("POST", "/v2/cudasharedmemory/unregister", True), ("POST", "/v2/logging", True), ("GET", "/v2/logging", False),
    ("POST", "/v2/trace/setting", True), ("POST", "/v2/models/m/trace/setting", True),
    ("POST", "/v2/pystub/stubs/m/restart", True), ("GET", "/v2/pystub/stubs", False),
    ("POST", "/v2/models/m/infer", False), ("DELETE", "/v2/logging", True)])
def test_http_calls_that_change_state(method: str, path: str, changing: bool) -> None:
    assert changes_state(method, path, path_group(path)) is changing
    assert _may_change_state(method, path) or not changing  # the fast pre-check never hides a change


def test_grpc_methods_that_change_state() -> None:
    names = {method.rsplit("/", 1)[1] for method in STATE_CHANGING | UPDATING}
    assert names == {"RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister",
                     "SystemSharedMemoryUnregister", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
                     "LogSettings", "TraceSetting"}
    assert {method_group(method) for method in STATE_CHANGING | UPDATING} == {
        "model-repository", "shared-memory", "logging", "trace"}
