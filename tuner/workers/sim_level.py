"""One simulated load level: the operating point, per-request spread, noise and the spec-decode counters.

Measurement noise is one speed factor per level and call (``1 + noise x N(0, 1)``): throughput scales with
it, latencies inversely, so the spread of repeated measurements is the requested noise. Per-request spread
(acceptance varies by request, ngram matches are bursty, prompts differ) is rescaled to mean 1 so it shapes
percentiles without moving the means the model predicts.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

from tuner.domain import (
    SLO,
    LatencyStats,
    LevelResult,
    LoadKind,
    LoadLevel,
    ServingConfig,
    SpecConfig,
    SpecDecodeStats,
    TrafficRequest,
)
from tuner.workers import sim_model
from tuner.workers.sim_profiles import CHARS_PER_TOKEN, ModelProfile, WorkloadProfile

_SPREAD_SEED = 20261202  # expected(): a fixed spread so percentiles are plausible and reproducible
_ITL_PER_REQUEST = 8


def level_result(
    model: ModelProfile,
    workload: WorkloadProfile,
    spec: SpecConfig,
    level: LoadLevel,
    serving: ServingConfig,
    slo: SLO,
    requests: Sequence[TrafficRequest],
    rng: random.Random | None,
    noise: float,
) -> LevelResult:
    """Figures of one level; ``rng=None`` gives the noise-free expectation."""
    eager = bool(serving.args.get("enforce_eager", False))
    max_seqs = float(serving.args.get("max_num_seqs", 256))
    n = max(1, int(level.num_requests))
    per_request = workload.prompt_tokens + workload.output_tokens
    kv_seqs = max(1.0, model.kv_capacity_tokens / max(1.0, per_request))
    cap = max(1.0, min(max_seqs, kv_seqs))
    offered: float | None = None
    if level.kind is LoadKind.CONCURRENCY:
        clients = max(1.0, min(float(level.value), float(n)))
        batch = min(clients, cap)
        op = sim_model.closed_loop(model, workload, spec, batch, eager)
        if clients > batch:  # clients beyond the server's batch wait for admission
            op = dataclasses.replace(op, queue_ms=max(0.0, clients / op.request_rate * 1e3 - op.e2e_ms))
        waiting = clients - batch
    else:
        offered = float(level.value) if level.kind is LoadKind.RATE else _trace_rate(requests)
        op = sim_model.open_loop(model, workload, spec, offered, cap, n, eager)
        if level.duration_s:
            n = max(1, min(n, round(level.duration_s * offered)))
        waiting = n * (1.0 - op.request_rate / offered) if op.saturated else 0.0
    preemptions = round(0.1 * n) if op.batch >= kv_seqs and kv_seqs < max_seqs else 0

    speed = max(0.5, 1.0 + noise * rng.gauss(0.0, 1.0)) if rng is not None and noise > 0 else 1.0
    srng = rng or random.Random(_SPREAD_SEED)
    # the same traffic every trial (vllm bench replays one sample): lengths never depend on the call
    outs, prompts = _lengths(requests, workload, n, random.Random(_SPREAD_SEED + n))
    decode_factor = _decode_spread(spec, workload, op, outs, srng)
    ttft_spread = _mean_one(srng, n, 0.25)
    ttft, tpot, e2e = [], [], []
    for i in range(n):
        queue = op.queue_ms * (2.0 * (i + 0.5) / n if op.saturated else ttft_spread[i])
        t = op.ttft_ms * ttft_spread[i] * (0.6 + 0.4 * prompts[i] / max(1.0, workload.prompt_tokens)) / speed + queue
        p = op.tpot_ms * decode_factor[i] / speed
        ttft.append(t)
        tpot.append(p)
        e2e.append(t + (outs[i] - 1) * p)
    itl = _itl(op, n, srng, speed)

    if offered is not None and not op.saturated:
        jitter = 1.0 + rng.gauss(0.0, 1.0) / math.sqrt(n) if rng is not None else 1.0
        duration = n / offered * max(0.5, jitter)  # Poisson arrivals: the offered rate, not the server, sets it
    else:
        duration = n / (op.request_rate * speed)
    good = sum(_meets(slo, ttft[i], tpot[i], e2e[i]) for i in range(n))
    total_out = sum(outs)
    return LevelResult(
        level=level,
        num_requests=n,
        errors=0,
        duration_s=duration,
        output_tokens=total_out,
        output_throughput=total_out / duration,
        request_throughput=n / duration,
        goodput=good / duration,
        ttft_ms=LatencyStats.of(ttft),
        tpot_ms=LatencyStats.of(tpot),
        itl_ms=LatencyStats.of(itl),
        e2e_ms=LatencyStats.of(e2e),
        achieved_concurrency=op.batch,
        below_target=level.kind is LoadKind.CONCURRENCY and op.batch < 0.9 * float(level.value),
        peak_kv_cache_usage=min(1.0, 1.1 * op.batch * per_request / model.kv_capacity_tokens),
        max_waiting=max(0.0, waiting),
        preemptions=preemptions,
        generation_tokens=total_out,
        spec_decode=_counters(spec, op, outs, rng),
    )


def _trace_rate(requests: Sequence[TrafficRequest]) -> float:
    times = sorted(r.arrival_s for r in requests if r.arrival_s is not None)
    if len(times) >= 2 and times[-1] > times[0]:
        return (len(times) - 1) / (times[-1] - times[0])
    return 1.0


def _mean_one(rng: random.Random, n: int, sigma: float) -> list[float]:
    """``n`` lognormal factors rescaled to mean exactly 1."""
    xs = [math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]
    mean = sum(xs) / n
    return [x / mean for x in xs]


def _lengths(
    requests: Sequence[TrafficRequest], workload: WorkloadProfile, n: int, rng: random.Random
) -> tuple[list[int], list[float]]:
    if requests:
        picked = [requests[i % len(requests)] for i in range(n)]
        return [r.target_output_tokens for r in picked], [len(r.prompt_text()) / CHARS_PER_TOKEN for r in picked]
    outs = [max(1, round(workload.output_tokens * f)) for f in _mean_one(rng, n, 0.35)]
    prompts = [workload.prompt_tokens * f for f in _mean_one(rng, n, 0.4)]
    return outs, prompts


def _decode_spread(
    spec: SpecConfig, workload: WorkloadProfile, op: sim_model.OperatingPoint, outs: list[int], rng: random.Random
) -> list[float]:
    """Per-request TPOT factors: acceptance differs by request (ngram matches are bimodal), mean 1."""
    st = op.step
    n = len(outs)
    if st.k and st.proposal_rate < 1.0:
        gain = sim_model.accepted_tokens(st.acceptance)
        conc = 3.0
        m = st.proposal_rate
        taus = [1.0 + rng.betavariate(m * conc, (1.0 - m) * conc) * gain for _ in range(n)]
        raw = [st.tokens_per_step / t for t in taus]
    elif st.k:
        raw = _mean_one(rng, n, 0.12)
    else:
        raw = _mean_one(rng, n, 0.04)
    weights = [max(0, o - 1) for o in outs]
    total = sum(weights)
    scale = sum(w * r for w, r in zip(weights, raw, strict=True)) / total if total else 1.0
    return [r / scale for r in raw]


def _itl(op: sim_model.OperatingPoint, n: int, rng: random.Random, speed: float) -> list[float]:
    """One chunk per step (several tokens under spec decode); some steps carry a prefill chunk."""
    st = op.step.step_ms
    stretch = max(0.0, op.step_eff_ms - st)  # prefill time per decode step, on average
    share = min(1.0, stretch / op.prefill_ms) if op.prefill_ms > 0 else 0.0
    extra = op.prefill_ms if share < 1.0 else stretch
    out = []
    for _ in range(min(n * _ITL_PER_REQUEST, 4000)):
        ms = st * math.exp(rng.gauss(0.0, 0.05))
        if rng.random() < share:
            ms += extra
        out.append(ms / speed)
    return out


def _meets(slo: SLO, ttft: float, tpot: float, e2e: float) -> bool:
    # vllm bench's --goodput judges ttft, tpot and e2el per request; it has no per-request ITL criterion.
    return (
        (slo.p99_ttft_ms is None or ttft <= slo.p99_ttft_ms)
        and (slo.p99_tpot_ms is None or tpot <= slo.p99_tpot_ms)
        and (slo.p99_e2e_ms is None or e2e <= slo.p99_e2e_ms)
    )


def _binomial(rng: random.Random | None, n: int, p: float) -> int:
    mean = n * p
    if rng is None or n <= 0:
        return max(0, min(n, round(mean)))
    return max(0, min(n, round(mean + math.sqrt(max(0.0, mean * (1.0 - p))) * rng.gauss(0.0, 1.0))))


def _counters(
    spec: SpecConfig, op: sim_model.OperatingPoint, outs: list[int], rng: random.Random | None
) -> SpecDecodeStats | None:
    """vLLM's counters over the window. ``decode_steps`` counts request-steps (a request in a step), the
    unit ``num_drafts`` is counted in, so ``empty_step_fraction`` is the share of steps that proposed nothing."""
    if spec.is_off:
        return None
    st = op.step
    K = max(spec.num_speculative_tokens, st.k)
    steps = round(sum(max(0, o - 1) for o in outs) / st.tokens_per_step)
    if st.k == 0:
        return SpecDecodeStats(0, 0, 0, (0,) * K, spec.num_speculative_tokens, steps)
    drafts = steps if st.proposal_rate >= 1.0 else _binomial(rng, steps, st.proposal_rate)
    per: list[int] = []
    prev = drafts
    for a in st.acceptance:
        prev = _binomial(rng, prev, a)
        per.append(prev)
    per += [0] * (K - len(per))
    tokens = round(drafts * st.proposed_per_draft)
    return SpecDecodeStats(
        drafts, max(tokens, per[0] if per else 0), sum(per), tuple(per), spec.num_speculative_tokens, steps
    )
