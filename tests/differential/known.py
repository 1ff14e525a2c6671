# ruff: noqa: E501  (one difference per line: the reasons are data, not code)
"""Every difference between Triton 2.51 and pystub that the tier found, by test id.

docs/triton-differences.md explains each and names where the behaviour lives in pystub_backend.
The tests assert agreement; conftest.py marks these ids xfail(strict=True) with the reason, so a
fix shows as XPASS(strict) and its entry must then be removed here and in the doc.
"""

KNOWN: dict[str, str] = {
    "test_generate.py::test_generate_document[empty_into_batched_pairs]": "a batch of 0 ([0, 2]) to a batching model: Triton checks its bytes as for batch 1 (400 input byte size mismatch ... Expected 16, got 0); pystub's request validation refuses the batch size first (400 inference request batch-size must be >= 1)",
}
