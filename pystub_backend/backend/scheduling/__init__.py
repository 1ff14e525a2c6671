"""pystub_backend.backend.scheduling."""
