"""What a search concludes and what the service recommends."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain.results import Engine
from tuner.domain.serving import ModelRef, ServingConfig, serve_argv, serve_env
from tuner.domain.spec_config import SpecConfig


@dataclass(frozen=True)
class LevelWinner:
    level: str
    spec: SpecConfig
    speedup: float  # objective ratio vs the baseline at this level (>1 better)
    trial_number: int | None = None


@dataclass(frozen=True)
class Speedup:
    """Speedup over no speculation from repeated confirmation runs."""

    mean: float
    low: float
    high: float
    runs: int
    per_level: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SkippedCandidate:
    spec: SpecConfig
    predicted_speedup: float
    reason: str
    per_level: Mapping[str, float] = field(default_factory=dict)  # the predicted speedup at each level, if any


@dataclass(frozen=True)
class ConcurrencyRange:
    low: int
    high: int | None  # None: unbounded

    def contains(self, c: int) -> bool:
        return c >= self.low and (self.high is None or c <= self.high)


@dataclass(frozen=True)
class Recommendation:
    """A deployable answer with its evidence. ``spec.is_off`` means: do not speculate (said plainly)."""

    model: ModelRef
    hardware: str
    vllm_version: str | None
    engine: Engine
    serving: ServingConfig
    spec: SpecConfig
    concurrency: ConcurrencyRange
    speedup: Speedup | None
    acceptance_length: float | None
    latency: Mapping[str, Mapping[str, Any]]  # per level label: ttft/tpot/itl/e2e stats, throughput
    per_level_winners: tuple[LevelWinner, ...] = ()
    notes: tuple[str, ...] = ()
    job_id: str | None = None
    trial_numbers: tuple[int, ...] = ()
    workload_fingerprint: str | None = None
    workload_class: str | None = None

    def serve_args(self) -> list[str]:
        """The full ``vllm serve`` argv (without the executable) that deploys this recommendation: the
        arguments its trials were measured with (:func:`serve_argv`), without the runner's host and port."""
        return ["serve", *serve_argv(self.model, self.serving, self.spec)]

    def serve_env(self) -> dict[str, str]:
        """The environment its trials ran with beyond the worker's: the configuration's needs (an AITER drafter
        backend's ``VLLM_ROCM_USE_AITER=1``) under the job's serving env."""
        return serve_env(self.serving, self.spec)

    def deploy_command(self) -> str:
        """The same argv as one shell-quoted line (the JSON speculative config survives a paste into a shell),
        preceded by the environment it needs (``env NAME=value ...``)."""
        env = [f"{k}={v}" for k, v in sorted(self.serve_env().items())]
        return shlex.join([*(["env", *env] if env else []), "vllm", *self.serve_args()])


@dataclass(frozen=True)
class TuneOutcome:
    """What a search concludes: the static best, an optional per-batch-size schedule, and why.

    What to deploy is ``deployed``: ``schedule`` when there is one, else ``best``; ``speedup`` is always the
    speedup of ``deployed`` (never of ``best`` while a schedule is set), from its confirmation runs when they
    are complete (a note says "unconfirmed" otherwise).

    - ``best``: the best static config by the objective over all levels, or "off" when nothing beats the
      baseline beyond the measured noise; ``best_trial`` is its search trial.
    - ``schedule``: a ``num_speculative_tokens_per_batch_size`` schedule varying K for one method and draft
      (``best``'s; when ``best`` is off, the best speculative config's). Set only when its own confirmation
      runs are complete, beat the baseline beyond noise and average at least ``best``'s confirmed speedup;
      otherwise None, with a note saying why.
    """

    best: SpecConfig
    schedule: SpecConfig | None
    per_level_winners: tuple[LevelWinner, ...]
    speedup: Speedup | None
    baseline_trial: int | None
    best_trial: int | None
    confirm_trials: tuple[int, ...] = ()
    skipped: tuple[SkippedCandidate, ...] = ()
    notes: tuple[str, ...] = ()
    engine: Engine = Engine.SIMULATED
    noise: float = 0.03  # run-to-run spread the decisions used (measured from repeats where there were any)
    # Levels where the deployed config measured slower than off beyond noise (label -> its speedup there):
    # never the levels carrying most of the weight; the per-range answers give off there.
    deployed_losses: Mapping[str, float] = field(default_factory=dict)
    grid_size: int | None = None  # configurations in the searched space: what a grid search would launch

    @property
    def deployed(self) -> SpecConfig:
        """The config to deploy, the one ``speedup`` measures: the schedule if any, else the static best."""
        return self.schedule or self.best
