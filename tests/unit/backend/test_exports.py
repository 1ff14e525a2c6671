"""The public faces of the backend package and its frontends: `__all__` is what it should be and
every name in it resolves (a change to a face must be made here on purpose)."""

from __future__ import annotations

import importlib

import pytest

FACES = {
    "pystub_backend.backend": {"main", "parse_args", "ServerOptions", "serve", "FLAGS", "stubctl_main"},
    "pystub_backend.backend.frontends": {"create_http_app", "create_grpc_listener", "GrpcListener",
                                         "create_metrics_app", "admin_routes", "create_openai_app"},
    "pystub_backend.backend.frontends.http": {"create_http_app", "path_group"},
    "pystub_backend.backend.frontends.grpc": {"GrpcListener", "create_grpc_listener", "create_grpc_server",
                                              "method_group"},
    "pystub_backend.backend.worker_pool": {"FrontendWorkers", "WorkerStartError"},
    "pystub_backend.backend.frontends.openai": {"create_openai_app", "ChatTemplate", "ChatTemplateError",
                                                "load_chat_template", "OpenAIServing", "OpenAISetupError",
                                                "load_openai_serving"},
}


@pytest.mark.parametrize("package", sorted(FACES))
def test_public_face(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == FACES[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_unknown_names_are_attribute_errors() -> None:
    module = importlib.import_module("pystub_backend.backend")
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018 - the lookup is the test


def test_faces_name_the_real_objects() -> None:
    from pystub_backend.backend import arguments, cli, flags, frontends, options
    from pystub_backend.backend.frontends.grpc import listener
    from pystub_backend.backend.frontends.http import server

    backend = importlib.import_module("pystub_backend.backend")
    assert backend.main is cli.main and backend.FLAGS is flags.FLAGS and backend.ServerOptions is options.ServerOptions
    assert backend.parse_args is arguments.parse_args
    assert frontends.create_http_app is server.create_http_app
    assert frontends.GrpcListener is listener.GrpcListener
