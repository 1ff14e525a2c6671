"""Ensemble graphs (backend/models/ensemble_config.py): validation texts, readiness of steps, load order."""

from __future__ import annotations

from pathlib import Path

import pytest

from pystub_backend.backend.config.model_config import ConfigError, normalize, parse_config_text
from pystub_backend.backend.models.ensemble_config import EnsembleGraph, composes, ensemble_dependencies, load_waves


def graph(steps: str, outputs: str = '{ name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }') -> EnsembleGraph:
    config = parse_config_text(f"""
        name: "ens" platform: "ensemble"
        input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {outputs} ]
        ensemble_scheduling {{ step [ {steps} ] }}""", "test")
    return EnsembleGraph.from_config(normalize(config, "ens"))


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int | None = None) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" {"" if version is None else f"model_version: {version}"} {maps} }}'


def test_a_valid_graph_and_the_steps_ready_in_turn():
    g = graph(",".join([step("a", {"IN": "X"}, {"OUT": "t"}, version=-1), step("b", {"IN": "t"}, {"OUT": "u"}, 2),
                        step("c", {"IN": "X"}, {"OUT": "v"}), step("d", {"A": "u", "B": "v"}, {"OUT": "Y"})]))
    assert [s.model_version for s in g.steps] == ["", "2", "", ""]  # -1 and unset mean the latest
    assert g.producer == {"t": 0, "u": 1, "v": 2, "Y": 3}
    assert [s.index for s in g.ready_steps({"X": 1}, set())] == [0, 2]
    assert [s.index for s in g.ready_steps({"X": 1, "t": 1}, {0, 2})] == [1]
    assert [s.index for s in g.ready_steps({"X": 1, "t": 1, "u": 1, "v": 1}, {0, 1, 2})] == [3]
    assert g.models == ["a", "b", "c", "d"]


@pytest.mark.parametrize("steps, text", [
    ("", "ensemble 'ens' must specify 'ensemble_scheduling' with at least one step"),
    (step("a", {"IN": "X"}, {"OUT": "X"}), "in ensemble 'ens', step 0 ('a') writes ensemble input 'X'"),
    (step("a", {"IN": "X"}, {"OUT": "Y"}) + "," + step("b", {"IN": "X"}, {"OUT": "Y"}),
     "in ensemble 'ens', ensemble tensor 'Y' is written by step 0 ('a') and step 1 ('b')"),
    (step("a", {"IN": "nowhere"}, {"OUT": "Y"}),
     "in ensemble 'ens', step 0 ('a') reads 'nowhere', which is neither an ensemble input nor written by a step"),
    (step("a", {"IN": "X"}, {"OUT": "Z"}), "in ensemble 'ens', ensemble output 'Y' is not written by any step"),
    (step("a", {"IN": "q"}, {"OUT": "p"}) + "," + step("b", {"IN": "p"}, {"OUT": "q"}) + ","
     + step("c", {"IN": "X"}, {"OUT": "Y"}),
     "in ensemble 'ens', the steps form a cycle: step 0 ('a'), step 1 ('b') wait for each other"),
    ('{ model_name: "a" output_map { key: "OUT" value: "Y" } }',
     "in ensemble 'ens', step 0 ('a') must map at least one input and one output"),
])
def test_invalid_graphs_are_refused_with_a_clear_text(steps: str, text: str):
    with pytest.raises(ConfigError) as info:
        graph(steps)
    assert str(info.value) == text


def write(root: Path, name: str, text: str) -> None:
    (root / name).mkdir()
    (root / name / "config.pbtxt").write_text(text)


def test_load_order_puts_composing_models_first(tmp_path: Path):
    write(tmp_path, "plain", 'backend: "python"')
    write(tmp_path, "inner", 'platform: "ensemble" ensemble_scheduling { step [ { model_name: "plain" } ] }')
    write(tmp_path, "outer", 'platform: "ensemble" ensemble_scheduling { step [ { model_name: "inner" }, '
                             '{ model_name: "absent" } ] }')
    found = {p.name: str(p) for p in tmp_path.iterdir()}
    assert ensemble_dependencies(found["outer"]) == ["inner", "absent"]
    assert ensemble_dependencies(found["plain"]) == [] and ensemble_dependencies(None) == []
    assert load_waves(["outer", "inner", "plain"], found) == [["plain"], ["inner"], ["outer"]]
    # Explicit mode: naming only the ensemble brings in what it composes (found ones only).
    assert load_waves(["outer"], found) == [["plain"], ["inner"], ["outer"]]
    write(tmp_path, "loop_a", 'platform: "ensemble" ensemble_scheduling { step [ { model_name: "loop_b" } ] }')
    write(tmp_path, "loop_b", 'platform: "ensemble" ensemble_scheduling { step [ { model_name: "loop_a" } ] }')
    found = {p.name: str(p) for p in tmp_path.iterdir()}
    assert load_waves(["loop_a", "plain"], found) == [["plain"], ["loop_a", "loop_b"]]


def test_composes_finds_the_ensembles_of_a_model():
    g = graph(step("a", {"IN": "X"}, {"OUT": "Y"}))

    class Version:
        graph = g

    assert composes([Version()], "a") and not composes([Version()], "b") and not composes([object()], "a")
