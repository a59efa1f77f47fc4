"""The workload a trial replays: load levels, latency objectives, the budget and traffic requests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class LoadKind(StrEnum):
    CONCURRENCY = "concurrency"  # closed loop, N requests in flight
    RATE = "rate"  # open loop, Poisson arrivals at R req/s
    TIMESTAMPS = "timestamps"  # the sample's own arrival times


class TrafficFormat(StrEnum):
    COMPLETIONS = "completions"  # /v1/completions with a prompt string
    CHAT = "chat"  # /v1/chat/completions with messages


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
