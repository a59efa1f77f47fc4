"""The objective a job optimises, and the SLO constraints, computed from a trial's per-level figures.

Per level the *metric* is: THROUGHPUT output tokens/s; TPOT 1 / mean TPOT (tokens/s per request);
GOODPUT requests/s meeting the SLOs. A configuration's per-level *speedup* is its metric divided by the
baseline's (no speculation) at that level. The objective of a configuration is the traffic-weighted
**geometric** mean of its per-level speedups, ``exp(sum_l w_l ln s_l / sum_l w_l)`` (weights default to 1
per level; pass ``level_weights`` with each level's share of production traffic). The geometric mean keeps
ratios symmetric (a 2x at c1 and a 0.5x at c128 average to 1, not 1.25) and lets Optuna rank trials before
the baseline is in: the value stored on each Optuna trial is ``sum_l w_l ln metric_l / sum_l w_l``, whose
difference to the baseline's value is the log of the objective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tuner.domain import SLO, LevelResult, Objective, TrialResult, TrialStatus

_FLOOR = 1e-9


def level_metric(lr: LevelResult, objective: Objective) -> float:
    """Larger is better for every objective."""
    if objective is Objective.TPOT:
        return 1000.0 / lr.tpot_ms.mean if lr.tpot_ms.mean > 0 else _FLOOR
    if objective is Objective.GOODPUT:
        return max(lr.goodput, 0.01 * lr.request_throughput, _FLOOR)
    return max(lr.output_throughput, _FLOOR)


def weights_for(labels: Sequence[str], level_weights: Mapping[str, float] | None) -> dict[str, float]:
    weights = {label: float((level_weights or {}).get(label, 1.0 if not level_weights else 0.0)) for label in labels}
    if sum(weights.values()) <= 0:
        weights = dict.fromkeys(labels, 1.0)
    return weights


def log_value(result: TrialResult, objective: Objective, weights: Mapping[str, float]) -> float | None:
    """The value stored on the Optuna trial: weighted mean of ln(metric) over the levels (None: no figures)."""
    total = 0.0
    wsum = 0.0
    for label, w in weights.items():
        lr = result.level(label)
        if lr is None:
            return None
        total += w * math.log(level_metric(lr, objective))
        wsum += w
    return total / wsum if wsum else None


def combine(per_level: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Weighted geometric mean of per-level speedups."""
    wsum = sum(weights[label] for label in per_level if label in weights)
    if not wsum:
        return 1.0
    return math.exp(sum(weights[lb] * math.log(max(s, _FLOOR)) for lb, s in per_level.items() if lb in weights) / wsum)


def slo_violation(lr: LevelResult, slo: SLO) -> float:
    """Largest relative p99 overshoot at this level: <= 0 meets every SLO, > 0 violates one."""
    worst = -1.0
    for limit, stat in (
        (slo.p99_ttft_ms, lr.ttft_ms),
        (slo.p99_tpot_ms, lr.tpot_ms),
        (slo.p99_itl_ms, lr.itl_ms),
        (slo.p99_e2e_ms, lr.e2e_ms),
    ):
        if limit:
            worst = max(worst, stat.p99 / limit - 1.0)
    return worst


def constraints(result: TrialResult, slo: SLO, labels: Sequence[str]) -> list[float]:
    """Constraint values, one per level (<= 0 feasible); diverged or figure-less trials are infeasible."""
    if not result.status.has_figures() or result.status is TrialStatus.DIVERGED:
        return [1.0] * len(labels)
    out = []
    for label in labels:
        lr = result.level(label)
        out.append(1.0 if lr is None else (0.0 if slo.is_empty() else min(slo_violation(lr, slo), 1e6)))
    return out
