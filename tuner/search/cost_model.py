"""A step-cost model learnt from the trials so far: the decode step against the tokens it verifies.

A trial's step at one level is the decode step as its requests saw it, ``S = TPOT x tau`` (tau tokens per
request-step); prefill riding in the steps is part of it (an explicit prefill share, removed before, went
negative on engines whose TTFT is queueing rather than prefill competing with decode).

The shape of the step is learnt, not assumed. The target's forward pass depends mostly on the tokens it
processes per step: the baseline at concurrency c runs about c, a speculative trial about c (1 + v), with v
the draft tokens verified per request-step (k for fixed-length drafters; proposals per step x tokens per
proposal for lookup proposers, measured). On a GPU that pass is flat until the batch's tokens cross the
roofline knee and steeper after it, and MoE experts, KV reads and scheduling bend it further: so the model
is one monotone (non-decreasing) curve ``T(n)`` over tokens per step, pooled over every trial and level
(isotonic regression, piecewise linear between its knots), plus each drafter's own cost with two
non-negative coefficients per method+draft:

- chain drafters (EAGLE, EAGLE-3, MTP, draft_model): ``k (a + b c)``: k sequential draft passes over c requests;
- block drafters (DFlash, DSpark): ``a + b c k``: one parallel pass over c k draft positions;
- lookup proposers (ngram, suffix): ``v (a + b c)``.

The two are fitted in turns (curve on the steps minus the drafters' cost; drafters on what the curve leaves).
On top of that every speculative config pays vLLM's spec-decode bookkeeping, even at K = 0: +6.6% TPOT at c2
and +21.6% at c189 (Gemma-4-31B on H100, docs/vllm-facts.md), taken as the prior ``overhead(c) = T_off x
(0.0644 + 0.0008 c)`` and subtracted first.

The prediction at depth k and level c is ``S_k = S_off + overhead + T(c (1 + v)) - T(c) + draft(c, k)``,
so TPOT_k = S_k / tau_k; with the same c requests in flight, each taking TTFT + (out - 1) x TPOT, the
throughput ratio follows by Little's law (``phase_gain``; TTFT is the arm's measured one at that level).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner.domain import LevelResult, LoadKind, Proposer


def overhead_ms(t_off: float, c: float) -> float:
    """Spec-decode bookkeeping per step, paid by any speculative config (the prior above)."""
    return t_off * (0.0644 + 0.0008 * c)


def phase_gain(
    ttft_off: float, tpot_off: float, ttft: float, tpot: float, *, out_tokens: float, tpot_objective: bool = False
) -> float:
    """Predicted speedup over the baseline at one level: the closed loop's throughput ratio (Little's law:
    the same requests in flight, each taking TTFT + (out - 1) x TPOT), or the 1/TPOT ratio."""
    if tpot_objective:
        return tpot_off / max(1e-9, tpot)
    n = max(0.0, out_tokens - 1.0)
    return (ttft_off + n * tpot_off) / max(1e-9, ttft + n * tpot)


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
class StepPoint:
    """One level of one trial: its raw decode step with the bookkeeping prior removed (``arm`` None: the
    baseline, whose step is the target's alone)."""

    c: float  # requests in flight
    step_ms: float
    arm: str | None = None
    kind: Proposer | None = None
    k: int = 0  # configured depth
    v: float = 0.0  # draft tokens verified per request-step

    @property
    def tokens(self) -> float:
        """Tokens the target processes per step."""
        return self.c * (1.0 + self.v)


@dataclass(frozen=True)
class TokenCurve:
    """A non-decreasing step time over tokens per step: knots (tokens, ms), linear between them (a pass
    grows with the tokens it computes), flat below the first, extended past the last along the last
    segment's slope."""

    knots: tuple[tuple[float, float], ...]

    def __call__(self, n: float) -> float:
        ks = self.knots
        if not ks:
            return 0.0
        if n <= ks[0][0]:
            return ks[0][1]
        for (x0, y0), (x1, y1) in zip(ks, ks[1:], strict=False):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0) if x1 > x0 else y1
        if len(ks) < 2:
            return ks[-1][1]
        (x0, y0), (x1, y1) = ks[-2], ks[-1]
        slope = max(0.0, (y1 - y0) / (x1 - x0)) if x1 - x0 > 1e-9 else 0.0
        return y1 + slope * (n - x1)

    @classmethod
    def isotonic(cls, points: Sequence[tuple[float, float, float]]) -> TokenCurve:
        """Weighted pool-adjacent-violators over (tokens, ms, weight); a knot per pooled block, at the
        block's weighted mean tokens."""
        blocks: list[list[float]] = []  # [sum w*x, sum w*y, sum w]
        for n, y, w in sorted(points):
            blocks.append([w * n, w * y, w])
            while len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] > blocks[-1][1] / blocks[-1][2]:
                last = blocks.pop()
                for i in range(3):
                    blocks[-1][i] += last[i]
        return cls(tuple((bx / bw, by / bw) for bx, by, bw in blocks))


@dataclass(frozen=True)
class DraftCost:
    """A drafter's own step time (see the module docstring for the three forms)."""

    kind: Proposer
    a: float = 0.0
    b: float = 0.0

    def features(self, c: float, k: int, v: float) -> tuple[float, float]:
        if k <= 0:
            return 0.0, 0.0
        if self.kind is Proposer.BLOCK:
            return 1.0, c * k
        if self.kind is Proposer.LOOKUP:
            return v, c * v
        return float(k), c * k

    def __call__(self, c: float, k: int, v: float) -> float:
        f0, f1 = self.features(c, k, v)
        return self.a * f0 + self.b * f1


@dataclass(frozen=True)
class StepModel:
    """The learnt curve and every drafter's cost; ``residuals`` are the fit's relative errors on the
    speculative points (what the curve and the drafter costs cannot explain)."""

    curve: TokenCurve
    drafts: Mapping[str, DraftCost] = field(default_factory=dict)
    residuals: tuple[float, ...] = ()

    def extra(self, arm: str, kind: Proposer, c: float, k: int, v: float) -> float:
        """Step time a speculative config adds at ``c`` over the baseline's (the bookkeeping excluded)."""
        if k <= 0:
            return 0.0
        draft = self.drafts.get(arm, DraftCost(kind))
        return max(0.0, self.curve(c * (1.0 + v)) - self.curve(c)) + draft(c, k, v)

    def predict(self, p: StepPoint, baseline_ms: Mapping[float, float]) -> float:
        base = baseline_ms.get(p.c, self.curve(p.c))
        return base + (self.extra(p.arm, p.kind, p.c, p.k, p.v) if p.arm and p.kind else 0.0)


def _nnls2(rows: Sequence[tuple[tuple[float, float], float]]) -> tuple[float, float]:
    """Non-negative least squares for y = a x0 + b x1: the best of the interior and boundary solutions."""

    def sse(a: float, b: float) -> float:
        return sum((a * x0 + b * x1 - y) ** 2 for (x0, x1), y in rows)

    s00 = sum(x0 * x0 for (x0, _), _ in rows)
    s11 = sum(x1 * x1 for (_, x1), _ in rows)
    s01 = sum(x0 * x1 for (x0, x1), _ in rows)
    b0 = sum(x0 * y for (x0, _), y in rows)
    b1 = sum(x1 * y for (_, x1), y in rows)
    options = [(0.0, 0.0)]
    det = s00 * s11 - s01 * s01
    if abs(det) > 1e-9 * max(1e-30, s00 * s11):
        a, b = (b0 * s11 - b1 * s01) / det, (b1 * s00 - b0 * s01) / det
        if a >= 0 and b >= 0:
            options.append((a, b))
    if s00 > 0:
        options.append((max(0.0, b0 / s00), 0.0))
    if s11 > 0:
        options.append((0.0, max(0.0, b1 / s11)))
    return min(options, key=lambda ab: sse(*ab))


BASELINE_WEIGHT = 3.0  # a baseline point is the target's step alone: it anchors the curve at n = c


def fit_step_model(points: Sequence[StepPoint], *, rounds: int = 4) -> StepModel:
    """The curve and the drafter costs, fitted in turns.

    Within the baseline's range of tokens per step the curve is the baseline's own (a baseline step at c
    is the target's pass over c tokens): whatever a speculative step costs beyond it there is the drafter's.
    Past the baseline's largest batch only speculative steps say how the pass grows; there their steps minus
    the drafter's cost (its form fitted where the baseline's curve is known, when two points lie there)
    extend the curve.
    """
    base = [p for p in points if p.arm is None]
    kinds: dict[str, Proposer] = {}  # each speculative arm's drafter kind (its first point's)
    spec: list[tuple[str, StepPoint]] = []  # the speculative points with their arm, in order
    for p in points:
        if p.arm is not None and p.kind is not None:
            kinds.setdefault(p.arm, p.kind)
            spec.append((p.arm, p))
    baseline_ms = {p.c: p.step_ms for p in base}
    top = max((p.tokens for p in base), default=0.0)
    drafts: dict[str, DraftCost] = {}
    curve = TokenCurve.isotonic([(p.tokens, p.step_ms, BASELINE_WEIGHT) for p in base])
    for i in range(rounds):
        for arm, kind in kinds.items():
            mine = [p for of, p in spec if of == arm]
            inside = [p for p in mine if p.tokens <= top]
            # where the baseline measured the target's pass, the rest of the step is the drafter's; past it
            # the two are confounded, so the drafter's form is fitted inside and extrapolated
            mine = inside if len(inside) >= 2 else mine
            proto = DraftCost(kind)
            rows = [
                (
                    proto.features(p.c, p.k, p.v),
                    p.step_ms - baseline_ms.get(p.c, curve(p.c)) - max(0.0, curve(p.tokens) - curve(p.c)),
                )
                for p in mine
            ]
            a, b = _nnls2(rows)
            drafts[arm] = DraftCost(kind, a, b)
        if i == rounds - 1:
            break
        pts = [(p.tokens, p.step_ms, BASELINE_WEIGHT) for p in base]
        for arm, p in spec:
            if p.tokens > top:
                d = drafts[arm]
                # the target's share of this step, on the baseline's scale at this level
                own = p.step_ms - d(p.c, p.k, p.v) - baseline_ms.get(p.c, curve(p.c)) + curve(p.c)
                pts.append((p.tokens, own, 1.0))
        curve = TokenCurve.isotonic(pts)
    model = StepModel(curve, dict(drafts))
    residuals = tuple((p.step_ms - model.predict(p, baseline_ms)) / p.step_ms for _, p in spec if p.step_ms > 0)
    return StepModel(curve, dict(drafts), residuals)
