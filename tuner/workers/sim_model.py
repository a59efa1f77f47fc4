"""The analytic model behind the simulated engine: acceptance per position, step costs, steady state.

Leviathan/SmartSpec form: a verification step emits tau = 1 + m * sum_j prod_{i<=j} a_i tokens per
request (m = P(the drafter proposed), 1 for chain drafters) and costs a target forward over
batch x (1 + m x proposed) tokens, plus the drafter, plus vLLM's spec-decode bookkeeping (which it pays even
at K=0). Everything here is noise free; ``simulated.py`` adds the measurement noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tuner.domain import Method, Proposer, SpecConfig
from tuner.workers.sim_profiles import ModelProfile, WorkloadProfile

# a_1 for a chat workload and the per-position multiplier after it (a_i = a_1 * decay^(i-1)).
_CHAIN: dict[Method, tuple[float, float]] = {
    Method.EAGLE3: (0.68, 0.98),
    Method.EAGLE: (0.52, 0.90),
    Method.DRAFT_MODEL: (0.68, 0.97),
    Method.DFLASH: (0.78, 0.96),
    Method.DSPARK: (0.80, 0.96),
    Method.MEDUSA: (0.62, 0.85),
}
# Draft cost per drafted token as a fraction of a bs1 target step (block drafters: for the whole block).
_DRAFT_COST: dict[Method, float] = {
    Method.EAGLE3: 0.08,
    Method.EAGLE: 0.07,
    Method.DRAFT_MODEL: 0.22,
    Method.MTP: 0.05,
    Method.MEDUSA: 0.03,
    Method.DFLASH: 0.25,
    Method.DSPARK: 0.25,
    Method.NGRAM: 0.006,  # of the verify step: CPU lookup per request
    Method.NGRAM_GPU: 0.003,
    Method.SUFFIX: 0.012,
}
# Per-request CPU work of a lookup proposer per step (grows with batch where the GPU cost does not).
_LOOKUP_CPU_US = {Method.NGRAM: 40.0, Method.NGRAM_GPU: 5.0, Method.SUFFIX: 60.0}
_ASSISTANT_MTP = (0.80, 0.93)  # no public figure yet: between EAGLE-3 and a native MTP head
_MTP_REUSE_DECAY = 0.8  # a reused MTP head loses ~20% conditional acceptance per extra position
_EAGER_FIXED = 1.5  # enforce_eager: no CUDA graphs, launch-bound fixed costs

# Adaptive verification (enable_adaptive_verification): an ASSUMPTION, not vLLM's algorithm. Each request
# verifies a share of its k drafted tokens that falls as the batch fills, ranked by confidence, so the
# tokens it drops were mostly going to be rejected; a per-step cost for the confidence pass. Calibrated to
# the one public comparison (vLLM #52362, DSpark K=7 on DeepSeek-V4-Flash, MI350X; docs/published-figures.md):
# adaptive / fixed = 0.933 at c4, 1.061 at c64, 1.705 at c256. Fitted on the deepseek-v3-mtp profile (chat):
# 0.942, 1.061, 1.667 (a grid over the four constants below, least squares in log ratio).
ADAPTIVE_HALF_BATCH = 100.0  # batch at which half of the k drafted tokens are verified
ADAPTIVE_SHARPNESS = 3.0  # how fast the verified share falls around that batch
ADAPTIVE_KEPT_TAIL = 0.7  # share of the dropped positions' accepted tokens the confidence ranking keeps
ADAPTIVE_STEP_COST = 0.11  # confidence estimate per step, as a share of the step without speculation


def _clip(a: float) -> float:
    return min(0.97, max(0.02, a))


def lookup_bounds(spec: SpecConfig) -> tuple[int, int]:
    """vLLM's prompt_lookup_min/max: default 5, one copies the other when only one is set."""
    lo, hi = spec.prompt_lookup_min, spec.prompt_lookup_max
    lo = lo if lo is not None else (hi if hi is not None else 5)
    hi = hi if hi is not None else lo
    return int(lo), int(max(hi, lo))


def context_shift(workload: WorkloadProfile) -> float:
    """Learned drafters lose acceptance on long contexts (~0.85 at 100 tokens -> ~0.53 at 34K)."""
    return -0.08 * math.log2(max(1.0, workload.context_tokens / 2000.0))


def proposal_rate(spec: SpecConfig, workload: WorkloadProfile) -> float:
    """P(a decode step of one request proposes anything): 1 for chain/block drafters."""
    if spec.method in (Method.NGRAM, Method.NGRAM_GPU):
        lo, _hi = lookup_bounds(spec)
        return min(0.95, max(0.01, workload.ngram_match * (1.0 + 0.06 * (5 - lo))))
    if spec.method is Method.SUFFIX:
        return min(0.95, 0.10 + 1.2 * workload.ngram_match)
    return 1.0


def acceptance(
    model: ModelProfile, workload: WorkloadProfile, spec: SpecConfig, k: int | None = None
) -> tuple[float, ...]:
    """Conditional acceptance per position as vLLM's counters show it (given that the step proposed).

    For suffix decoding it includes the chance that the variable-length proposal reaches that position.
    """
    k = spec.num_speculative_tokens if k is None else k
    if spec.is_off or k <= 0:
        return ()
    scale = model.acceptance_scale.get(spec.method, 1.0)
    raw = _acceptance(model, workload, spec, k)
    return raw if scale == 1.0 else tuple(_clip(a * scale) for a in raw)


def _acceptance(model: ModelProfile, workload: WorkloadProfile, spec: SpecConfig, k: int) -> tuple[float, ...]:
    method = spec.method
    shift = workload.acceptance_shift
    if method.traits.proposer is Proposer.LOOKUP:
        lo, hi = lookup_bounds(spec)
        if method is Method.SUFFIX:
            a1 = 0.62 + 0.3 * workload.ngram_match + 0.3 * shift
            reach = suffix_reach(workload)
        else:
            a1 = 0.70 + 0.25 * workload.ngram_match + 0.3 * shift - 0.02 * (5 - lo) + 0.005 * (hi - lo)
            reach = 1.0
        # bursty: once a copied span is accepted, the next token of it is more likely right
        out = [_clip(a1)] + [_clip(reach * (1 - (1 - a1) * 0.85**i)) for i in range(1, k)]
        return tuple(out)
    if method in model.method_acceptance:
        base = model.method_acceptance[method]
        shift += context_shift(workload)
        return tuple(_clip(base[min(i, len(base) - 1)] + shift) for i in range(k))
    shift += context_shift(workload)
    if method is Method.MTP and spec.model is None:
        layers = max(1, model.mtp_layers)
        if layers == 1:
            a1 = _clip(0.88 + 0.4 * shift)
            return tuple(_clip(a1 * _MTP_REUSE_DECAY**i) for i in range(k))
        heads = [_clip(0.86 - (0.86 - (0.76 + 0.5 * shift)) * 0.6**i) for i in range(layers)]
        return tuple(_clip(heads[i % layers] * _MTP_REUSE_DECAY ** (i // layers)) for i in range(k))
    # Chain drafters, and a separate MTP checkpoint (Gemma 4 assistant): one head that reruns all its layers
    # per drafted token, so it decays like a chain drafter rather than a reused native head.
    a1, decay = _ASSISTANT_MTP if method is Method.MTP else _CHAIN.get(method, (0.65, 0.95))
    a1 = _clip(a1 + shift)
    return tuple(_clip(a1 * decay**i) for i in range(k))


def accepted_tokens(acc: tuple[float, ...]) -> float:
    """Expected accepted draft tokens per counted draft: sum_j prod_{i<=j} a_i."""
    total, surv = 0.0, 1.0
    for a in acc:
        surv *= a
        total += surv
    return total


def accepted_prefix(acc: tuple[float, ...], positions: float) -> float:
    """Expected accepted tokens when only the first ``positions`` (fractional) are verified."""
    total, surv = 0.0, 1.0
    for i, a in enumerate(acc):
        if i >= positions:
            break
        surv *= a
        total += surv * min(1.0, positions - i)
    return total


def suffix_reach(workload: WorkloadProfile) -> float:
    """P(a suffix proposal extends one more position): longer matched spans on repetitive traffic."""
    return 0.55 + 0.4 * workload.ngram_match


@dataclass(frozen=True)
class StepModel:
    """The decode step of one configuration at one batch size, noise free."""

    k: int
    proposal_rate: float
    acceptance: tuple[float, ...]
    proposed_per_draft: float
    tokens_per_step: float  # tau per request-step (bonus token included, empty steps counted)
    step_ms: float
    base_step_ms: float  # the same batch without speculation


def target_ms(model: ModelProfile, tokens: float, kv_tokens: float, routed: float, eager: bool = False) -> float:
    """One target forward over ``tokens`` batched tokens (``routed`` distinct-routing tokens for a MoE)."""
    fixed = model.target_step_ms * (_EAGER_FIXED if eager else 1.0)
    ms = fixed + model.per_token_us * tokens / 1e3 + model.per_kv_token_us * kv_tokens / 1e3
    ms += model.over_knee_us * over_knee(tokens, model.knee_tokens) / 1e3
    if model.moe and model.num_experts and model.expert_load_ms:
        p = model.experts_per_token / model.num_experts
        ms += model.expert_load_ms * ((1 - (1 - p) ** max(1.0, routed)) - p)
    return ms


def over_knee(tokens: float, knee: float) -> float:
    """Batched tokens past the compute knee, smoothed over half a knee (a hyperbolic softplus)."""
    x, w = tokens - knee, knee / 2.0
    return (x + math.sqrt(x * x + w * w)) / 2.0 - (-knee + math.sqrt(knee * knee + w * w)) / 2.0


def prefill_ms(model: ModelProfile, prompt_tokens: float) -> float:
    """Marginal cost of a prompt's prefill chunk inside a step (compute bound past the knee)."""
    # large prefill GEMMs run closer to peak than the ragged tokens of a decode step: half the knee penalty
    t = prompt_tokens
    ms = model.per_token_us * t / 1e3 + 0.5 * model.over_knee_us * over_knee(t, model.knee_tokens) / 1e3
    if model.moe and model.expert_load_ms:
        ms += model.expert_load_ms * 0.5
    return ms


def step(
    model: ModelProfile, workload: WorkloadProfile, spec: SpecConfig, batch: float, eager: bool = False
) -> StepModel:
    """Decode step time and tokens per request-step at this (mean) batch size."""
    b = max(1.0, batch)
    ctx = workload.context_tokens
    base = target_ms(model, b, b * ctx, b, eager)
    if spec.is_off:
        return StepModel(0, 0.0, (), 0.0, 1.0, base, base)
    k = spec.k_at(max(1, round(b)))
    o0, o1 = model.spec_overhead
    overhead = base * (o0 + o1 * b)
    if k <= 0:
        return StepModel(0, 0.0, (), 0.0, 1.0, base + overhead, base)
    m = proposal_rate(spec, workload)
    acc = acceptance(model, workload, spec, k)
    if spec.method is Method.SUFFIX:
        proposed = sum(suffix_reach(workload) ** i for i in range(k))
    else:
        proposed = float(k)
    accepted = accepted_tokens(acc)
    if spec.adaptive:
        verified = max(1.0, proposed / (1.0 + (b / ADAPTIVE_HALF_BATCH) ** ADAPTIVE_SHARPNESS))
        kept = accepted_prefix(acc, verified)
        accepted = kept + ADAPTIVE_KEPT_TAIL * (accepted - kept)
        overhead += ADAPTIVE_STEP_COST * base
        proposed = verified
    tau = 1.0 + m * accepted
    extra = b * m * proposed
    routed = b + (1.0 - model.expert_locality) * extra
    verify = target_ms(model, b + extra, b * ctx, routed, eager)
    draft = draft_ms(model, spec, k, b, ctx, verify, eager)
    return StepModel(k, m, acc, proposed, tau, verify + draft + overhead, base)


def draft_ms(
    model: ModelProfile, spec: SpecConfig, k: int, batch: float, ctx: float, verify: float, eager: bool
) -> float:
    method = spec.method
    frac = model.method_draft_cost.get(method)
    if method.traits.proposer is Proposer.LOOKUP:
        return (frac if frac is not None else _DRAFT_COST[method]) * verify + _LOOKUP_CPU_US[method] * batch / 1e3
    frac = (frac if frac is not None else _DRAFT_COST.get(method, 0.08)) * model.draft_cost_scale
    kv_share = 1.0 if method is Method.DRAFT_MODEL else 0.05
    fixed = model.target_step_ms * (2.0 if eager else 1.0)
    one_pass = frac * (fixed + model.per_token_us * batch / 1e3 + model.per_kv_token_us * kv_share * batch * ctx / 1e3)
    return one_pass if method.traits.proposer is Proposer.BLOCK else one_pass * k  # a block: one pass


@dataclass(frozen=True)
class OperatingPoint:
    """Steady state of one configuration at one load level (milliseconds, requests/s)."""

    batch: float  # mean scheduled requests
    step: StepModel
    step_eff_ms: float  # decode step stretched by the prefill chunks mixed into it
    prefill_ms: float
    ttft_ms: float
    e2e_ms: float  # server side, without queueing
    request_rate: float  # completions per second
    queue_ms: float = 0.0  # mean wait before admission (saturated open loop, or clients > max_num_seqs)
    saturated: bool = False

    @property
    def tpot_ms(self) -> float:
        return self.step_eff_ms / self.step.tokens_per_step


_DRAFT_PREFILL = {Method.EAGLE: 0.08, Method.EAGLE3: 0.1, Method.MTP: 0.05, Method.DRAFT_MODEL: 0.25}


def closed_loop(
    model: ModelProfile, workload: WorkloadProfile, spec: SpecConfig, batch: float, eager: bool = False
) -> OperatingPoint:
    """``batch`` requests always in flight, each replaced on completion (prefill mixed into decode steps)."""
    st = step(model, workload, spec, batch, eager)
    pf = prefill_ms(model, workload.prompt_tokens)
    pf *= 1.0 + _DRAFT_PREFILL.get(spec.method, 0.0) * model.draft_cost_scale
    out = max(1.0, workload.output_tokens)
    # Each of the ``batch`` slots cycles through a prefill and (out-1)/tau decode steps; prefill chunks ride in
    # the same steps, so per cycle the GPU spends batch x prefill on prompts: rate = B / (T0 + D + B pf).
    t0 = 1.5 * st.step_ms + pf
    decode = (out - 1.0) * st.step_ms / st.tokens_per_step
    rate = batch / (t0 + decode + batch * pf) * 1e3
    busy = rate * pf / 1e3  # share of time spent on prefill chunks (< 1 by construction)
    eff = st.step_ms / (1.0 - busy)
    ttft = t0 / (1.0 - busy)
    e2e = ttft + (out - 1.0) * eff / st.tokens_per_step
    return OperatingPoint(batch, st, eff, pf, ttft, e2e, rate)


def open_loop(
    model: ModelProfile,
    workload: WorkloadProfile,
    spec: SpecConfig,
    rate: float,
    max_batch: float,
    num_requests: int,
    eager: bool = False,
) -> OperatingPoint:
    """Poisson arrivals at ``rate`` req/s: the batch from Little's law, B = rate x e2e(B)."""
    top = closed_loop(model, workload, spec, max_batch, eager)
    if top.request_rate <= rate:
        backlog = num_requests / top.request_rate - num_requests / max(rate, 1e-9)
        return replace(top, queue_ms=max(0.0, backlog) / 2.0 * 1e3, saturated=True)
    lo, hi = 1e-6, max_batch
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if closed_loop(model, workload, spec, mid, eager).request_rate < rate:
            lo = mid
        else:
            hi = mid
    point = closed_loop(model, workload, spec, hi, eager)
    # a Poisson stream queues for admission a little even below capacity (M/D/1 wait, in steps)
    util = min(0.95, rate / top.request_rate)
    return replace(point, queue_ms=point.step.step_ms * util / (2.0 * (1.0 - util)))
