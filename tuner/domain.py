"""The domain model: what a tune job, a trial and a recommendation are.

Every other package (api, store, search, workers) depends on this module and on nothing of each other.
It imports only the standard library. Values are frozen dataclasses; JSON round trips go through
``to_dict`` / ``from_dict`` so the store and the API never hand-roll the shapes.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------
# Enums with behaviour
# --------------------------------------------------------------------------------------------------
class Method(StrEnum):
    """A speculative-decoding method as vLLM names it (``off`` = no speculative config at all)."""

    OFF = "off"
    NGRAM = "ngram"
    NGRAM_GPU = "ngram_gpu"
    SUFFIX = "suffix"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    DFLASH = "dflash"
    DSPARK = "dspark"
    MEDUSA = "medusa"

    @property
    def needs_draft_checkpoint(self) -> bool:
        """True when vLLM needs a separate ``model`` for the drafter (mtp/dspark use the target)."""
        return self in {Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.DFLASH, Method.MEDUSA}

    @property
    def is_chain_drafter(self) -> bool:
        """Fixed-length proposers: every step drafts exactly k tokens, so per-position rates are true."""
        return self in {Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.MTP}

    @property
    def is_variable_length(self) -> bool:
        """Proposers that may propose fewer than k tokens, or none (vLLM then counts no draft)."""
        return self in {Method.NGRAM, Method.NGRAM_GPU, Method.SUFFIX}

    @property
    def supports_batch_schedule(self) -> bool:
        """Methods on which vLLM's V1 runner honours ``num_speculative_tokens_per_batch_size``."""
        return self in {
            Method.NGRAM,
            Method.EAGLE,
            Method.EAGLE3,
            Method.MTP,
            Method.DRAFT_MODEL,
            Method.DFLASH,
        }


class Engine(StrEnum):
    VLLM = "vllm"
    SIMULATED = "simulated"


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


class LoadKind(StrEnum):
    CONCURRENCY = "concurrency"  # closed loop, N requests in flight
    RATE = "rate"  # open loop, Poisson arrivals at R req/s
    TIMESTAMPS = "timestamps"  # the sample's own arrival times


class TrafficFormat(StrEnum):
    COMPLETIONS = "completions"  # /v1/completions with a prompt string
    CHAT = "chat"  # /v1/chat/completions with messages


# --------------------------------------------------------------------------------------------------
# Serialisation helpers
# --------------------------------------------------------------------------------------------------
def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings to plain JSON values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"))


def fingerprint(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------
# What a trial runs
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecConfig:
    """One speculative-decoding configuration, convertible exactly to vLLM's ``--speculative-config``.

    ``schedule`` is vLLM's ``num_speculative_tokens_per_batch_size``: inclusive ``(start_bs, end_bs, K)``
    ranges starting at 1, K >= 0 and <= ``num_speculative_tokens``. ``extra`` carries any further
    speculative-config fields verbatim (``attention_backend``, ``suffix_decoding_*``, ...).
    """

    method: Method = Method.OFF
    num_speculative_tokens: int = 0
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    schedule: tuple[tuple[int, int, int], ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", Method(self.method))
        if self.schedule is not None:
            object.__setattr__(self, "schedule", tuple(tuple(int(x) for x in r) for r in self.schedule))
        object.__setattr__(self, "extra", dict(self.extra))

    @property
    def is_off(self) -> bool:
        return self.method is Method.OFF

    def to_vllm(self) -> dict[str, Any] | None:
        """The dict vLLM's ``--speculative-config`` takes, or None for no speculation."""
        if self.is_off:
            return None
        out: dict[str, Any] = {"method": self.method.value, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            out["model"] = self.model
        if self.prompt_lookup_min is not None:
            out["prompt_lookup_min"] = self.prompt_lookup_min
        if self.prompt_lookup_max is not None:
            out["prompt_lookup_max"] = self.prompt_lookup_max
        if self.schedule is not None:
            out["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.schedule]
        out.update(self.extra)
        return out

    @classmethod
    def from_vllm(cls, config: Mapping[str, Any] | None) -> SpecConfig:
        if not config:
            return cls()
        data = dict(config)
        known = {
            "method": Method(data.pop("method", "draft_model" if data.get("model") else "ngram")),
            "num_speculative_tokens": int(data.pop("num_speculative_tokens", 0)),
            "model": data.pop("model", None),
            "prompt_lookup_min": data.pop("prompt_lookup_min", None),
            "prompt_lookup_max": data.pop("prompt_lookup_max", None),
            "schedule": data.pop("num_speculative_tokens_per_batch_size", None),
        }
        return cls(**known, extra=data)

    def k_at(self, batch_size: int) -> int:
        """The depth vLLM uses at this number of scheduled requests (gaps and tail carry the previous K)."""
        if self.is_off:
            return 0
        if not self.schedule:
            return self.num_speculative_tokens
        k = self.num_speculative_tokens
        for start, _end, kk in sorted(self.schedule):
            if batch_size >= start:
                k = kk
        return min(k, self.num_speculative_tokens)

    def label(self) -> str:
        if self.is_off:
            return "off"
        parts = [f"{self.method.value} k={self.num_speculative_tokens}"]
        if self.model:
            parts.append(f"draft={self.model}")
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            parts.append(f"lookup={self.prompt_lookup_min}-{self.prompt_lookup_max}")
        if self.schedule:
            parts.append("schedule=" + ",".join(f"{a}-{b}:{k}" for a, b, k in self.schedule))
        return " ".join(parts)

    def key(self) -> str:
        return canonical_json(self.to_vllm())


@dataclass(frozen=True)
class ModelRef:
    """The target model: an HF id (with revision) or a path that exists on the workers."""

    name: str
    revision: str | None = None
    trust_remote_code: bool = False


class UnsafeArgument(ValueError):
    """A value that must not reach a command line (it could be read as an option, or carries control bytes)."""


def argv_value_problem(value: str) -> str | None:
    """Why ``value`` (a model, revision, draft checkpoint or string serving value) may not be put on a vLLM
    command line; None when it may. A leading ``-`` would make vLLM's parser read it as an option (``model:
    "--trust-remote-code"``); NUL and other control characters have no business in an id or a path."""
    if not value:
        return "must not be empty"
    if value.startswith("-"):
        return "must not start with '-' (it would be read as a command-line option)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "must not contain NUL or other control characters"
    return None


def check_argv_value(field: str, value: str) -> str:
    """``value`` unchanged, or :class:`UnsafeArgument` naming ``field``."""
    problem = argv_value_problem(value)
    if problem is not None:
        raise UnsafeArgument(f"{field} {problem}")
    return value


# vLLM serve arguments a job may set, with the Python type each takes. Anything else is refused so that a
# job cannot smuggle in flags that change what is measured (or --speculative-config itself).
SERVING_ARG_TYPES: dict[str, type] = {
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "max_model_len": int,
    "dtype": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "gpu_memory_utilization": float,
    "quantization": str,
    "kv_cache_dtype": str,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "enforce_eager": bool,
    "block_size": int,
    "attention_backend": str,
    "compilation_config": str,
    "seed": int,
    "swap_space": float,
    "load_format": str,
    "tokenizer": str,
}
# Environment variables a job may set, as exact names or prefixes ending in '*'.
SERVING_ENV_ALLOWED: tuple[str, ...] = (
    "VLLM_ROCM_USE_AITER*",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_TRITON_FLASH_ATTN",
    "VLLM_ROCM_CUSTOM_PAGED_ATTN",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "NCCL_*",
    "RCCL_*",
    "HSA_*",
    "PYTORCH_TUNABLEOP_*",
    "OMP_NUM_THREADS",
)


# Under the allowed prefixes, names that load a library or name a file to write or read are refused: a
# tuning job must not make a worker's vLLM dlopen a plugin or write over a file (HSA_TOOLS_LIB,
# NCCL_NET_PLUGIN, NCCL_DEBUG_FILE, ...).
_ENV_DENIED_SUFFIXES = ("_LIB", "_LIBS", "_PLUGIN", "_FILE", "_FILENAME", "_PATH", "_DIR", "_PREFIX")
# Path-taking variables that are useful to tune with: allowed, but their value is confined to the trial's
# own directory (only the file's base name is kept; see tuner.workers.environment).
SERVING_ENV_CONFINED_PATHS: tuple[str, ...] = ("PYTORCH_TUNABLEOP_FILENAME", "PYTORCH_TUNABLEOP_UNTUNED_FILENAME")


def env_name_problem(name: str) -> str | None:
    """Why a job may not set environment variable ``name``; None when it may."""
    if not name or "=" in name or any(ord(ch) < 32 for ch in name):  # NUL among the control characters
        return "is not a valid environment variable name"
    if name in SERVING_ENV_CONFINED_PATHS:
        return None
    if not any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in SERVING_ENV_ALLOWED):
        return "is not allowed (see SERVING_ENV_ALLOWED)"
    if name.endswith(_ENV_DENIED_SUFFIXES):
        return "is not allowed: it loads a library or names a file"
    return None


def env_name_allowed(name: str) -> bool:
    return env_name_problem(name) is None


@dataclass(frozen=True)
class ServingConfig:
    """The production serving configuration every trial of a job reproduces (allowlisted args and env)."""

    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", dict(sorted(self.args.items())))
        object.__setattr__(self, "env", dict(sorted(self.env.items())))

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.args.get("tensor_parallel_size", 1))

    def to_cli_args(self) -> list[str]:
        """vLLM CLI flags for these args (booleans as ``--flag`` / ``--no-flag``)."""
        out: list[str] = []
        for name, value in self.args.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, str):
                # "--flag=value": the parser takes what follows "=" as the value whatever it looks like
                out.append(f"{flag}={check_argv_value(name, value)}")
            else:
                out.extend([flag, str(value)])
        return out


def serve_argv(model: ModelRef, serving: ServingConfig, spec: SpecConfig) -> list[str]:
    """The one place a configuration becomes ``vllm serve`` arguments: what a trial measures and what a
    recommendation deploys (``vllm serve <these>``).

    The model comes first, as ``vllm serve`` takes it (positional); then revision, remote code, the serving
    args, and the speculative config as canonical JSON (sorted keys, no spaces). No speculative config means
    no flag at all: ``num_speculative_tokens: 0``, or K=0 in a schedule, is a configuration, not "off".
    Runners add only their runtime extras around this (host, port, platform flags).
    Strings from the job are checked (:func:`argv_value_problem`, :class:`UnsafeArgument`) and passed as
    ``--flag=value``; the model is positional in ``vllm serve``, so a leading ``-`` is refused outright.
    """
    argv = [check_argv_value("model", model.name)]
    if model.revision:
        argv.append(f"--revision={check_argv_value('revision', model.revision)}")
    if spec.model:
        check_argv_value("draft model", spec.model)  # inside the JSON config, but vLLM loads it as a model
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += serving.to_cli_args()
    config = spec.to_vllm()
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"), sort_keys=True)]
    return argv


@dataclass(frozen=True)
class LoadLevel:
    """One load level measured on a running server."""

    kind: LoadKind = LoadKind.CONCURRENCY
    value: float = 1.0  # concurrency N, or rate R req/s (ignored for TIMESTAMPS)
    num_requests: int = 32
    warmup_requests: int = 2
    duration_s: float | None = None  # if set, stop issuing requests after this many seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LoadKind(self.kind))

    @property
    def label(self) -> str:
        if self.kind is LoadKind.CONCURRENCY:
            return f"c{int(self.value)}"
        if self.kind is LoadKind.RATE:
            return f"r{self.value:g}"
        return "timed"

    @property
    def concurrency(self) -> int | None:
        return int(self.value) if self.kind is LoadKind.CONCURRENCY else None


@dataclass(frozen=True)
class SLO:
    """Latency objectives in milliseconds; None means unconstrained."""

    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    p99_e2e_ms: float | None = None

    def is_empty(self) -> bool:
        return all(v is None for v in asdict(self).values())


@dataclass(frozen=True)
class Budget:
    max_trials: int = 12
    max_wall_s: float | None = None


@dataclass(frozen=True)
class TrafficRequest:
    """One request of a traffic sample, in the format it arrived in."""

    format: TrafficFormat
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    output_tokens: int | None = None  # recorded output length, enforced with ignore_eos
    max_tokens: int | None = None  # a cap only
    temperature: float | None = None
    arrival_s: float | None = None  # offset from the sample's start, for timed replay

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", TrafficFormat(self.format))
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))

    @property
    def target_output_tokens(self) -> int:
        for v in (self.output_tokens, self.max_tokens):
            if v:
                return int(v)
        return 128

    def prompt_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())


# --------------------------------------------------------------------------------------------------
# What a trial measures
# --------------------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class TrialContext:
    """What a runner hands an evaluator beyond the spec: cancellation and process bookkeeping."""

    is_cancelled: Callable[[], bool] = lambda: False
    on_process_started: Callable[[int], None] = lambda pgid: None  # store the pgid for recovery
    log_dir: str | None = None


@runtime_checkable
class Evaluator(Protocol):
    """Runs one trial. The real vLLM runner, the simulated engine or a caller's own callable."""

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult: ...


# --------------------------------------------------------------------------------------------------
# What a search concludes and what we recommend
# --------------------------------------------------------------------------------------------------
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

    def deploy_command(self) -> str:
        """The same argv as one shell-quoted line (the JSON speculative config survives a paste into a shell)."""
        return shlex.join(["vllm", *self.serve_args()])


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

    @property
    def deployed(self) -> SpecConfig:
        """The config to deploy, the one ``speedup`` measures: the schedule if any, else the static best."""
        return self.schedule or self.best


@dataclass(frozen=True)
class Proposal:
    """The next trial a planner wants run. ``number`` is stable within the job (Optuna's trial number)."""

    number: int
    spec: SpecConfig
    purpose: str = "search"  # "baseline" | "search" | "confirm"


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


# --------------------------------------------------------------------------------------------------
# JSON round trip for the dataclasses above
# --------------------------------------------------------------------------------------------------
_NESTED: dict[type, dict[str, Any]] = {}


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild a domain dataclass from ``to_jsonable`` output (nested dataclasses, tuples, enums)."""
    import typing

    if data is None:
        return None  # type: ignore[return-value]
    hints = _NESTED.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _NESTED[cls] = hints
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        kwargs[f.name] = _coerce(hints[f.name], data[f.name])
    return cls(**kwargs)


def _coerce(tp: Any, value: Any) -> Any:
    import types
    import typing

    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            return _coerce(arg, value)
    if isinstance(tp, type) and is_dataclass(tp):
        return from_jsonable(tp, value)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        return tuple(_coerce(a, v) for a, v in zip(args, value, strict=False))
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return tp(value)
    return value


# --------------------------------------------------------------------------------------------------
# A tune job as the service accepts it
# --------------------------------------------------------------------------------------------------
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
