"""What a trial measures: latency and spec-decode statistics per level, failures, the correctness gate and
the trial's result."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tuner.domain.spec_config import SpecConfig
from tuner.domain.workload import LoadLevel


class Engine(StrEnum):
    VLLM = "vllm"
    SIMULATED = "simulated"


class TrialStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DIVERGED = "diverged"  # measured, but outputs disagree with the baseline: never recommended
    SKIPPED = "skipped"  # not launched (unsupported before start, dominated by prediction)
    CANCELLED = "cancelled"

    def is_finished(self) -> bool:
        return self not in {TrialStatus.QUEUED, TrialStatus.RUNNING}

    def has_figures(self) -> bool:
        return self in {TrialStatus.SUCCEEDED, TrialStatus.DIVERGED}


class FailureClass(StrEnum):
    STARTUP_TIMEOUT = "startup_timeout"
    OOM = "oom"
    UNSUPPORTED = "unsupported_config"
    CRASH = "crash"
    REQUEST_ERRORS = "request_errors"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INFRA = "infrastructure"  # the runner, node or Ray worker went away
    INTERNAL = "internal"  # a bug on our side


@dataclass(frozen=True)
class LatencyStats:
    """Milliseconds."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        if not values:
            return cls()
        return cls(
            mean=statistics.fmean(values),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
        )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, as numpy.percentile's default (what vllm bench reports)."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class SpecDecodeStats:
    """vLLM's spec-decode counters over one measured window (after minus before)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    num_speculative_tokens: int = 0  # k the server was configured with
    decode_steps: int | None = None  # steps with at least one decoding request, when known

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted / drafts (bonus token included)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        """Unconditional acceptance at each position: accepted_i / drafts (vLLM's figure)."""
        if not self.num_drafts:
            return ()
        return tuple(a / self.num_drafts for a in self.accepted_per_position)

    @property
    def conditional_per_position(self) -> tuple[float, ...]:
        """P(position i accepted | position i-1 accepted)."""
        out: list[float] = []
        prev = self.num_drafts
        for a in self.accepted_per_position:
            out.append(a / prev if prev else 0.0)
            prev = a
        return tuple(out)

    @property
    def mean_proposed_per_draft(self) -> float:
        """Draft tokens per counted draft: < k means short proposals (ngram/suffix) or a lower scheduled K."""
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def empty_step_fraction(self) -> float | None:
        """Share of decode steps that proposed nothing (variable-length proposers), when steps are known."""
        if not self.decode_steps:
            return None
        return max(0.0, 1.0 - self.num_drafts / self.decode_steps)


@dataclass(frozen=True)
class LevelResult:
    """Figures of one load level on one server."""

    level: LoadLevel
    num_requests: int = 0
    errors: int = 0
    duration_s: float = 0.0
    output_tokens: int = 0
    output_throughput: float = 0.0  # tokens/s
    request_throughput: float = 0.0  # requests/s
    goodput: float = 0.0  # requests meeting the SLOs per second
    ttft_ms: LatencyStats = field(default_factory=LatencyStats)
    tpot_ms: LatencyStats = field(default_factory=LatencyStats)
    itl_ms: LatencyStats = field(default_factory=LatencyStats)
    e2e_ms: LatencyStats = field(default_factory=LatencyStats)
    achieved_concurrency: float | None = None  # mean vllm:num_requests_running during the window
    below_target: bool = False  # achieved concurrency stayed under 90% of the target (judged on >= 3 samples)
    gauge_samples: int = 0  # /metrics samples behind achieved_concurrency, peak KV usage and max waiting
    client_concurrency: float | None = None  # requests in flight on the client side: sum(e2e) / window (Little)
    peak_kv_cache_usage: float | None = None
    max_waiting: float | None = None
    preemptions: int = 0
    generation_tokens: int | None = None  # vllm:generation_tokens over the window
    spec_decode: SpecDecodeStats | None = None
    # Steady state (closed loop): from the moment all `concurrency` slots were first filled to the last
    # request's send; ramp-up and drain lie outside it. Its share of the window and its own throughput.
    steady_share: float | None = None
    steady_output_throughput: float | None = None
    # The client could not keep up (its own health during the window): such a level decides nothing.
    client_bound: bool = False
    client_bound_reason: str | None = None
    client_processes: int = 1  # client processes that sent the window (more when one could not keep up)


@dataclass(frozen=True)
class Failure:
    cls: FailureClass
    reason: str
    log_tail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cls", FailureClass(self.cls))


@dataclass(frozen=True)
class RequestComparison:
    index: int
    common_prefix: int
    output_len: int
    reference_len: int
    identical: bool


@dataclass(frozen=True)
class CorrectnessReport:
    """Greedy outputs of a fixed prompt subset compared with the job's no-speculation outputs.

    ``not_gated`` says why no comparison ran (no reference outputs, an empty subset); a report with a reason
    there has no comparisons, and its ``passed`` only means "not failed": the trial was not checked.
    """

    comparisons: tuple[RequestComparison, ...] = ()
    threshold: float = 0.5
    passed: bool = True
    not_gated: str | None = None

    @property
    def gated(self) -> bool:
        return self.not_gated is None

    @property
    def median_prefix_fraction(self) -> float:
        if not self.comparisons:
            return 1.0
        return statistics.median(
            c.common_prefix / c.reference_len if c.reference_len else 1.0 for c in self.comparisons
        )

    @property
    def identical_fraction(self) -> float:
        if not self.comparisons:
            return 1.0
        return sum(c.identical for c in self.comparisons) / len(self.comparisons)


@dataclass(frozen=True)
class TrialResult:
    """The outcome of a trial: figures per level, or a classified failure, and where it ran."""

    status: TrialStatus
    engine: Engine
    spec: SpecConfig = field(default_factory=SpecConfig)
    levels: tuple[LevelResult, ...] = ()
    failure: Failure | None = None
    correctness: CorrectnessReport | None = None
    reference_outputs: tuple[tuple[int, ...], ...] | None = None  # this trial's greedy outputs (baseline)
    vllm_version: str | None = None
    hardware: str | None = None
    worker: str | None = None
    log_path: str | None = None
    pgid: int | None = None
    startup_s: float | None = None
    wall_s: float | None = None
    simulated: bool = False  # mirrors engine; kept explicit so no record can lose the label
    # Earlier attempts of this trial lost to the infrastructure (a Ray worker or node) and retried, oldest first.
    retried_failures: tuple[Failure, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TrialStatus(self.status))
        object.__setattr__(self, "engine", Engine(self.engine))
        object.__setattr__(self, "simulated", self.engine is Engine.SIMULATED)

    def level(self, label: str) -> LevelResult | None:
        return next((lr for lr in self.levels if lr.level.label == label), None)

    @property
    def recommendable(self) -> bool:
        return self.status is TrialStatus.SUCCEEDED
