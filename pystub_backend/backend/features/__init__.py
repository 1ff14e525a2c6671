"""pystub_backend.backend.features."""
