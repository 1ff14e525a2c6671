"""The rate limiter on a real backend: instance-group `rate_limiter` resources with
`--rate-limit=execution_count`, measured by the spans (start, end) the model itself reports.

`span_probe` has two instances that each need one "R" while they execute. As on Triton 2.51
(measured with the same model and four concurrent 300 ms requests): with the rate limiter on and
no `--rate-limit-resource`, there is as much R as the largest single need (1), so the executes
never overlap; with `--rate-limit-resource=R:2`, or with the rate limiter off (the default, which
ignores the resources), they do; an instance that needs more than the flag declares fails to load
with Triton's text.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import Backend, make_repository

MODEL = "span_probe"
REQUESTS = 4
DELAY_MS = 300


def spans(backend: Backend, *models: str) -> list[tuple[float, float]]:
    """The (start, end) of each of REQUESTS concurrent executes (to `models` in turn), sorted by start."""
    models = models or (MODEL,)

    def one(index: int) -> tuple[float, float]:
        model = models[index % len(models)]
        client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)
        try:
            tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([DELAY_MS], np.int32))
            start, end = client.infer(model, [tensor]).as_numpy("SPAN").tolist()
            return start, end
        finally:
            client.close()

    with ThreadPoolExecutor(REQUESTS) as pool:
        return sorted(pool.map(one, range(REQUESTS)))


def overlaps(found: list[tuple[float, float]]) -> int:
    """How many executes started before the one before them ended."""
    return sum(1 for before, after in zip(found, found[1:], strict=False) if after[0] < before[1])


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    return make_repository(tmp_path, MODEL)


def test_one_resource_for_two_instances_never_overlaps(repository: Path) -> None:
    with Backend(repository, "--rate-limit=execution_count") as backend:
        found = spans(backend)
    assert overlaps(found) == 0, found
    # they all ran, one after the other: about REQUESTS x DELAY_MS in all
    assert found[-1][1] - found[0][0] >= REQUESTS * DELAY_MS / 1000 * 0.95, found


def test_declared_resource_of_one_is_honoured_too(repository: Path) -> None:
    with Backend(repository, "--rate-limit=execution_count", "--rate-limit-resource=R:1:0") as backend:
        assert overlaps(spans(backend)) == 0


def test_two_of_the_resource_let_both_instances_run(repository: Path) -> None:
    with Backend(repository, "--rate-limit=execution_count", "--rate-limit-resource=R:2") as backend:
        found = spans(backend)
    assert overlaps(found) >= 1, found


def test_without_the_rate_limiter_resources_are_ignored(repository: Path) -> None:
    with Backend(repository) as backend:
        found = spans(backend)
    assert overlaps(found) >= 1, found


def test_an_instance_needing_more_than_declared_fails_to_load(repository: Path) -> None:
    config = repository / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "R", count: 1', 'name: "R", count: 2'))
    with Backend(repository, "--rate-limit=execution_count", "--rate-limit-resource=R:1",
                 "--exit-on-error=false") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            row = next(r for r in client.get_model_repository_index() if r["name"] == MODEL)
        finally:
            client.close()
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] == ('Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
                             'model instances, the minimum required count is 2')


@pytest.mark.parametrize(("flag", "text"), [
    ("--rate-limit-resource=R", "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                                "'<resource_name>:<count>'. Got R"),
    ("--rate-limit-resource=R:x", "Invalid option value. Got x"),
    ("--rate-limit=sometimes", "invalid choice: 'sometimes'"),
])
def test_bad_flags_are_usage_errors(repository: Path, flag: str, text: str) -> None:
    backend = Backend(repository, flag, expect_exit=True).start()
    assert backend.wait_exit() == 2
    backend.stop(check=False)
    assert text in backend.log()


def test_resources_are_shared_by_every_model(tmp_path: Path) -> None:
    # As on Triton 2.51 (measured): two models of one instance each, both needing R, take turns.
    source = make_repository(tmp_path / "source", MODEL) / MODEL
    repository = tmp_path / "models"
    for name in ("span_a", "span_b"):
        shutil.copytree(source, repository / name)
        config = repository / name / "config.pbtxt"
        config.write_text(config.read_text().replace("count: 2, kind", "count: 1, kind"))
    with Backend(repository, "--rate-limit=execution_count") as backend:
        found = spans(backend, "span_a", "span_b")
    assert overlaps(found) == 0, found
