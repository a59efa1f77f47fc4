"""Request and response bodies. Unknown fields are refused (422 naming them); values become domain objects."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.domain import (
    SERVING_ARG_TYPES,
    SLO,
    Budget,
    Engine,
    LoadKind,
    LoadLevel,
    Method,
    Objective,
    ServingConfig,
    argv_value_problem,
    env_name_problem,
)
from tuner.load_levels import window_requests

PositiveMs = Annotated[float, Field(gt=0, le=3_600_000)]
# Text that may reach SQL or a log line: no control characters (PostgreSQL refuses NUL in text outright).
PLAIN = r"^[^\x00-\x1f\x7f]*$"
# Ids are ours (uuid4 hex): anything else is malformed, answered before a query runs.
ID_PATTERN = r"^[0-9a-f]{32}$"
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="A job id, as POST /tune returned it")]
SampleId = Annotated[str, Path(pattern=ID_PATTERN, description="A sample id, as POST /traffic returned it")]
Depth = Annotated[int, Field(ge=1, le=32)]
MAX_DRAFTS = 8  # draft checkpoints per method: each is at least one server start


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SLOIn(Strict):
    p99_ttft_ms: PositiveMs | None = None
    p99_tpot_ms: PositiveMs | None = None
    p99_itl_ms: PositiveMs | None = None
    p99_e2e_ms: PositiveMs | None = None

    def to_domain(self) -> SLO:
        return SLO(**self.model_dump())


class BudgetIn(Strict):
    max_trials: int = Field(default=12, ge=1, le=500, description="Search trials (confirmation runs come on top).")
    max_wall_s: float | None = Field(default=None, gt=0, le=7 * 86400)

    def to_domain(self) -> Budget:
        return Budget(**self.model_dump())


SearchBackends = Literal["search"]
BackendName = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")]  # an AttentionBackendEnum member


class SearchIn(Strict):
    methods: list[Method] | None = Field(
        default=None, min_length=1, max_length=len(Method), description="Restrict the search to these."
    )
    depth_range: tuple[Depth, Depth] | None = Field(
        default=None, description="Inclusive [min, max] speculative depth (min <= max)."
    )
    drafts: dict[Method, Annotated[list[str], Field(max_length=MAX_DRAFTS)]] = Field(
        default_factory=dict, description="Draft checkpoints per method."
    )
    compat_overrides: dict[Method, bool] = Field(
        default_factory=dict,
        description="Override the hardware/vLLM compatibility table (tuner/search/compat.py) for this job: "
        "true runs a method the table excludes, false excludes one it allows.",
    )

    attention_backends: SearchBackends | dict[Method, BackendName] | None = Field(
        default=None,
        description="AMD chips: the drafters' attention backend (speculative_config.attention_backend). "
        '"search" tries each ROCm backend the compat table lists for the chip beside vLLM\'s default and '
        "drops one whose acceptance collapses (below 60% of another backend's); a mapping pins one per "
        'method, e.g. {"eagle3": "ROCM_AITER_UNIFIED_ATTN"}. AITER backends run with '
        "VLLM_ROCM_USE_AITER=1; set it in serving.env to keep the target's kernels the same across arms.",
    )

    @field_validator("depth_range")
    @classmethod
    def _range(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and not (1 <= v[0] <= v[1] <= 32):
            raise ValueError("depth_range must satisfy 1 <= min <= max <= 32")
        return v

    @field_validator("attention_backends")
    @classmethod
    def _backends(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for method in v:
                if not method.takes_draft_checkpoint:
                    raise ValueError(f"method {method.value} has no drafter to put on a backend")
        return v

    @field_validator("drafts")
    @classmethod
    def _drafts(cls, v: dict[Method, list[str]]) -> dict[Method, list[str]]:
        for method, paths in v.items():
            if not method.takes_draft_checkpoint:
                raise ValueError(f"method {method.value} takes no draft checkpoint")
            if any(not p or len(p) > 500 for p in paths):
                raise ValueError("draft checkpoints must be non-empty HF ids or paths")
            for p in paths:
                if (problem := argv_value_problem(p)) is not None:
                    raise ValueError(f"draft checkpoint {p[:60]!r} {problem}")
        return v


class ServingIn(Strict):
    """The production serving configuration the trials reproduce (allowlisted; see GET /docs)."""

    args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM serve arguments, snake_case, from the allowlist: " + ", ".join(sorted(SERVING_ARG_TYPES)),
    )
    env: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Environment such as VLLM_ROCM_USE_AITER=1."
    )

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in v.items():
            key = name.lstrip("-").replace("-", "_")
            typ = SERVING_ARG_TYPES.get(key)
            if typ is None:
                raise ValueError(f"'{name}' is not an allowed vLLM argument")
            ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                ok, value = True, float(value)
            if not ok:
                raise ValueError(f"'{name}' must be of type {typ.__name__}")
            if isinstance(value, str) and (not value or len(value) > 2000):
                raise ValueError(f"'{name}' must be a non-empty string")
            if isinstance(value, str) and (problem := argv_value_problem(value)) is not None:
                raise ValueError(f"'{name}' {problem}")
            out[key] = value
        tp = out.get("tensor_parallel_size", 1)
        if not 1 <= tp <= 64:
            raise ValueError("tensor_parallel_size must be between 1 and 64")
        gmu = out.get("gpu_memory_utilization")
        if gmu is not None and not 0 < gmu <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        return out

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if (problem := env_name_problem(name)) is not None:
                raise ValueError(f"environment variable {name[:80]!r} {problem}")
            if "\x00" in value or len(value) > 4096:
                raise ValueError(f"environment variable {name!r}: the value must be at most 4096 characters, no NUL")
        return v

    def to_domain(self) -> ServingConfig:
        return ServingConfig(args=self.args, env=self.env)


class TuneIn(Strict):
    model: str = Field(min_length=1, max_length=500, description="HF model id, or a path that exists on the workers.")
    revision: str | None = Field(default=None, min_length=1, max_length=200)
    trust_remote_code: bool = False
    traffic: Annotated[str, Field(pattern=ID_PATTERN)] | Annotated[list[dict[str, Any]], Field(min_length=1)] = Field(
        description="The id of an uploaded sample (POST /traffic), or inline requests in any accepted format."
    )
    hardware: str = Field(default="auto", pattern=r"^[a-z0-9][a-z0-9_-]{0,49}$")
    engine: Engine = Engine.VLLM
    objective: Objective = Objective.THROUGHPUT
    slo: SLOIn = Field(default_factory=SLOIn)
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(default=None, min_length=1, max_length=16)
    request_rate: list[Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)]] | None = Field(
        default=None, min_length=1, max_length=16
    )
    timed_replay: bool = Field(default=False, description="Replay the sample's own arrival times.")
    num_requests: int = Field(default=32, ge=1, le=100_000, description="Measured requests per load level.")
    warmup_requests: int = Field(default=2, ge=0, le=1000)
    duration_s: float | None = Field(default=None, gt=0, le=86400)
    budget: BudgetIn = Field(default_factory=BudgetIn)
    search: SearchIn = Field(default_factory=SearchIn)
    serving: ServingIn = Field(default_factory=ServingIn)
    hf_config: dict[str, Any] | None = Field(default=None, description="The model's config.json, if not on workers.")
    confirm_runs: int | None = Field(
        default=None,
        ge=3,
        le=10,
        description="Most runs on fresh servers a close decision (winner vs baseline, schedule vs winner) gets, the "
        "search run included; clear decisions get none beyond it (at least 3).",
    )
    correctness_prompts: int = Field(default=4, ge=0, le=64)
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Optuna's and vLLM's seed (numpy's range).")
    level_weights: dict[Annotated[str, Field(max_length=40)], Annotated[float, Field(ge=0, le=1e6)]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="Each load level's share of production traffic, keyed by level ('c8', 'r2.5', or the bare "
        "concurrency '8'); the objective is the weighted geometric mean of per-level speedups. Default: equal.",
    )

    @field_validator("model", "revision")
    @classmethod
    def _argv_safe(cls, v: str | None) -> str | None:
        if v is not None and (problem := argv_value_problem(v)) is not None:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _one_load_kind(self) -> TuneIn:
        kinds = sum(x for x in (self.concurrency is not None, self.request_rate is not None, self.timed_replay))
        if kinds > 1:
            raise ValueError("give one of concurrency, request_rate or timed_replay")
        return self

    @field_validator("level_weights")
    @classmethod
    def _weights(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return None
        if sum(v.values()) <= 0:
            raise ValueError("level_weights must give at least one level a positive weight")
        return {(f"c{k}" if k.isdigit() else k): w for k, w in v.items()}

    def weights_for(self, levels: tuple[LoadLevel, ...]) -> dict[str, float] | None:
        """The weights keyed by the levels' labels; an unknown key is an error naming it."""
        if self.level_weights is None:
            return None
        labels = {lvl.label for lvl in levels}
        unknown = sorted(set(self.level_weights) - labels)
        if unknown:
            raise ValueError(
                f"level_weights names levels not measured: {', '.join(unknown)} (levels: {sorted(labels)})"
            )
        return dict(self.level_weights)

    def levels(self) -> tuple[LoadLevel, ...]:
        def level(kind: LoadKind, value: float, num_requests: int = self.num_requests) -> LoadLevel:
            return LoadLevel(
                kind,
                value,
                num_requests=num_requests,
                warmup_requests=self.warmup_requests,
                duration_s=self.duration_s,
            )

        if self.request_rate:
            return tuple(level(LoadKind.RATE, r) for r in sorted(set(self.request_rate)))
        if self.timed_replay:
            return (level(LoadKind.TIMESTAMPS, 0),)
        if self.concurrency:
            if "num_requests" in self.model_fields_set:  # the client's count, as given
                return tuple(level(LoadKind.CONCURRENCY, c) for c in sorted(set(self.concurrency)))
            # by default a window is several times its concurrency, so most of it is steady state
            return tuple(
                level(LoadKind.CONCURRENCY, c, window_requests(c, self.num_requests))
                for c in sorted(set(self.concurrency))
            )
        return ()


class CostOut(BaseModel):
    """GPU-seconds spent: each trial's wall time (start-up included) x the GPUs its server held (none on a
    CPU host); simulated jobs' are simulated seconds. ``grid_gpu_seconds`` estimates a grid of the same space."""

    gpu_seconds: float
    gpu_hours: float
    server_seconds: float
    trials: int
    by_purpose: dict[str, float]
    grid_trials: int | None
    grid_gpu_seconds: float | None
    simulated: bool


class JobOut(BaseModel):
    id: str
    status: str
    model: str
    revision: str | None
    hardware: str
    engine: str
    simulated: bool
    objective: str
    traffic_id: str
    progress: dict[str, Any] | None
    best: dict[str, Any] | None
    error: str | None
    cancel_requested: bool
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    links: dict[str, str]
    waiting_for: str | None = None  # why a queued job is not running yet, when we can tell
    cost: CostOut | None = None  # GET /tune/{id}: what its finished trials cost


class TrialOut(BaseModel):
    number: int
    purpose: str
    method: str
    speculative_config: dict[str, Any] | None
    status: str
    engine: str
    simulated: bool
    failure_class: str | None
    failure_reason: str | None
    log_path: str | None
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    gpu_seconds: float | None = None  # duration_s x the GPUs its server held
    phase: str | None = None  # a running trial's stage: starting, ready, measuring, checking
    level: str | None = None  # while measuring: "2 of 3 (c8)"
    result: dict[str, Any] | None


class TrafficOut(BaseModel):
    id: str
    name: str | None
    fingerprint: str
    workload_class: str
    request_count: int
    stats: dict[str, Any]
    prompts_deleted: bool
    created_at: datetime | None
    expires_at: datetime | None
