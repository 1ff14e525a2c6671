"""In poll mode an edit of config.pbtxt that changes only the instances updates the model in place
on the next poll, as Triton 2.51 does; a change of the model's files reloads it.

The pair here serves a repository of its own (each test adds a copy of `instance_events` to it,
which the poll loads), so that polling does not load the tier's other models.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from calls import agree, both
from instance_events import ModelCopy, group
from oracle import Pair, running_pair

PYSTUB_VARIANTS_RUN = ("single-process",)
POLL_FLAGS = ("--model-control-mode=poll", "--repository-poll-secs=1")
_COPIES = itertools.count(1)


def _empty_repository(directory: Path) -> Path:
    repository = directory / "models"
    repository.mkdir(parents=True)
    return repository


@pytest.fixture(scope="module")
def _module_pair() -> Iterator[Pair]:
    """Overrides the conftest's pair: poll mode on a repository that starts empty."""
    with running_pair((), both_flags=POLL_FLAGS, repository=_empty_repository) as started:
        yield started


def observe(copy: ModelCopy, what: str, events: int) -> None:
    """The next poll's effect: `events` lifecycle events in all, the same on both servers."""
    copy.agree_on_events(f"after {what}", at_least=events)
    agree(*both(copy.pair, copy.groups_shown))
    agree(*both(copy.pair, copy.state))


def test_poll_follows_instance_only_edits_in_place(pair: Pair) -> None:
    copy = ModelCopy(pair, f"poll{next(_COPIES)}")
    observe(copy, "the copy was polled and loaded", 1)
    copy.write_config([group(2)])
    observe(copy, "count 2", 2)  # m_0_1 added, with the first load's config
    copy.write_config([group(1)])
    observe(copy, "count 1", 3)  # the oldest removed
    copy.write_config([group(1, "g"), group(1, "h")])
    observe(copy, "a group of the same settings added", 4)
    copy.touch("1/model.py")
    copy.write_config([group(1, "g"), group(2, "h")])
    observe(copy, "model.py changed with the count", 9)  # a full reload
    name = copy.name
    assert copy.agree_on_events() == sorted([
        ("init", f"{name}_0_0#1", "1"), ("init", f"{name}_0_1#1", "1"), ("fini", f"{name}_0_0#1"),
        ("init", "h_0#1", "1"),
        ("init", "g_0#1", "1,2"), ("init", "h_0#2", "1,2"), ("init", "h_1#1", "1,2"),
        ("fini", f"{name}_0_1#1"), ("fini", "h_0#1")])
