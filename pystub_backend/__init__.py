"""pystub_backend."""
