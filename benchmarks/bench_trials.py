"""The trial results the search benchmark's own evaluators report (``search_physics``, ``search_published``).

Each evaluator has its own physics (what a config's TTFT, TPOT and acceptance are at a load level); what it
reports from them is the same shape as a real trial's: one ``LevelResult`` per level from a closed loop of
``c`` requests of ``out_tokens`` each, and spec-decode counters drawn from the acceptance per position, as
vLLM's ``spec_decode_num_*`` counters would read after the level.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Protocol

from tuner.domain import (
    Engine,
    LatencyStats,
    LevelResult,
    LoadLevel,
    SpecConfig,
    SpecDecodeStats,
    TrialResult,
    TrialStatus,
)


def level_rng(seed: int, cfg: SpecConfig, level: LoadLevel, call: int) -> random.Random:
    """The random stream of one level of one call: the same seed, config, level and call give the same run."""
    raw = f"{seed}|{cfg.key()}|{level.label}|{call}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(raw).digest()[:8], "big"))


def level_result(
    level: LoadLevel,
    *,
    ttft: float,
    tpot: float,
    tau: float,
    out_tokens: int,
    spec_decode: SpecDecodeStats | None,
) -> LevelResult:
    """A level run by ``level.value`` requests in flight, each a prefill of ``ttft`` ms then ``tpot`` ms per
    token, ``tau`` tokens per step; throughput by Little's law over the closed loop."""
    c = int(level.value)
    e2e = ttft + (out_tokens - 1) * tpot
    thr = c * out_tokens * 1000.0 / e2e
    tokens = level.num_requests * out_tokens
    return LevelResult(
        level=level,
        num_requests=level.num_requests,
        duration_s=tokens / thr,
        output_tokens=tokens,
        output_throughput=thr,
        request_throughput=thr / out_tokens,
        goodput=thr / out_tokens,
        ttft_ms=LatencyStats(ttft, ttft, 1.3 * ttft, 1.6 * ttft),
        tpot_ms=LatencyStats(tpot, tpot, 1.2 * tpot, 1.5 * tpot),
        itl_ms=LatencyStats(tpot * tau, tpot * tau, 1.3 * tpot * tau, 2.0 * tpot * tau),
        e2e_ms=LatencyStats(e2e, e2e, 1.2 * e2e, 1.5 * e2e),
        achieved_concurrency=float(c),
        spec_decode=spec_decode,
    )


class Drafts(Protocol):
    """What the counters need of an evaluator's drafter."""

    proposal_rate: float  # share of steps with a proposal (a lookup proposer's match rate; 1 for a model)
    acceptance: Sequence[float]  # conditional acceptance per position, the last one repeated

    def tau(self, k: int) -> float: ...  # tokens per step at depth k


def counters(
    cfg: SpecConfig, c: int, tokens: int, rng: random.Random, drafter: Drafts | None, *, jitter: float
) -> SpecDecodeStats | None:
    """Spec-decode counters for ``tokens`` generated at ``c`` in flight: ``tokens / tau`` steps, drafts on
    the drafter's ``proposal_rate`` of them (``jitter`` relative noise), each position accepted with its
    conditional acceptance (binomial noise). None for no speculation."""
    if cfg.is_off or drafter is None:
        return None
    k = cfg.k_at(c)
    steps = round(tokens / drafter.tau(k))
    drafts = round(steps * drafter.proposal_rate * (1 + jitter * rng.gauss(0, 1))) if k else 0
    per, prev = [], drafts
    for i in range(k):
        a = drafter.acceptance[min(i, len(drafter.acceptance) - 1)]
        prev = max(0, min(prev, round(prev * a + math.sqrt(prev * a * (1 - a)) * rng.gauss(0, 1))))
        per.append(prev)
    per += [0] * (cfg.num_speculative_tokens - k)
    return SpecDecodeStats(drafts, drafts * k, sum(per), tuple(per), cfg.num_speculative_tokens, steps)


def succeeded(cfg: SpecConfig, levels: Sequence[LevelResult], source: str) -> TrialResult:
    """A finished trial of ``cfg``; ``source`` names the evaluator as its hardware and vLLM version."""
    return TrialResult(
        TrialStatus.SUCCEEDED,
        Engine.SIMULATED,
        spec=cfg,
        levels=tuple(levels),
        reference_outputs=((1, 2, 3),),
        hardware=source,
        vllm_version=source,
    )
