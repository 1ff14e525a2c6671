"""pystub_backend.backend.models.instance_update (when a reload changes only the instances, and which
instances it keeps, adds and removes) and models.version_files (which files a version runs from).

The rules are Triton 2.51's, measured against it (tests/differential/test_instance_updates.py compares
the same updates end to end): a signature is an instance group without its name and count, plus the
device; each wanted instance takes the LAST current one of its signature; new ones are named by
their place in their group.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import normalize
from pystub_backend.backend.models.instance_update import (
    Wanted,
    only_instances_differ,
    plan,
    unique_name,
    wanted_instances,
)
from pystub_backend.backend.models.version_files import version_files

BASE = """
name: "m"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


def config(groups: str = "", extra: str = "") -> model_config_pb2.ModelConfig:
    parsed = text_format.Parse(f"{BASE}\ninstance_group [ {groups} ]\n{extra}" if groups else BASE + extra,
                               model_config_pb2.ModelConfig())
    return normalize(parsed, "m")


# -- which reloads change only the instances --------------------------------------------------------

@pytest.mark.parametrize(("old", "new"), [
    ('{ kind: KIND_CPU count: 2 }', '{ kind: KIND_CPU count: 3 }'),
    ('{ kind: KIND_CPU count: 2 }', '{ name: "g" kind: KIND_CPU count: 2 }, { name: "h" kind: KIND_CPU }'),
    ('{ kind: KIND_CPU count: 2 }', '{ kind: KIND_CPU count: 2 passive: true }'),
    ('{ kind: KIND_CPU count: 2 }', '{ kind: KIND_CPU count: 2 }'),
], ids=["count", "group_added", "group_setting", "equal"])
def test_configs_that_differ_in_their_instances_only(old: str, new: str) -> None:
    assert only_instances_differ(config(old), config(new))


def test_an_equivalent_spelling_of_a_default_is_no_difference() -> None:
    """Normalized, an explicit default is the default (Triton compares normalized configs too)."""
    assert only_instances_differ(config('{ kind: KIND_CPU }'),
                                 config('{ kind: KIND_CPU }', 'version_policy: { latest { num_versions: 1 } }'))


@pytest.mark.parametrize("extra", [
    'parameters { key: "X" value { string_value: "1" } }',
    "dynamic_batching { }",
    'model_transaction_policy { decoupled: true }',
], ids=["parameter", "scheduler", "decoupled"])
def test_any_other_difference_is_a_reload(extra: str) -> None:
    assert not only_instances_differ(config('{ kind: KIND_CPU count: 2 }'),
                                     config('{ kind: KIND_CPU count: 3 }', extra))


# -- signatures ---------------------------------------------------------------------------------------

def signatures(groups: str) -> list[tuple[str, object]]:
    return [(wanted.placement.name, wanted.signature) for wanted in wanted_instances(config(groups))]


def test_a_signature_leaves_out_the_name_and_the_count() -> None:
    (first, a), (_, b) = signatures('{ name: "g" kind: KIND_CPU count: 2 }')
    (other, c), = signatures('{ name: "h" kind: KIND_CPU count: 1 }')
    assert (first, other) == ("g_0", "h_0")
    assert a == b == c


@pytest.mark.parametrize("setting", ['passive: true', 'host_policy: "p"', 'profile: [ "p" ]',
                                     'rate_limiter { resources [ { name: "R" count: 1 } ] }'])
def test_every_other_group_setting_is_part_of_the_signature(setting: str) -> None:
    (_, plain), = signatures('{ kind: KIND_CPU }')
    (_, changed), = signatures(f'{{ kind: KIND_CPU {setting} }}')
    assert plain != changed


def test_a_gpu_group_has_one_signature_per_device() -> None:
    wanted = wanted_instances(normalize(text_format.Parse(
        f'{BASE}\ninstance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 0, 1 ] }} ]', model_config_pb2.ModelConfig()),
        "m", gpus=[0, 1]))
    assert [w.placement.name for w in wanted] == ["m_0_0", "m_0_0"]
    assert wanted[0].signature != wanted[1].signature


# -- the plan ---------------------------------------------------------------------------------------------

def current(names: list[str], groups: str = '{ kind: KIND_CPU }') -> list[tuple[str, object]]:
    (_, signature), = signatures(groups)
    return [(name, signature) for name in names]


def shown(order: list[object]) -> list[str]:
    return [f"new {entry.placement.name}" if isinstance(entry, Wanted) else str(entry) for entry in order]


def test_growing_keeps_every_instance_and_names_the_new_ones_by_their_place() -> None:
    grown = plan(current(["a", "b"]), wanted_instances(config('{ kind: KIND_CPU count: 3 }')))
    assert shown(grown.order) == ["b", "a", "new m_0_2"]  # each takes the LAST one of its signature
    assert grown.removed == []


def test_shrinking_removes_the_first_ones_of_the_list() -> None:
    """After a growth the list is [kept..., new...]: shrinking removes the oldest (Triton 2.51: a
    grow from 1 to 2 and back to 1 keeps the NEW instance)."""
    shrunk = plan(current(["old", "new"]), wanted_instances(config('{ kind: KIND_CPU count: 1 }')))
    assert (shown(shrunk.order), shrunk.removed) == (["new"], ["old"])


def test_a_new_instance_takes_its_place_name_even_when_a_kept_one_has_it() -> None:
    """Kept m_0_1 (the survivor of a shrink) and grown to 3: the new ones are m_0_1 and m_0_2, as
    Triton 2.51 names them (two instances called m_0_1)."""
    grown = plan(current(["m_0_1"]), wanted_instances(config('{ kind: KIND_CPU count: 3 }')))
    assert shown(grown.order) == ["m_0_1", "new m_0_1", "new m_0_2"]


def test_a_renamed_group_keeps_its_instances_and_their_names() -> None:
    renamed = plan(current(["m_0_0", "m_0_1"]), wanted_instances(config('{ name: "g" kind: KIND_CPU count: 2 }')))
    assert (shown(renamed.order), renamed.removed) == (["m_0_1", "m_0_0"], [])


def test_a_group_added_with_the_same_settings_shares_the_existing_instances() -> None:
    split = plan(current(["a", "b", "c"]), wanted_instances(config(
        '{ name: "g" kind: KIND_CPU count: 2 }, { name: "h" kind: KIND_CPU count: 2 }')))
    assert (shown(split.order), split.removed) == (["c", "b", "a", "new h_1"], [])


def test_a_group_whose_settings_changed_gets_new_instances() -> None:
    changed = plan(current(["a", "b"]), wanted_instances(config('{ kind: KIND_CPU count: 2 passive: true }')))
    assert (shown(changed.order), changed.removed) == (["new m_0_0", "new m_0_1"], ["a", "b"])
    assert [w.placement.name for w in changed.created] == ["m_0_0", "m_0_1"] and changed.kept == []


def test_removing_a_group_removes_its_instances_alone() -> None:
    (_, cpu), = signatures('{ kind: KIND_CPU }')
    (_, passive), = signatures('{ kind: KIND_CPU passive: true }')
    removed = plan([("g0", cpu), ("h0", passive)], wanted_instances(config('{ kind: KIND_CPU passive: true }')))
    assert (shown(removed.order), removed.removed) == (["h0"], ["g0"])


def test_unique_names_for_pystubs_own_views() -> None:
    assert unique_name("m_0_1", {"m_0_0"}) == "m_0_1"
    assert unique_name("m_0_1", {"m_0_1", "m_0_1.2"}) == "m_0_1.3"


# -- the files a version runs from ------------------------------------------------------------------------

def _touch(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _later(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_what_changes_a_versions_files(tmp_path: Path) -> None:
    for name in ("config.pbtxt", "1/model.py", "2/model.py", "helpers.py", "1/__pycache__/model.pyc"):
        _touch(tmp_path / name)
    before = version_files(str(tmp_path), [1, 2])
    _touch(tmp_path / "config.pbtxt", "changed")         # the config: compared on its own
    _touch(tmp_path / "1/__pycache__/model.pyc", "new")  # written by importing the model
    assert version_files(str(tmp_path), [1, 2]) == before
    _later(tmp_path / "2" / "model.py")                    # another version's file
    after = version_files(str(tmp_path), [1, 2])
    assert after[1] == before[1] and after[2] != before[2]
    _later(tmp_path / "helpers.py")                        # shared by every version
    assert all(version_files(str(tmp_path), [1, 2])[v] != after[v] for v in (1, 2))


def test_a_custom_config_is_left_out_too(tmp_path: Path) -> None:
    for name in ("config.pbtxt", "configs/small.pbtxt", "1/model.py"):
        _touch(tmp_path / name)
    before = version_files(str(tmp_path), [1], "small")
    _touch(tmp_path / "configs/small.pbtxt", "changed")
    assert version_files(str(tmp_path), [1], "small") == before
    _touch(tmp_path / "config.pbtxt", "changed")  # not the config this server reads: a model file
    assert version_files(str(tmp_path), [1], "small") != before
