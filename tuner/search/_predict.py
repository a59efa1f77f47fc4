"""Predictions for untried configurations from an arm's trials: acceptance curve plus step-cost model.

Mixed into ``Analysis`` (``_analysis.py``), which owns the measured figures these read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.domain import Method, Objective, Proposer, SpecConfig
from tuner.search._space import MethodOptions
from tuner.search.cost_model import (
    CostPoint,
    StepCost,
    closed_loop_gain,
    fit,
    overhead_ms,
    prefill_share,
    raw_step,
)
from tuner.search.extrapolation import AcceptanceCurve
from tuner.search.objective import combine


@dataclass(frozen=True)
class Candidate:
    """An untried configuration with its prediction (None: nothing known about its arm yet)."""

    spec: SpecConfig
    option: MethodOptions
    per_level: Mapping[str, float] | None
    predicted: float | None
    optimistic: float  # inf when unknown


@dataclass(frozen=True)
class ArmModel:
    """What an arm's trials say: acceptance curve, step-cost fit(s), deepest depth, TTFT per level."""

    curve: AcceptanceCurve
    costs: list[StepCost]
    depth: int
    rate: float  # P(a request-step proposes): 1 for fixed-length drafters
    per_proposal: float  # draft tokens per proposal at the deepest depth
    fixed: bool
    block: bool  # DFlash / DSpark: one draft pass per step
    unbiased: bool  # per-position rates are true per step (fixed length, or decode steps known)
    ttft: dict[str, float]
    prefill: dict[str, float]  # GPU ms of prefill per request with this drafter (it prefills too)
    measured: dict[int, dict[str, float]]  # depth -> measured per-level speedups of this arm


class Predictions:
    """Prediction methods of ``Analysis``."""

    def _arm_model(self, opt: MethodOptions, lookup: tuple[int, int] | None) -> ArmModel | None:
        key = (opt.key, repr(lookup))
        if key not in self._models:
            self._models[key] = self._fit_arm(opt, lookup)
        return self._models[key]

    def _fit_arm(self, opt: MethodOptions, lookup: tuple[int, int] | None) -> ArmModel | None:
        numbers = {
            n
            for st in self.stats.values()
            if st.spec.schedule is None
            and self.option_of(st.spec) is opt
            and not st.diverged
            and (lookup is None or (st.spec.prompt_lookup_min, st.spec.prompt_lookup_max) == lookup)
            for n in st.numbers
        }
        results = [r.result for r in self.search_records if r.number in numbers and r.result is not None]
        if not results or not self.can_predict:
            return None
        fixed = opt.fixed_length
        stats = [lr.spec_decode for res in results for lr in res.levels if lr.spec_decode is not None]
        use_steps = not fixed and bool(stats) and all(sd.decode_steps for sd in stats)
        curve = AcceptanceCurve.pooled(stats, use_steps)
        if curve is None:
            return None
        deepest = max(results, key=lambda res: res.spec.num_speculative_tokens)
        depth = deepest.spec.num_speculative_tokens
        rate, per_proposal = 1.0, float(depth)
        if not fixed:
            ds = [lr.spec_decode for lr in deepest.levels if lr.spec_decode is not None]
            drafts = sum(sd.num_drafts for sd in ds)
            steps = sum(sd.decode_steps or 0 for sd in ds)
            rate = drafts / steps if use_steps and steps else 1.0
            per_proposal = sum(sd.num_draft_tokens for sd in ds) / drafts if drafts else float(depth)
        kind = opt.method.traits.proposer
        points: list[CostPoint] = []
        ttft: dict[str, list[float]] = {}
        prefill: dict[str, list[float]] = {}
        for res in results:
            k = res.spec.num_speculative_tokens
            for label in self.labels:
                lr = res.level(label)
                if lr is None or label not in self.baseline_tpot or lr.tpot_ms.mean <= 0:
                    continue
                sd = lr.spec_decode
                if sd is None or not sd.num_drafts:
                    tau, v = curve.tau(k), float(k)
                elif use_steps:
                    tau = 1.0 + sd.num_accepted_tokens / sd.decode_steps
                    v = sd.num_draft_tokens / sd.decode_steps
                else:
                    tau = sd.acceptance_length
                    v = sd.mean_proposed_per_draft if not fixed else float(k)
                t_off, c = self.baseline_tpot[label], self.baseline_c[label]
                per_ms = lr.request_throughput / 1000.0
                pf = prefill_share(lr.ttft_ms.mean, lr.tpot_ms.mean * tau, per_ms)
                prefill.setdefault(label, []).append(pf)
                step = raw_step(lr.tpot_ms.mean, tau, per_ms, pf)
                points.append(CostPoint(c, k, v, step - t_off - overhead_ms(t_off, c)))
                ttft.setdefault(label, []).append(lr.ttft_ms.mean)
        if not points:
            return None
        costs = [c for c in (fit(points, kind=kind, prefer="d"), fit(points, kind=kind, prefer="u")) if c]
        return ArmModel(
            curve=curve,
            costs=costs,
            depth=depth,
            rate=rate,
            per_proposal=per_proposal,
            fixed=fixed,
            unbiased=fixed or use_steps,
            block=kind is Proposer.BLOCK,
            ttft={label: statistics.fmean(v) for label, v in ttft.items()},
            prefill={label: statistics.fmean(v) for label, v in prefill.items()},
            measured={
                st.spec.num_speculative_tokens: st.per_level()
                for st in self.stats.values()
                if any(n in numbers for n in st.numbers)
            },
        )

    def _per_level(self, arm: ArmModel, k: int, tau: float, cost: StepCost) -> dict[str, float]:
        v = float(k) if arm.fixed else arm.rate * min(k, arm.per_proposal)
        out = {}
        for label in self.labels:
            t_off = self.baseline_tpot[label]
            c = self.baseline_c[label]
            step = t_off + overhead_ms(t_off, c) + cost.extra(c, k, v)
            out[label] = closed_loop_gain(
                t_off,
                step,
                tau,
                c=c,
                prefill=self.baseline_prefill[label],
                out_tokens=self.baseline_out[label],
                prefill_k=arm.prefill.get(label),
                tpot=self.objective is Objective.TPOT,
            )
        return out

    def _anchored(self, arm: ArmModel, k: int, tau: float, cost: StepCost) -> dict[str, float]:
        """The model's prediction scaled, level by level, by measured / modelled at the nearest measured depth:
        the model only has to get the change with depth right, not the absolute level."""
        model = self._per_level(arm, k, tau, cost)
        if not arm.measured:
            return model
        d = min(arm.measured, key=lambda x: (abs(x - k), -x))
        if d == k:
            return dict(arm.measured[d])
        at_d = self._per_level(arm, d, arm.curve.tau(d), cost)
        return {
            label: model[label] * arm.measured[d][label] / at_d[label]
            if label in arm.measured[d] and at_d[label] > 0
            else model[label]
            for label in self.labels
        }

    def predict(self, opt: MethodOptions, spec: SpecConfig) -> tuple[dict[str, float] | None, float]:
        """Per-level predicted speedups and an optimistic objective; (None, inf) when the arm is unmeasured.

        Fixed-length arms: tau from the measured acceptance curve, one point prediction anchored on the nearest
        measured depth; optimism = noise / 2 (2 x noise for block drafters), 3 x noise beyond the deepest
        measured depth. Lookup arms only bound: beyond the measured depth
        every further position is assumed accepted whenever the last measured one was, and when one depth
        cannot separate the two cost terms both attributions are tried and the better one kept.
        """
        if spec.is_off:
            return dict.fromkeys(self.labels, 1.0), 1.0
        lookup = (spec.prompt_lookup_min, spec.prompt_lookup_max) if opt.lookups else None
        arm = self._arm_model(opt, lookup) or (self._arm_model(opt, None) if lookup is not None else None)
        if arm is None or not self.can_predict:
            return None, math.inf
        k = spec.num_speculative_tokens
        n = self.noise
        own_window = lookup is None or self._arm_model(opt, lookup) is not None
        if arm.fixed:
            per_level = self._anchored(arm, k, arm.curve.tau(k), arm.costs[0])
            # block drafters draft in one pass: their cost splits less cleanly between draft and verify
            margin = (2 * n if arm.block else n / 2) if k <= arm.depth else 3 * n
            return per_level, combine(per_level, self.weights) * (1 + margin)
        depth = arm.depth
        tau = arm.curve.tau(min(k, depth)) + max(0, k - depth) * arm.curve.survival(depth)
        options = [self._anchored(arm, k, tau, cost) for cost in arm.costs]
        values = [combine(p, self.weights) for p in options]
        if not own_window:
            margin = 3 * n  # another lookup window changes the match rate: a wide bound
        elif k <= depth and arm.unbiased:
            margin = n / 2  # a truncation of measured proposals, counted per decode step
        else:
            margin = 2 * n
        return options[0], max(values) * (1 + margin)

    def candidates(self, pending_keys: set[str]) -> list[Candidate]:
        """Untried configurations of arms still in play, with predictions."""
        out = []
        for opt in self.space.options:
            if opt.method is Method.OFF or opt.key in self.excluded_arms:
                continue
            cap = self.caps.get(opt.key)
            for spec in opt.specs():
                key = spec.key()
                if cap is not None and spec.num_speculative_tokens >= cap:
                    continue
                if key in self.stats or key in self.measured_keys or key in pending_keys or key in self.failed_configs:
                    continue
                per_level, optimistic = self.predict(opt, spec)
                if per_level is None:
                    out.append(Candidate(spec, opt, None, None, math.inf))
                else:
                    out.append(Candidate(spec, opt, per_level, combine(per_level, self.weights), optimistic))
        return out
