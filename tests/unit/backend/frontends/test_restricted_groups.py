"""Which API group each HTTP path and gRPC method belongs to (--http-restricted-api,
--grpc-restricted-protocol); every group of Triton's list is reachable on both protocols."""

from __future__ import annotations

import pytest

from pystub_backend.backend.frontends.grpc.restrict import method_group
from pystub_backend.backend.frontends.http.restrict import path_group
from pystub_backend.backend.options import API_GROUPS


@pytest.mark.parametrize("path, group", [
    ("/v2/health/live", "health"), ("/v2/health/ready", "health"), ("/v2/models/m/ready", "health"),
    ("/v2/models/m/versions/2/ready", "health"), ("/v2", "metadata"), ("/v2/models/m", "metadata"),
    ("/v2/models/m/versions/1", "metadata"), ("/v2/models/m/infer", "inference"),
    ("/v2/models/m/versions/1/generate", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/systemsharedmemory/status", "shared-memory"), ("/v2/cudasharedmemory/region/r/register", "shared-memory"),
    ("/v2/models/m/config", "model-config"), ("/v2/repository/index", "model-repository"),
    ("/v2/repository/models/m/load", "model-repository"), ("/v2/pystub/stubs", "model-repository"),
    ("/v2/pystub/stubs/m/restart", "model-repository"), ("/v2/models/stats", "statistics"),
    ("/v2/models/m/stats", "statistics"), ("/v2/trace/setting", "trace"), ("/v2/models/m/trace/setting", "trace"),
    ("/v2/logging", "logging"), ("/metrics", None), ("/v2/unknown/thing", None),
])
def test_http_path_groups(path: str, group: str | None) -> None:
    assert path_group(path) == group


@pytest.mark.parametrize("method, group", [
    ("ServerLive", "health"), ("ModelReady", "health"), ("ServerMetadata", "metadata"),
    ("ModelMetadata", "metadata"), ("ModelInfer", "inference"), ("ModelStreamInfer", "inference"),
    ("SystemSharedMemoryRegister", "shared-memory"), ("CudaSharedMemoryStatus", "shared-memory"),
    ("ModelConfig", "model-config"), ("RepositoryModelLoad", "model-repository"),
    ("RepositoryIndex", "model-repository"),
    ("ModelStatistics", "statistics"), ("TraceSetting", "trace"), ("LogSettings", "logging"),
])
def test_grpc_method_groups(method: str, group: str) -> None:
    assert method_group(f"/inference.GRPCInferenceService/{method}") == group


def test_health_and_reflection_services() -> None:
    assert method_group("/grpc.health.v1.Health/Check") == "health"
    assert method_group("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None


def test_every_group_is_reachable() -> None:
    http_paths = ["/v2/health/live", "/v2", "/v2/models/m/infer", "/v2/systemsharedmemory/status",
                  "/v2/models/m/config", "/v2/repository/index", "/v2/models/stats", "/v2/trace/setting", "/v2/logging"]
    assert {path_group(path) for path in http_paths} == set(API_GROUPS)
