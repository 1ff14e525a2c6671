"""Fixtures shared by every test: the leak check (autouse) and real backends."""

from __future__ import annotations

import compileall
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import EXAMPLES, ROOT, Backend, LeakSnapshot, check_no_leaks, module_backend, remove_backend_logs


def pytest_configure(config: pytest.Config) -> None:
    """Compile pystub's modules to bytecode once, before any backend starts. The suite starts
    hundreds of backends and stubs, each importing pystub from source; where
    PYTHONDONTWRITEBYTECODE is set (some CI images set it) none of them cached what it compiled,
    and each compiled its ~200 modules again, 0.2-0.3 s of CPU per process. The variable still
    keeps the models' own bytecode out of their repositories. Up-to-date files are skipped, so
    each xdist worker's call costs little."""
    compileall.compile_dir(ROOT / "pystub_backend", quiet=1)


@pytest.fixture(scope="session", autouse=True)
def _warm_up_client_libraries() -> None:
    """Create the process-wide state that gRPC keeps after first use (pollers, wakeup fds), so the
    per-test leak check does not mistake it for a leak of the first test that uses gRPC."""
    import grpc

    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        grpc.channel_ready_future(channel).result(timeout=0.2)
    except grpc.FutureTimeoutError:
        pass  # nothing listens there; the attempt is what starts gRPC's pollers
    channel.close()


@pytest.fixture(scope="session", autouse=True)
def _backend_logs_removed() -> Iterator[None]:
    """Backend logs live until the session ends (module-scoped backends outlive their tests)."""
    yield
    remove_backend_logs()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves /dev/shm entries, child processes, file descriptors or its backends'
    temporary files behind."""
    before = LeakSnapshot.take()
    yield
    problems = check_no_leaks(before)
    if problems:
        pytest.fail("leak check: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def examples_backend() -> Iterator[Backend]:
    """One backend on examples/models for a whole test module."""
    with module_backend(Backend(EXAMPLES)) as backend:
        yield backend


@pytest.fixture()
def http(backend: Backend) -> Iterator[httpclient.InferenceServerClient]:
    """A tritonclient HTTP client of the module's `backend` fixture."""
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=120)
    yield client
    client.close()


@pytest.fixture()
def grpc(backend: Backend) -> Iterator[grpcclient.InferenceServerClient]:
    """A tritonclient gRPC client of the module's `backend` fixture."""
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    yield client
    client.close()
