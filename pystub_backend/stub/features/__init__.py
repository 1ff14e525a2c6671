"""pystub_backend.stub.features."""
