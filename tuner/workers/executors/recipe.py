"""A picklable description of an evaluator, built where the trial runs (a Ray worker, a thread)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain import Engine, Evaluator, TrialContext, TrialResult, TrialSpec
from tuner.workers.process_group import kill_process_group, start_gated


@dataclass(frozen=True)
class EvaluatorRecipe:
    """How to build an evaluator: the engine and its options, or an import path.

    ``Engine.VLLM``: ``VllmRunner(RunnerOptions(**options))``. ``Engine.SIMULATED``:
    ``SimulatedEngine(**options)``, wrapped in :class:`PacedEvaluator` when the options also hold
    ``pace_s`` > 0 or ``placeholder_process``. ``factory="package.module:callable"`` builds ``callable(**options)``
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
        from tuner.workers.simulated import SimulatedEngine

        pace_s = float(options.pop("pace_s", 0.0) or 0.0)
        placeholder = bool(options.pop("placeholder_process", False))
        engine: Evaluator = SimulatedEngine(**options)
        if pace_s > 0 or placeholder:
            return PacedEvaluator(engine, pace_s, placeholder_process=placeholder)
        return engine
    raise ValueError(f"no evaluator for engine {recipe.engine}")


class PacedEvaluator:
    """Makes each simulated trial take ``seconds`` of wall time (demos, recovery tests), honouring cancel.

    With ``placeholder_process`` it also holds a real process group for the trial's duration and reports it
    like a vLLM server's, so the recovery path (kill what a dead runner left) is exercised end to end.
    """

    def __init__(self, inner: Evaluator, seconds: float, *, placeholder_process: bool = False) -> None:
        self.engine = Engine(getattr(inner, "engine", Engine.SIMULATED))  # the label failures keep
        self.inner = inner
        self.seconds = seconds
        self.placeholder_process = placeholder_process

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        proc = None
        if self.placeholder_process:
            proc = start_gated(
                ["sleep", str(int(self.seconds) + 600)],
                on_started=ctx.on_process_started if ctx is not None else (lambda pgid: None),
            )
        try:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                if ctx is not None and ctx.is_cancelled():
                    break
                time.sleep(0.05)
            return self.inner(spec, ctx)
        finally:
            if proc is not None:
                kill_process_group(proc.pid, grace_s=2.0)
                proc.wait()
