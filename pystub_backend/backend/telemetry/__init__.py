"""pystub_backend.backend.telemetry."""
