"""pystub_backend.backend.frontends.grpc."""
