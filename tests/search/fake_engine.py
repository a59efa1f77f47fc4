"""A tiny analytic evaluator for planner tests: Leviathan's gain with per-level costs, full control over
failures, divergence and latency, and vLLM-shaped counters (fixed-length drafters)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    LatencyStats,
    LevelResult,
    LoadLevel,
    Method,
    SpecConfig,
    SpecDecodeStats,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
)

OUT = 128


@dataclass
class FakeEngine:
    acceptance: Mapping[Method, float] = field(default_factory=lambda: {Method.EAGLE3: 0.8, Method.NGRAM: 0.6})
    cost: Mapping[Method, float] = field(default_factory=lambda: {Method.EAGLE3: 0.05, Method.NGRAM: 0.01})
    per_c_cost: float = 0.004  # verify cost per draft token per request in flight
    fail: Callable[[SpecConfig], FailureClass | None] = lambda spec: None
    diverge: frozenset[Method] = frozenset()
    p99_tpot: Callable[[SpecConfig, LoadLevel, float], float] | None = None
    schedule_factor: float = 1.0  # throughput factor of a per-batch-size schedule (a cost the model misses)
    calls: list[SpecConfig] = field(default_factory=list)

    def speedup(self, spec: SpecConfig, level: LoadLevel) -> float:
        if spec.is_off:
            return 1.0
        k = spec.k_at(int(level.value))
        a = self.acceptance[spec.method]
        tau = (1 - a ** (k + 1)) / (1 - a)
        cost = 1 + 0.0644 + 0.0008 * level.value + k * (self.cost[spec.method] + self.per_c_cost * level.value)
        return tau / cost * (self.schedule_factor if spec.schedule else 1.0)

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        self.calls.append(spec.spec)
        cfg = spec.spec
        cls = self.fail(cfg)
        if cls is not None:
            return TrialResult(TrialStatus.FAILED, Engine.SIMULATED, spec=cfg, failure=Failure(cls, cls.value))
        levels = []
        for level in spec.levels:
            c = level.value
            base = c * 1000.0 / (10.0 * (1 + c / 32))
            thr = base * self.speedup(cfg, level)
            tpot = c * 1000.0 / thr
            p99 = self.p99_tpot(cfg, level, tpot) if self.p99_tpot else 1.5 * tpot
            levels.append(
                LevelResult(
                    level=level,
                    num_requests=level.num_requests,
                    output_tokens=level.num_requests * OUT,
                    output_throughput=thr,
                    request_throughput=thr / OUT,
                    goodput=thr / OUT,
                    ttft_ms=LatencyStats(tpot, tpot, tpot, tpot),
                    tpot_ms=LatencyStats(tpot, tpot, tpot, p99),
                    e2e_ms=LatencyStats(OUT * tpot, OUT * tpot, OUT * tpot, OUT * tpot),
                    spec_decode=self._counters(cfg, level),
                )
            )
        status = TrialStatus.DIVERGED if cfg.method in self.diverge else TrialStatus.SUCCEEDED
        return TrialResult(status, Engine.SIMULATED, spec=cfg, levels=tuple(levels), reference_outputs=((1, 2),))

    def _counters(self, cfg: SpecConfig, level: LoadLevel) -> SpecDecodeStats | None:
        if cfg.is_off:
            return None
        k = cfg.k_at(int(level.value))
        a = self.acceptance[cfg.method]
        drafts = 10_000
        per = tuple(round(drafts * a ** (i + 1)) for i in range(k))
        return SpecDecodeStats(drafts, drafts * k, sum(per), per, cfg.num_speculative_tokens, drafts)


def levels(*cs: int) -> tuple[LoadLevel, ...]:
    return tuple(LoadLevel(value=float(c), num_requests=max(16, 2 * c)) for c in cs)
