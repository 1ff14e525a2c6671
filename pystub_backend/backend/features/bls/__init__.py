"""pystub_backend.backend.features.bls."""
