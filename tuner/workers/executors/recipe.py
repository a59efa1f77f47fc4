"""A picklable description of an evaluator, built where the trial runs (a Ray worker, a thread)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain import Engine, Evaluator


@dataclass(frozen=True)
class EvaluatorRecipe:
    """How to build an evaluator: the engine and its options, or an import path.

    ``Engine.VLLM``: ``VllmRunner(RunnerOptions(**options))``. ``Engine.SIMULATED``:
    ``SimulatedEngine(**options)``. ``factory="package.module:callable"`` builds ``callable(**options)``
    instead (a caller's own evaluator; ``engine`` then only labels failures the executor records).
    Options must be picklable: they travel to Ray workers.
    """

    engine: Engine
    options: Mapping[str, Any] = field(default_factory=dict)
    factory: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", Engine(self.engine))
        object.__setattr__(self, "options", dict(self.options))


def build_evaluator(recipe: EvaluatorRecipe, *, in_ray: bool = False) -> Evaluator:
    """Build the evaluator a recipe describes (imports lazily: vLLM runner or simulator only when used).

    ``in_ray`` tells the vLLM runner that Ray has already set the device visibility variables, so it
    must not apply physical GPU ids again.
    """
    options = dict(recipe.options)
    if recipe.factory:
        module_name, _, attr = recipe.factory.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        return target(**options)
    if recipe.engine is Engine.VLLM:
        from tuner.workers.options import RunnerOptions
        from tuner.workers.vllm_runner import VllmRunner

        if in_ray:
            options.setdefault("in_ray", True)
        for key in ("vllm_command", "extra_args"):
            if isinstance(options.get(key), list):
                options[key] = tuple(options[key])
        return VllmRunner(RunnerOptions(**options))
    if recipe.engine is Engine.SIMULATED:
        from tuner.workers.simulated import SimulatedEngine  # type: ignore[import-not-found]

        return SimulatedEngine(**options)
    raise ValueError(f"no evaluator for engine {recipe.engine}")
