"""An ensemble's data-flow graph, read from `platform: "ensemble"` + `ensemble_scheduling { step [...] }`.

    step { model_name: "pre"  input_map  { key: "<pre's input>"   value: "<ensemble tensor>" }
                              output_map { key: "<pre's output>"  value: "<ensemble tensor>" } }

Ensemble tensors are the ensemble's inputs and outputs and any intermediate name. The graph is
valid when every tensor a step reads is an ensemble input or written by a step, every tensor is
written by at most one step and never over an ensemble input, every ensemble output is written,
and the steps form no cycle. Checked at load, before any request (`EnsembleGraph.from_config`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.config.model_config import ConfigError, ModelConfig, load_config_file

__all__ = ["EnsembleStep", "EnsembleGraph", "is_ensemble", "ENSEMBLE_PLATFORM", "ensemble_dependencies",
           "ensemble_graph_models", "load_waves", "composes"]

ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


@dataclass(frozen=True)
class EnsembleStep:
    index: int
    model_name: str
    model_version: str  # "" for the latest (-1, or 0 when unset, in the config)
    input_map: dict[str, str]  # step input name -> ensemble tensor
    output_map: dict[str, str]  # step output name -> ensemble tensor

    @property
    def reads(self) -> set[str]:
        return set(self.input_map.values())

    @property
    def label(self) -> str:
        return f"step {self.index} ('{self.model_name}')"


@dataclass
class EnsembleGraph:
    name: str
    inputs: list[str]
    outputs: list[str]
    steps: list[EnsembleStep]
    producer: dict[str, int] = field(default_factory=dict)  # ensemble tensor -> the step writing it

    @classmethod
    def from_config(cls, config: ModelConfig) -> EnsembleGraph:
        """The graph of a normalized ensemble config. Raises ConfigError naming what is wrong."""
        name = config.name
        if not config.HasField("ensemble_scheduling") or not config.ensemble_scheduling.step:
            raise ConfigError(f"ensemble '{name}' must specify 'ensemble_scheduling' with at least one step")
        steps = [EnsembleStep(index, step.model_name, "" if step.model_version <= 0 else str(step.model_version),
                              dict(step.input_map), dict(step.output_map))
                 for index, step in enumerate(config.ensemble_scheduling.step)]
        graph = cls(name, [t.name for t in config.input], [t.name for t in config.output], steps)
        graph._validate()
        return graph

    def _validate(self) -> None:
        where = f"in ensemble '{self.name}'"
        for step in self.steps:
            if not step.model_name:
                raise ConfigError(f"{where}, step {step.index} must specify 'model_name'")
            if not step.input_map or not step.output_map:
                raise ConfigError(f"{where}, {step.label} must map at least one input and one output")
            for tensor in step.output_map.values():
                if tensor in self.inputs:
                    raise ConfigError(f"{where}, {step.label} writes ensemble input '{tensor}'")
                if tensor in self.producer:
                    raise ConfigError(f"{where}, ensemble tensor '{tensor}' is written by "
                                      f"{self.steps[self.producer[tensor]].label} and {step.label}")
                self.producer[tensor] = step.index
        known = set(self.inputs) | set(self.producer)
        for step in self.steps:
            for tensor in sorted(step.reads - known):
                raise ConfigError(f"{where}, {step.label} reads '{tensor}', which is neither an ensemble input "
                                  f"nor written by a step")
        for tensor in self.outputs:
            if tensor not in self.producer:
                raise ConfigError(f"{where}, ensemble output '{tensor}' is not written by any step")
        self._check_acyclic(where)

    def _check_acyclic(self, where: str) -> None:
        available = set(self.inputs)
        remaining = list(self.steps)
        while remaining:
            runnable = [step for step in remaining if step.reads <= available]
            if not runnable:
                names = ", ".join(step.label for step in remaining)
                raise ConfigError(f"{where}, the steps form a cycle: {names} wait for each other")
            for step in runnable:
                available.update(step.output_map.values())
                remaining.remove(step)

    def ready_steps(self, available: Collection[str], started: Collection[int]) -> list[EnsembleStep]:
        """Steps not started yet whose every input is available."""
        return [step for step in self.steps
                if step.index not in started and all(tensor in available for tensor in step.reads)]

    @property
    def models(self) -> list[str]:
        """The composing models, once each, in step order."""
        return list(dict.fromkeys(step.model_name for step in self.steps))


def ensemble_dependencies(model_dir: str | None) -> list[str]:
    """The composing models of the ensemble in `model_dir` ([] for anything else, or an unreadable
    config: its load reports that). Used to load dependencies before the ensemble."""
    if model_dir is None:
        return []
    path = os.path.join(model_dir, "config.pbtxt")
    try:
        config = load_config_file(path)
    except (OSError, ConfigError):
        return []
    return ensemble_graph_models(config)


def describe(graph: EnsembleGraph) -> str:
    """A one-line JSON picture of the graph (logs)."""
    return json.dumps([{"model": s.model_name, "in": s.input_map, "out": s.output_map} for s in graph.steps])


def load_waves(names: list[str], found: dict[str, str]) -> list[list[str]]:
    """`names`, plus the composing models of the ensembles among them (found in the repositories),
    grouped in the order they must load: plain models first, then each ensemble once what it
    composes has loaded. Names in a dependency cycle come last (their load reports it)."""
    dependencies: dict[str, list[str]] = {}
    pending = list(dict.fromkeys(names))
    while pending:
        name = pending.pop(0)
        if name in dependencies:
            continue
        dependencies[name] = ensemble_dependencies(found.get(name))
        pending.extend(d for d in dependencies[name] if d in found and d not in dependencies)
    waves: list[list[str]] = []
    placed: set[str] = set()
    remaining = list(dependencies)
    while remaining:
        wave = [n for n in remaining if all(d in placed or d not in dependencies for d in dependencies[n])]
        if not wave:
            wave = remaining
        waves.append(wave)
        placed.update(wave)
        remaining = [n for n in remaining if n not in placed]
    return waves


def ensemble_graph_models(config: ModelConfig) -> list[str]:
    """The composing models of an ensemble config ([] for any other config)."""
    if not is_ensemble(config):
        return []
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step if step.model_name))


def composes(versions: Iterable[Any], model: str) -> bool:
    """Whether any of these loaded versions is an ensemble with a step on `model`."""
    return any(getattr(version, "graph", None) is not None and model in version.graph.models for version in versions)
