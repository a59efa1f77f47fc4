"""A step-cost model fitted from the trials so far: time per step against draft tokens per step and batch.

From a trial's figures at one level, the time per engine step is ``c * tau / throughput`` (c requests in
flight, tau tokens per request per step); the baseline gives the plain step ``T_off(c) = c / throughput``.
The extra cost of speculating is modelled per method+draft as

- chain drafters (EAGLE, EAGLE-3, MTP, draft_model, ngram, suffix): ``dT = k * (d + u * c)``: k sequential
  draft steps of cost d, and k more tokens per request to verify at cost u each;
- block drafters (DFlash, DSpark): ``dT = d + u * k * c``: one parallel draft pass, k tokens to verify.

d, u >= 0 are fitted by least squares over every level of every trial of that arm, so one trial at four
levels already pins both. Predicted speedup at level c and depth k: ``tau(k) * T_off / (T_off + dT)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.domain import LevelResult, LoadKind


def in_flight(lr: LevelResult) -> float:
    """Requests in flight during the window: measured, else the target capped by the requests sent."""
    if lr.achieved_concurrency:
        return float(lr.achieved_concurrency)
    if lr.level.kind is LoadKind.CONCURRENCY:
        return float(max(1, min(lr.level.value, lr.num_requests or lr.level.value)))
    return max(1.0, lr.request_throughput * lr.e2e_ms.mean / 1000.0)


def step_time(lr: LevelResult, tau: float) -> float | None:
    """Seconds per engine step at this level, or None without throughput."""
    if lr.output_throughput <= 0:
        return None
    return in_flight(lr) * tau / lr.output_throughput


@dataclass(frozen=True)
class CostPoint:
    c: float  # requests in flight
    k: int
    extra_s: float  # measured step time minus the baseline's at this level


@dataclass(frozen=True)
class StepCost:
    d: float
    u: float
    block: bool
    residual: float = 0.0  # RMS relative residual of the fit

    def extra(self, c: float, k: int) -> float:
        if k <= 0:
            return 0.0
        return (self.d + self.u * k * c) if self.block else k * (self.d + self.u * c)


def _features(p: CostPoint, block: bool) -> tuple[float, float]:
    return (1.0, p.k * p.c) if block else (float(p.k), p.k * p.c)


def fit(points: Sequence[CostPoint], *, block: bool) -> StepCost | None:
    """Non-negative least squares for (d, u); None without points."""
    if not points:
        return None
    rows = [(_features(p, block), p.extra_s) for p in points]

    def sse(d: float, u: float) -> float:
        return sum((d * x0 + u * x1 - y) ** 2 for (x0, x1), y in rows)

    s00 = sum(x0 * x0 for (x0, _), _ in rows)
    s11 = sum(x1 * x1 for (_, x1), _ in rows)
    s01 = sum(x0 * x1 for (x0, x1), _ in rows)
    b0 = sum(x0 * y for (x0, _), y in rows)
    b1 = sum(x1 * y for (_, x1), y in rows)
    options = [(0.0, 0.0)]
    det = s00 * s11 - s01 * s01
    if abs(det) > 1e-18 * max(1.0, s00 * s11):
        d, u = (b0 * s11 - b1 * s01) / det, (b1 * s00 - b0 * s01) / det
        if d >= 0 and u >= 0:
            options.append((d, u))
    if s00 > 0:
        options.append((max(0.0, b0 / s00), 0.0))
    if s11 > 0:
        options.append((0.0, max(0.0, b1 / s11)))
    d, u = min(options, key=lambda du: sse(*du))
    scale = sum(abs(y) for _, y in rows) / len(rows) or 1.0
    return StepCost(d, u, block, residual=(sse(d, u) / len(rows)) ** 0.5 / scale)
