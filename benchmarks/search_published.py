"""A table-driven evaluator frozen from published measurements (docs/published-figures.md).

Each arm carries the speedups a paper or blog measured at one depth ``k_ref`` across batch sizes, and a
conditional acceptance per position taken from the acceptance table. Other depths follow Leviathan et al.'s
analytic model (arXiv 2211.17192: gain = tau(k) / (1 + k c)), with the per-level cost ratio c solved from the
published speedup at ``k_ref``: c = (tau(k_ref) / s_ref - 1) / k_ref. Nothing here comes from the simulated
engine's formulas. Measurement noise is one speed factor per level and call, ``1 + noise x N(0, 1)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.bench_trials import counters, level_result, level_rng, succeeded
from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    LoadLevel,
    Method,
    SpecConfig,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
)

_OUT_TOKENS = 256


@dataclass(frozen=True)
class PublishedArm:
    method: Method
    k_ref: int
    speedup: Mapping[int, float]  # batch size -> published speedup at k_ref
    acceptance: tuple[float, ...]  # conditional acceptance per position, given a proposal
    proposal_rate: float = 1.0  # P(a step proposes), below 1 for ngram
    draft: str | None = None
    source: str = ""
    adaptive: bool = False  # measured with vLLM's adaptive verification (its own arm)

    def tau(self, k: int) -> float:
        surv, total = 1.0, 0.0
        for i in range(k):
            surv *= self.acceptance[min(i, len(self.acceptance) - 1)]
            total += surv
        return 1.0 + self.proposal_rate * total

    def cost_ratio(self, c: int) -> float:
        xs = sorted(self.speedup)
        if c in self.speedup:
            s = self.speedup[c]
        else:  # log-linear interpolation between published batch sizes, flat outside
            lo = max([x for x in xs if x <= c], default=xs[0])
            hi = min([x for x in xs if x >= c], default=xs[-1])
            t = 0.0 if hi == lo else (math.log(c) - math.log(lo)) / (math.log(hi) - math.log(lo))
            s = self.speedup[lo] ** (1 - t) * self.speedup[hi] ** t
        return max(0.0, (self.tau(self.k_ref) / s - 1.0) / self.k_ref)

    def gain(self, k: int, c: int) -> float:
        return self.tau(k) / (1.0 + k * self.cost_ratio(c))


@dataclass
class PublishedEngine:
    """An Evaluator whose truth is the published table (``expected_speedup`` is noise free)."""

    arms: Sequence[PublishedArm]
    noise: float = 0.03
    seed: int = 0
    base_step_ms: float = 8.0
    _calls: itertools.count = field(default_factory=itertools.count)

    def arm(self, spec: SpecConfig) -> PublishedArm | None:
        return next(
            (a for a in self.arms if (a.method, a.draft, a.adaptive) == (spec.method, spec.model, spec.adaptive)), None
        )

    def expected_speedup(self, spec: SpecConfig, level: LoadLevel) -> float:
        if spec.is_off:
            return 1.0
        arm = self.arm(spec)
        c = int(level.value)
        return arm.gain(spec.k_at(c), c) if arm is not None else 0.0

    def _base_tps(self, c: int) -> float:
        return c * 1000.0 / (self.base_step_ms * (1.0 + c / 48.0))

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        call = next(self._calls)
        cfg = spec.spec
        if not cfg.is_off and self.arm(cfg) is None:
            failure = Failure(FailureClass.UNSUPPORTED, f"no published figures for {cfg.label()}")
            return TrialResult(TrialStatus.FAILED, Engine.SIMULATED, spec=cfg, failure=failure)
        levels = []
        for level in spec.levels:
            rng = level_rng(self.seed, cfg, level, call)
            speed = max(0.5, 1.0 + self.noise * rng.gauss(0.0, 1.0))
            c = int(level.value)
            tpot = c * 1000.0 / (self._base_tps(c) * self.expected_speedup(cfg, level) * speed)
            sd = counters(cfg, c, level.num_requests * _OUT_TOKENS, rng, self.arm(cfg), jitter=0.02)
            # a table has no prefill: the first token costs one step, and tokens arrive one per TPOT
            levels.append(level_result(level, ttft=tpot, tpot=tpot, tau=1.0, out_tokens=_OUT_TOKENS, spec_decode=sd))
        return succeeded(cfg, levels, "published")


# Acceptance per position: EAGLE-3 roughly flat after a_1 ~0.8; EAGLE-1 lower and decaying; MTP one head
# reused 0.88 x0.8 per position; ngram 0.6 match rate, 0.85 given a match (spec-decode-figures.md ranges).
_E3 = (0.80, 0.76, 0.74, 0.72, 0.70, 0.68, 0.66, 0.64)
_E1 = (0.62, 0.55, 0.50, 0.46, 0.42, 0.40, 0.38, 0.36)
_MTP1 = tuple(0.88 * 0.8**i for i in range(8))
_NGRAM = (0.85, 0.80, 0.75, 0.72, 0.70, 0.68, 0.66, 0.64)

E3_SGLANG_H100 = (
    PublishedArm(
        Method.EAGLE,
        3,
        {2: 1.40, 8: 1.23, 16: 1.02, 24: 0.93, 32: 0.94, 64: 0.99},
        _E1,
        draft="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        source="E3, SGLang H100",
    ),
    PublishedArm(
        Method.EAGLE3,
        3,
        {2: 1.81, 8: 1.62, 16: 1.48, 24: 1.39, 32: 1.32, 64: 1.38},
        _E3,
        draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        source="E3, SGLang H100",
    ),
)
E3_VLLM_A100 = (
    PublishedArm(
        Method.EAGLE,
        2,
        {2: 1.30, 16: 1.10, 32: 0.93, 56: 0.71},
        _E1,
        draft="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        source="E3, vLLM A100",
    ),
    PublishedArm(
        Method.EAGLE3,
        2,
        {2: 1.75, 16: 1.49, 32: 1.36, 56: 1.01},
        _E3,
        draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        source="E3, vLLM A100",
    ),
)
NGRAM_SCOUT_B200 = (
    PublishedArm(Method.NGRAM, 3, {1: 1.96, 4: 1.64, 32: 1.33}, _NGRAM, proposal_rate=0.6, source="TRT-NG"),
)
MTP_DSV3_MI300X = (
    PublishedArm(
        Method.MTP,
        2,
        {1: 2.11, 2: 2.04, 4: 1.84, 8: 1.70, 16: 1.53, 32: 1.44, 64: 1.25},
        _MTP1,
        source="ROCm-MTP, 8xMI300X SGLang",
    ),
)
# DSpark blocks: a_1 ~0.8, survival ~5% at position 7 (docs/published-figures.md, "Ranges for a simulator").
_DSPARK = (0.80, 0.75, 0.70, 0.66, 0.62, 0.58, 0.55, 0.52, 0.50, 0.48)
DSPARK_DSV4_MI350X = (
    PublishedArm(Method.DSPARK, 7, {4: 2.54, 64: 1.64, 256: 0.88}, _DSPARK, source="V52362, fixed K=7"),
    PublishedArm(Method.DSPARK, 7, {4: 2.37, 64: 1.74, 256: 1.50}, _DSPARK, source="V52362, adaptive", adaptive=True),
)
E31_KIMI_GB200 = (
    PublishedArm(
        Method.EAGLE3,
        3,
        {1: 2.03, 4: 1.71, 16: 1.66},
        _E3,
        draft="nvidia/Kimi-K2.5-Thinking-Eagle3",
        source="E31, GB200 TP4",
    ),
)
