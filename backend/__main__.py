"""`python -m backend` is `pystub-backend`."""

from backend.cli import main

main()
