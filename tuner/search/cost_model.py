"""A step-cost model fitted from the trials so far: decode step time against draft tokens and batch.

Prefill competes with decoding: with chunked prefill, a step that carries prompt chunks takes longer, so
TPOT = S / (1 - r P), where S is the raw decode step, r the request rate and P the GPU time of one
request's prefill. P comes from the baseline's TTFT (about one step plus its own prefill, stretched the same
way): P = X / (1 + r X) with X = TTFT - TPOT. A trial's raw step at one level is then
``S = TPOT x tau x (1 - r P)`` (tau tokens per request-step). The extra cost of speculating, per
method+draft, is modelled with two non-negative coefficients fitted by least squares over every level of
every trial of that arm (one trial at four levels already pins both):

- chain drafters (EAGLE, EAGLE-3, MTP, draft_model): ``dT = k * d + u * c * k``: k sequential draft steps,
  k more tokens per request to verify;
- block drafters (DFlash, DSpark): ``dT = d + u * c * k``: one parallel draft pass;
- lookup proposers (ngram, suffix): ``dT = d * v + u * c * v``, with v the verified draft tokens per
  request-step (proposal rate x tokens per proposal, measured) in place of k.

On top of that every speculative config pays vLLM's spec-decode bookkeeping, even at K = 0: +6.6% TPOT at c2
and +21.6% at c189 (Gemma-4-31B on H100, vllm issue #49548), taken as the prior ``overhead(c) = T_off x
(0.0644 + 0.0008 c)`` and subtracted before the fit: one depth alone cannot tell a fixed cost from a
per-token one.

The prediction at depth k and level c is ``S_k = S_off + overhead + dT``; with c requests in flight each
needing n = out - 1 decode tokens, the closed loop settles at ``r = c / (c P + P + S (1 + n / tau))``
requests/s (``closed_loop_gain``); throughput is r x out and TPOT = S / (tau (1 - r P)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.domain import LevelResult, LoadKind, Proposer


def overhead_ms(t_off: float, c: float) -> float:
    """Spec-decode bookkeeping per step, paid by any speculative config (the prior above)."""
    return t_off * (0.0644 + 0.0008 * c)


def prefill_share(ttft_ms: float, tpot_ms: float, rate_per_ms: float) -> float:
    """P, the GPU ms one request's prefill takes, from the baseline's TTFT and TPOT (see the docstring)."""
    x = max(0.0, ttft_ms - tpot_ms)
    return x / (1.0 + rate_per_ms * x)


def raw_step(tpot_ms: float, tau: float, rate_per_ms: float, prefill_ms: float) -> float:
    """The decode step without the prefill chunks riding in it."""
    return tpot_ms * tau * max(0.05, 1.0 - rate_per_ms * prefill_ms)


def closed_loop_gain(
    step_off: float,
    step: float,
    tau: float,
    *,
    c: float,
    prefill: float,
    out_tokens: float,
    tpot: bool = False,
    prefill_k: float | None = None,
) -> float:
    """Predicted speedup over the baseline: throughput ratio, or 1/TPOT ratio when ``tpot``.

    ``prefill_k`` is the prefill per request with the drafter (it prefills the prompt too), when measured.
    """
    n = max(0.0, out_tokens - 1.0)
    pk = prefill if prefill_k is None else prefill_k
    r0 = c / (c * prefill + prefill + step_off * (1.0 + n))
    r = c / (c * pk + pk + step * (1.0 + n / tau))
    if not tpot:
        return r / r0
    return (step_off / max(0.05, 1.0 - r0 * prefill)) / (step / (tau * max(0.05, 1.0 - r * pk)))


def in_flight(lr: LevelResult) -> float:
    """Requests in flight during the window: measured, else the target capped by the requests sent."""
    if lr.achieved_concurrency:
        return float(lr.achieved_concurrency)
    if lr.level.kind is LoadKind.CONCURRENCY:
        return float(max(1, min(lr.level.value, lr.num_requests or lr.level.value)))
    return max(1.0, lr.request_throughput * lr.e2e_ms.mean / 1000.0)


def out_per_request(lr: LevelResult) -> float:
    return lr.output_tokens / lr.num_requests if lr.num_requests and lr.output_tokens else 128.0


@dataclass(frozen=True)
class CostPoint:
    c: float  # requests in flight
    k: int  # configured depth
    v: float  # verified draft tokens per request-step
    extra_ms: float  # measured decode step minus the baseline's at this level


@dataclass(frozen=True)
class StepCost:
    d: float
    u: float
    kind: Proposer

    def extra(self, c: float, k: int, v: float) -> float:
        """Step time added by the drafter and the extra verified tokens (the bookkeeping excluded)."""
        if k <= 0:
            return 0.0
        if self.kind is Proposer.BLOCK:
            return self.d + self.u * c * k
        if self.kind is Proposer.LOOKUP:
            return self.d * v + self.u * c * v
        return k * self.d + self.u * c * k


def _features(p: CostPoint, kind: Proposer) -> tuple[float, float]:
    if kind is Proposer.BLOCK:
        return 1.0, p.c * p.k
    if kind is Proposer.LOOKUP:
        return p.v, p.c * p.v
    return float(p.k), p.c * p.k


def fit(points: Sequence[CostPoint], *, kind: Proposer, prefer: str | None = None) -> StepCost | None:
    """Non-negative least squares for (d, u); None without points.

    When the two features are collinear (one depth measured), the data cannot tell them apart; ``prefer``
    ("d" or "u") then says which one takes the cost (callers use both to bound a prediction).
    """
    if not points:
        return None
    rows = [(_features(p, kind), p.extra_ms) for p in points]

    def sse(d: float, u: float) -> float:
        return sum((d * x0 + u * x1 - y) ** 2 for (x0, x1), y in rows)

    s00 = sum(x0 * x0 for (x0, _), _ in rows)
    s11 = sum(x1 * x1 for (_, x1), _ in rows)
    s01 = sum(x0 * x1 for (x0, x1), _ in rows)
    b0 = sum(x0 * y for (x0, _), y in rows)
    b1 = sum(x1 * y for (_, x1), y in rows)
    options = [(0.0, 0.0)]
    det = s00 * s11 - s01 * s01
    collinear = abs(det) <= 1e-6 * max(1e-30, s00 * s11)
    if not collinear:
        d, u = (b0 * s11 - b1 * s01) / det, (b1 * s00 - b0 * s01) / det
        if d >= 0 and u >= 0:
            options.append((d, u))
    if s00 > 0 and (not collinear or prefer != "u"):
        options.append((max(0.0, b0 / s00), 0.0))
    if s11 > 0 and (not collinear or prefer != "d"):
        options.append((0.0, max(0.0, b1 / s11)))
    d, u = min(options, key=lambda du: sse(*du))
    return StepCost(d, u, kind)
