"""What runners, evaluators and planners hand each other: a trial to run, its context, and the two
protocols (an evaluator runs one trial; a planner proposes trials and concludes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from tuner.domain.outcome import TuneOutcome
from tuner.domain.results import TrialResult
from tuner.domain.serving import ModelRef, ServingConfig
from tuner.domain.spec_config import SpecConfig
from tuner.domain.workload import SLO, LoadLevel, TrafficRequest


@dataclass(frozen=True)
class TrialSpec:
    """Everything needed to run one trial: one server configuration measured at every load level."""

    model: ModelRef
    spec: SpecConfig
    levels: tuple[LoadLevel, ...]
    requests: tuple[TrafficRequest, ...]
    serving: ServingConfig = field(default_factory=ServingConfig)
    slo: SLO = field(default_factory=SLO)
    hardware: str = "auto"
    gpu_ids: tuple[int, ...] | None = None  # None: let the platform (or Ray) decide
    correctness_prompts: int = 4  # first N requests replayed at temperature 0 for the gate
    reference_outputs: tuple[tuple[int, ...], ...] | None = None  # baseline token ids of that subset
    job_id: str | None = None
    number: int | None = None  # the trial's number within its job
    deadline_s: float | None = None  # whole-trial timeout

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "requests", tuple(self.requests))


class TrialStage(StrEnum):
    """Where a running trial is, as an evaluator reports it (``TrialContext.on_progress``)."""

    STARTING = "starting"  # the server was launched; waiting for it to answer
    READY = "ready"  # the server answers; ``TrialProgress.startup_s`` says how long it took
    MEASURING = "measuring"  # one load level: ``level`` of ``levels``
    CHECKING = "checking"  # the correctness gate's greedy outputs


@dataclass(frozen=True)
class TrialProgress:
    stage: TrialStage
    levels: int  # how many load levels the trial measures
    level: int | None = None  # 1-based, while measuring
    label: str | None = None  # the level's label, e.g. "c8"
    startup_s: float | None = None


@dataclass(frozen=True)
class TrialContext:
    """What a runner hands an evaluator beyond the spec: cancellation, process bookkeeping, progress.

    ``on_progress`` is told each stage as it begins; it must be cheap and must not raise (``tuner trial``
    draws it; a job's runner ignores it)."""

    is_cancelled: Callable[[], bool] = lambda: False
    on_process_started: Callable[[int], None] = lambda pgid: None  # store the pgid for recovery
    log_dir: str | None = None
    on_progress: Callable[[TrialProgress], None] = lambda progress: None


def throttled(fn: Callable[[], bool], every_s: float) -> Callable[[], bool]:
    """``fn`` called at most every ``every_s`` seconds; a True answer sticks. A runner's cancellation check
    (``TrialContext.is_cancelled``) may be a database query, and the replay loop asks it per request."""
    state = {"at": float("-inf"), "value": False}

    def check() -> bool:
        if state["value"]:
            return True
        now = time.monotonic()
        if now - state["at"] >= every_s:
            state["at"] = now
            state["value"] = bool(fn())
        return bool(state["value"])

    return check


@runtime_checkable
class Evaluator(Protocol):
    """Runs one trial. The real vLLM runner, the simulated engine or a caller's own callable."""

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult: ...


@dataclass(frozen=True)
class Reclaimed:
    """What ``TrialExecutor.reclaim`` found of a job's trials that a runner which is gone left running."""

    killed: tuple[int, ...] = ()  # process groups killed
    held: tuple[int, ...] = ()  # still held by a live runner (cut off, then fenced): it stops them itself
    unreachable: tuple[str, ...] = ()  # hosts or nodes that could not be asked; their runners' sweeps will


class TrialExecutor(Protocol):
    """Runs a job's trials on GPUs; the job runner codes against this and nothing else of an executor.

    ``free_slots(tp)`` is how many more trials of tensor-parallel size ``tp`` could start now. ``submit``
    returns at once with a future that resolves to exactly one ``TrialResult`` (a failure is a result, never
    an exception). ``reclaim(job_id)`` kills what trials of ``job_id`` left running wherever this executor
    reaches (this host's GPU leases, every node of a Ray cluster), except groups a live runner still holds;
    a runner taking over a job calls it before it runs anything. ``close`` cancels what still runs and
    releases the GPUs; it is idempotent. ``tuner.workers.executors`` holds the implementations and the
    contract's test suite.
    """

    def free_slots(self, tensor_parallel_size: int = 1) -> int: ...

    def submit(self, spec: TrialSpec, ctx: TrialContext) -> Future[TrialResult]: ...

    def reclaim(self, job_id: str) -> Reclaimed: ...

    def close(self) -> None: ...


class ExecutorKind(StrEnum):
    """Which ``TrialExecutor`` a worker runs its trials on (``TUNER_EXECUTOR``)."""

    LOCAL = "local"  # this host's GPUs, leased from the lease every worker on the host shares
    RAY = "ray"  # a Ray cluster's GPU nodes


class Purpose(StrEnum):
    """Why a trial runs: the baseline every speedup divides by, the search, or a confirmation on a fresh
    server of what the search concluded."""

    BASELINE = "baseline"
    SEARCH = "search"
    CONFIRM = "confirm"


@dataclass(frozen=True)
class Proposal:
    """The next trial a planner wants run. ``number`` is stable within the job (Optuna's trial number)."""

    number: int
    spec: SpecConfig
    purpose: Purpose = Purpose.SEARCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "purpose", Purpose(self.purpose))


class Planner(Protocol):
    """Ask/tell contract between the job runner and a search.

    ``ask`` returns the next proposal, or None when the search is done (budget spent, stopping rule met,
    confirmations measured). ``tell`` records a result exactly once per number. ``abandon`` marks a trial
    whose runner died as failed (never left running) and queues its configuration again. ``outcome`` is the
    conclusion so far (see ``TuneOutcome``): deploy ``outcome.deployed``, whose speedup is ``outcome.speedup``.
    """

    def ask(self) -> Proposal | None: ...

    def tell(self, number: int, result: TrialResult) -> None: ...

    def abandon(self, number: int, reason: str) -> None: ...

    def pending(self) -> list[Proposal]:
        """Proposals asked for and not yet told (after a runner died: its trials in flight)."""
        ...

    def outcome(self) -> TuneOutcome: ...
