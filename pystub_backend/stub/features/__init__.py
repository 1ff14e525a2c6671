"""The stub's features (BLS, model control, custom metrics, multiplexing, sequences, client shared
memory): each module exposes `register(handlers)`; `install.install_features` wires them all into a
stub's `pystub_backend.stub.handlers.StubHandlers`."""

from pystub_backend.stub.features.install import FEATURES, install_features

__all__ = ["FEATURES", "install_features"]
