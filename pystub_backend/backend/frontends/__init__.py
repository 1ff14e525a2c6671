"""Protocol frontends: HTTP and gRPC listeners that translate the wire into `pystub_backend.backend.inference`."""
