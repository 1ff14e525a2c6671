# ruff: noqa: E501  (one difference per line: the reasons are data, not code)
"""Every difference between Triton 2.51 and pystub that the tier found, by test id.

docs/triton-differences.md explains each and names where the behaviour lives in pystub_backend.
The tests assert agreement; conftest.py marks these ids xfail(strict=True) with the reason, so a
fix shows as XPASS(strict) and its entry must then be removed here and in the doc.
"""

KNOWN: dict[str, str] = {
    "test_endpoints.py::test_grpc_admin[trace_settings]":
        "Triton answers {\"settings\": {\"log_frequency\": {\"value\": [\"0\"]}, \"trace_count\": {\"value\": [\"-1\"]}, \"trace_file\": {\"value\": [\"\"]}, \"trace_level\": {\"value\": [\"OFF\"]}, \"trace_mode\": {\"value\": [\"triton\"]}, \"trace_rate\": {\"value\": [\"1000\"]}}}; pystub answers {\"error\": \"Method not implemented!\", \"status\": \"StatusCode.UNIMPLEMENTED\"}",
    "test_endpoints.py::test_server_extensions":
        "extensions: Triton also lists trace; pystub does not implement trace settings yet (another helper is adding them; cuda_shared_memory is a deliberate deviation the test leaves out)",
}
