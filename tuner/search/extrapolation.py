"""Acceptance-curve extrapolation: one trial at depth K predicts the acceptance length at every depth <= K.

For fixed-length drafters (EAGLE, EAGLE-3, MTP, draft_model, DFlash, DSpark) vLLM's per-position counts
give the conditional acceptance a_i = accepted_i / accepted_{i-1} (accepted_0 = drafts). Truncating the
chain at k gives tau(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens per step. Acceptance does not depend on
concurrency, so the counts of every level of every trial of one method+draft are pooled.
Variable-length proposers (ngram, suffix) only count steps that proposed something; when the runner knows
the decode steps they are used as the denominator, otherwise the curve overstates tau and the planner uses
it only as an optimistic bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tuner.domain import SpecDecodeStats, TrialResult


@dataclass(frozen=True)
class AcceptanceCurve:
    conditional: tuple[float, ...]  # a_1..a_K
    drafts: int  # pooled denominator (steps when known)

    @property
    def depth(self) -> int:
        return len(self.conditional)

    def survival(self, k: int) -> float:
        """P(first k draft tokens all accepted); beyond the measured depth the last rate is carried on."""
        p = 1.0
        for i in range(k):
            p *= self.conditional[min(i, self.depth - 1)] if self.depth else 0.0
        return p

    def tau(self, k: int) -> float:
        """Expected tokens per verification step at depth k (bonus token included)."""
        return 1.0 + sum(self.survival(j) for j in range(1, k + 1))

    @classmethod
    def pooled(cls, stats: Iterable[SpecDecodeStats], use_steps: bool = False) -> AcceptanceCurve | None:
        """Pool per-position counts; positions beyond a trial's K are counted only from deeper trials.

        Pass only trials run without a per-batch-size schedule: a lower scheduled K truncates the drafts.
        """
        accepted: dict[int, int] = {}
        base: dict[int, int] = {}
        total = 0
        for s in stats:
            if not s.num_drafts or not s.accepted_per_position:
                continue
            denom = s.decode_steps if use_steps and s.decode_steps else s.num_drafts
            prev = denom
            for i, a in enumerate(s.accepted_per_position):
                accepted[i] = accepted.get(i, 0) + a
                base[i] = base.get(i, 0) + prev
                prev = a
            total += denom
        if not accepted:
            return None
        rates = []
        for i in sorted(accepted):
            rates.append(min(1.0, accepted[i] / base[i]) if base[i] else 0.0)
        return cls(tuple(rates), total)


def stats_of(results: Iterable[TrialResult]) -> list[SpecDecodeStats]:
    return [lr.spec_decode for r in results for lr in r.levels if lr.spec_decode is not None]
