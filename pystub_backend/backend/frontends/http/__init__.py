"""pystub_backend.backend.frontends.http."""
