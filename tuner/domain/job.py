"""A tune job as the service accepts it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tuner.domain.methods import Method
from tuner.domain.results import Engine, TrialResult
from tuner.domain.serving import ModelRef, ServingConfig
from tuner.domain.workload import SLO, Budget, LoadLevel


class Objective(StrEnum):
    THROUGHPUT = "throughput"  # maximise output tokens/s
    TPOT = "tpot"  # minimise mean TPOT
    GOODPUT = "goodput"  # maximise requests/s meeting the SLOs


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_finished(self) -> bool:
        return self in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}


@dataclass(frozen=True)
class JobSpec:
    """A validated tune request. Tokens for gated models live on the workers, never here."""

    model: ModelRef
    traffic_id: str
    hardware: str = "auto"
    engine: Engine = Engine.VLLM
    objective: Objective = Objective.THROUGHPUT
    slo: SLO = field(default_factory=SLO)
    levels: tuple[LoadLevel, ...] = ()
    budget: Budget = field(default_factory=Budget)
    methods: tuple[Method, ...] | None = None  # restrict the search to these (off is always measured)
    depth_range: tuple[int, int] | None = None
    drafts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # method -> draft checkpoints
    serving: ServingConfig = field(default_factory=ServingConfig)
    model_config: Mapping[str, Any] | None = None  # a config.json supplied with the request
    confirm_runs: int = 3
    correctness_prompts: int = 4
    seed: int = 0
    level_weights: Mapping[str, float] | None = None  # level label -> share of production traffic
    compat_overrides: Mapping[str, bool] = field(default_factory=dict)  # method -> allow (True) / exclude
    # drafters' attention backends on AMD chips: "search", or method -> backend (pinned); None: vLLM's choice
    attention_backends: str | Mapping[str, str] | None = None


@dataclass(frozen=True)
class TrialProcess:
    """A process group a trial recorded (its vLLM server), and the runner (``name@host``) that started it."""

    job_id: str
    number: int
    pgid: int
    worker: str | None

    @property
    def host(self) -> str:
        return (self.worker or "").rpartition("@")[2]


@dataclass(frozen=True)
class Recovery:
    """What a runner taking over a job learns from the store (``tuner.runs.recover``)."""

    results: Mapping[int, TrialResult]  # finished trials and their stored results
    abandoned: tuple[tuple[int, str | None], ...]  # (number, runner) of trials that failed without a result
    left_running: tuple[TrialProcess, ...]  # process groups of the trials a dead runner left running
    known: tuple[int, ...]  # every trial number the store has
