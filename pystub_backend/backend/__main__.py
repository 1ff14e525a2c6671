"""`python -m pystub_backend.backend` is `pystub-backend`."""

from pystub_backend.backend.cli import main

main()
