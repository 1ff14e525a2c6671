"""Protocol frontends: HTTP and gRPC listeners that translate the wire into `backend.inference`."""
