"""The stored trials as the planner reads them: one record per Optuna trial, and each configuration's runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tuner.domain import FailureClass, Purpose, SpecConfig, TrialResult, TrialStatus

# Failure classes that say nothing about the configuration: the same config is queued again (at most twice).
RETRYABLE = {FailureClass.INFRA, FailureClass.CANCELLED}
MAX_RETRIES = 2
# close-call repeats in a search: this many times its number of levels (see policy._close_call)
MAX_SEARCH_REPEATS = 1
SEARCH = (Purpose.BASELINE, Purpose.SEARCH)


def central(values: Sequence[float]) -> float:
    """One figure from a config's runs: their mean, their median from three runs on (one slow run, a noisy
    neighbour or a throttle, must not decide)."""
    return statistics.median(values) if len(values) >= 3 else statistics.fmean(values)


def pending_keys(records: Iterable[Record]) -> set[str]:
    """The configs with a trial proposed or running and not yet reported."""
    return {r.spec.key() for r in records if r.pending and r.spec is not None}


@dataclass
class Record:
    """One stored Optuna trial as the planner sees it."""

    number: int
    state: str  # optuna TrialState name
    spec: SpecConfig | None
    purpose: Purpose
    result: TrialResult | None = None
    skipped: str | None = None  # never launched (fail-fast)
    abandoned: str | None = None
    retry_of: int | None = None
    # the per-level speedups predicted for this config when it was proposed (the prediction-error log)
    predicted: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self.purpose = Purpose(self.purpose)

    @property
    def pending(self) -> bool:
        return self.state in {"RUNNING", "WAITING"} and self.result is None and not self.skipped

    @property
    def measured(self) -> bool:
        return self.result is not None and self.result.status is TrialStatus.SUCCEEDED

    @property
    def launched(self) -> bool:
        """Counts against the trial budget: proposed and not a not-launched/infrastructure failure."""
        if self.skipped or self.abandoned or self.spec is None:
            return False
        if self.result is None:
            return self.pending
        if self.result.status is TrialStatus.SKIPPED:
            return False
        f = self.result.failure
        return not (f is not None and (f.cls is FailureClass.UNSUPPORTED or f.cls in RETRYABLE))


@dataclass
class ConfigStats:
    spec: SpecConfig
    numbers: list[int] = field(default_factory=list)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # per level, per run: metric / baseline
    violations: dict[str, list[float]] = field(default_factory=dict)
    diverged: bool = False

    def per_level(self) -> dict[str, float]:
        """Each level's ratio to the baseline, from its runs (``central``)."""
        return {label: central(v) for label, v in self.ratios.items() if v}

    @property
    def runs(self) -> int:
        return len(self.numbers)
