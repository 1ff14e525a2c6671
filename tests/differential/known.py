"""Every difference between Triton 2.51 and pystub that the tier found, by test id.

docs/triton-differences.md explains each and names where the behaviour lives in pystub_backend.
The tests assert agreement; conftest.py marks these ids xfail(strict=True) with the reason.
"""

KNOWN: dict[str, str] = {
}
