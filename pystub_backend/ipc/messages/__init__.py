"""pystub_backend.ipc.messages."""
