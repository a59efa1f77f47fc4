"""What tuning costs: GPU-seconds per trial and per job, by purpose, beside what a grid would have cost.

A trial holds its GPUs from the server's start to its last level, so its GPU-seconds are its wall time (the
start-up included) times the GPUs its server takes: tensor x pipeline x data parallel. A CPU server holds no
GPU. A simulated trial's wall time is the simulated engine's, so its GPU-seconds are simulated too and are
labelled so wherever they are shown.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tuner.domain.contracts import Purpose
from tuner.domain.serving import ServingConfig

CPU_HARDWARE = "cpu"


def gpus_held(serving: ServingConfig, hardware: str | None) -> int:
    """GPUs one trial's server holds: none on a CPU host, else tensor x pipeline x data parallel."""
    if hardware == CPU_HARDWARE:
        return 0
    sizes = (serving.args.get(k, 1) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
    n = 1
    for size in sizes:
        n *= max(1, int(size))
    return n


def trial_gpu_seconds(duration_s: float | None, gpus: int) -> float | None:
    return None if duration_s is None else round(duration_s * gpus, 3)


@dataclass(frozen=True)
class TrialCost:
    purpose: Purpose
    duration_s: float | None  # wall time, start-up included
    gpu_seconds: float | None


@dataclass(frozen=True)
class TuningCost:
    """A job's cost. ``grid_gpu_seconds`` estimates a grid search of the same space (one trial per
    configuration at the median search trial's cost); None until the space's size is known."""

    gpu_seconds: float
    server_seconds: float  # wall time of every trial's server, GPU or not
    trials: int
    by_purpose: Mapping[str, float] = field(default_factory=dict)  # GPU-seconds per Purpose value
    grid_trials: int | None = None
    grid_gpu_seconds: float | None = None
    simulated: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


def tuning_cost(trials: Iterable[TrialCost], *, grid_trials: int | None, simulated: bool) -> TuningCost:
    """Sum the finished trials' costs; trials still running (no duration yet) count once they end."""
    done = [t for t in trials if t.duration_s is not None]
    by_purpose: dict[str, float] = {}
    for t in done:
        by_purpose[t.purpose.value] = round(by_purpose.get(t.purpose.value, 0.0) + (t.gpu_seconds or 0.0), 3)
    search = [t.gpu_seconds or 0.0 for t in done if t.purpose is not Purpose.CONFIRM]
    grid = round(statistics.median(search) * grid_trials, 3) if grid_trials and search else None
    return TuningCost(
        gpu_seconds=round(sum(t.gpu_seconds or 0.0 for t in done), 3),
        server_seconds=round(sum(t.duration_s or 0.0 for t in done), 3),
        trials=len(done),
        by_purpose=by_purpose,
        grid_trials=grid_trials,
        grid_gpu_seconds=grid,
        simulated=simulated,
    )
