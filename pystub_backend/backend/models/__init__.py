"""pystub_backend.backend.models."""
