"""pystub_backend.backend.supervision."""
