"""Predictions for untried configurations: each arm's acceptance curve and one step-cost model learnt from
every trial (``cost_model.py``), anchored level by level on what was measured.

A ``Predictor`` is built from explicit inputs (the baseline's figures, the search trials' results, each
configuration's measured ratios, the error band) and composed into ``Analysis``; it reads nothing else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from tuner.domain import Objective, Proposer, SpecConfig, TrialResult
from tuner.search._records import ConfigStats, central
from tuner.search._space import MethodOptions, SearchSpace
from tuner.search.cost_model import (
    StepModel,
    StepPoint,
    fit_step_model,
    overhead_ms,
    phase_gain,
)
from tuner.search.extrapolation import AcceptanceCurve


@dataclass(frozen=True)
class Baseline:
    """The baseline's figures per level: its decode step as a request saw it (TPOT, ms), requests in flight,
    TTFT (ms), output tokens per request."""

    step: Mapping[str, float]
    c: Mapping[str, float]
    ttft: Mapping[str, float]
    out: Mapping[str, float]


@dataclass(frozen=True)
class Candidate:
    """An untried configuration with its prediction (None: nothing known about its arm yet).

    ``margin`` is how far it may beat its point prediction (the calibrated band times how much less is known
    about it): its optimistic figure at a level is ``per_level[label] * (1 + margin)``.
    """

    spec: SpecConfig
    option: MethodOptions
    per_level: Mapping[str, float] | None
    predicted: float | None
    optimistic: float  # inf when unknown
    margin: float = math.inf


@dataclass(frozen=True)
class ArmModel:
    """What an arm's trials say: acceptance curve, deepest depth, proposal rate, TTFT per level and
    the measured per-level speedups by depth."""

    key: str
    kind: Proposer
    curve: AcceptanceCurve
    depth: int
    rate: float  # P(a request-step proposes): 1 for fixed-length drafters
    per_proposal: float  # draft tokens per proposal at the deepest depth
    fixed: bool
    unbiased: bool  # per-position rates are true per step (fixed length, or decode steps known)
    ttft: dict[str, float]  # mean TTFT per level with this drafter (it prefills too)
    measured: dict[int, dict[str, float]]  # depth -> measured per-level speedups of this arm
    points: tuple[StepPoint, ...]  # its trials' steps, for the pooled step-cost model

    def verified(self, k: int) -> float:
        """Draft tokens verified per request-step at depth ``k``."""
        return float(k) if self.fixed else self.rate * min(k, self.per_proposal)

    def tau(self, k: int) -> float:
        if self.fixed:
            return self.curve.tau(k)
        return self.curve.tau(min(k, self.depth)) + max(0, k - self.depth) * self.curve.survival(self.depth)


# How far the step-cost model's change with depth may be off, per depth step apart (log scale), before the
# measurements say otherwise, and how many squared depth steps of evidence that prior is worth
# (``Predictor._shape_error``).
SHAPE_PRIOR = 0.015
SHAPE_PRIOR_WEIGHT = 4.0
# A run further than this many of its own widths from the pooled estimate counts for less (Huber's weights):
# one slow run (a noisy neighbour, a throttle) must not decide a level.
HUBER = 1.5


@dataclass(frozen=True)
class Estimate:
    """A measured config's figure at one level: the pooled speedup, the variance of its logarithm, and the
    weight each measured config's runs carry in it with their noise variance (what two estimates of one
    arm share: ``diff_var``)."""

    value: float
    var: float
    parts: Mapping[str, tuple[float, float]] = field(default_factory=dict)


def diff_var(a: Estimate, b: Estimate) -> float:
    """The variance of ``log(a / b)``: two depths of one arm pooled from the same runs move together, so
    their difference is surer than either figure."""
    cov = sum(
        wa * b.parts[key][0] * math.sqrt(va * b.parts[key][1]) for key, (wa, va) in a.parts.items() if key in b.parts
    )
    return max(0.0, a.var + b.var - 2 * cov)


class _Group:
    """The runs of one measured config at one level, moved to the depth being estimated (log scale)."""

    def __init__(self, key: str, logs: list[float], shift: float, extra: float) -> None:
        self.key = key
        self.logs = [x + shift for x in logs]
        self.extra = extra  # the shape's variance for this distance in depth
        self.weights = [1.0] * len(logs)


def _pool(groups: list[_Group], noise: float) -> Estimate:
    """Inverse-variance mean over the configs' (Huber-weighted) run means, iterated three times."""
    est, var = 0.0, math.inf
    parts: dict[str, tuple[float, float]] = {}
    for _ in range(3):
        num = den = 0.0
        inv: dict[str, tuple[float, float]] = {}
        for g in groups:
            n = sum(g.weights)
            if n <= 0:
                continue
            mean = sum(w * x for w, x in zip(g.weights, g.logs, strict=True)) / n
            v = noise * noise / n + g.extra
            num += mean / v
            den += 1.0 / v
            inv[g.key] = (1.0 / v, noise * noise / n)
        if den <= 0:
            break
        est, var = num / den, 1.0 / den
        parts = {key: (w / den, nv) for key, (w, nv) in inv.items()}
        for g in groups:
            scale = math.sqrt(noise * noise + g.extra)
            g.weights = [min(1.0, HUBER * scale / max(abs(x - est), 1e-12)) for x in g.logs]
    return Estimate(math.exp(est), var, parts)


class Predictor:
    def __init__(
        self,
        *,
        space: SearchSpace,
        labels: list[str],
        weights: Mapping[str, float],
        objective: Objective,
        baseline: Baseline,
        results: Mapping[int, TrialResult],
        stats: Mapping[str, ConfigStats],
        band: float,
        arm_bands: Mapping[str, float] | None = None,
    ) -> None:
        self.space = space
        self.labels = labels
        self.weights = weights
        self.objective = objective
        self.baseline = baseline
        self.results = results
        self.stats = stats
        self.band = band
        self.arm_bands = dict(arm_bands or {})
        self._arms: dict[tuple[str, str], ArmModel | None] = {}
        self._model: StepModel | None = None
        self._model_done = False

    @property
    def ready(self) -> bool:
        return all(label in self.baseline.step for label in self.labels)

    # ------------------------------------------------------------------------------------------ arms
    def arm(self, opt: MethodOptions, lookup: tuple[int | None, int | None] | None) -> ArmModel | None:
        key = (opt.key, repr(lookup))
        if key not in self._arms:
            self._arms[key] = self._fit_arm(opt, lookup)
        return self._arms[key]

    def _fit_arm(self, opt: MethodOptions, lookup: tuple[int | None, int | None] | None) -> ArmModel | None:
        mine = [
            st
            for st in self.stats.values()
            if st.spec.schedule is None
            and self.space.option_for(st.spec) is opt
            and not st.diverged
            and (lookup is None or (st.spec.prompt_lookup_min, st.spec.prompt_lookup_max) == lookup)
        ]
        numbers = {n for st in mine for n in st.numbers}
        results = [res for n, res in self.results.items() if n in numbers]
        if not results or not self.ready:
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
        points: list[StepPoint] = []
        ttft: dict[str, list[float]] = {}
        for res in results:
            k = res.spec.num_speculative_tokens
            for label in self.labels:
                lr = res.level(label)
                if lr is None or lr.tpot_ms.mean <= 0:
                    continue
                sd = lr.spec_decode
                if sd is None or not sd.num_drafts:
                    tau, v = curve.tau(k), float(k)
                elif use_steps and sd.decode_steps:  # use_steps: every one of them counted its steps
                    tau = 1.0 + sd.num_accepted_tokens / sd.decode_steps
                    v = sd.num_draft_tokens / sd.decode_steps
                else:
                    tau = sd.acceptance_length
                    v = sd.mean_proposed_per_draft if not fixed else float(k)
                t_off, c = self.baseline.step[label], self.baseline.c[label]
                ttft.setdefault(label, []).append(lr.ttft_ms.mean)
                step = lr.tpot_ms.mean * tau  # one step yields tau tokens per request
                points.append(StepPoint(c, step - overhead_ms(t_off, c), opt.key, kind, k, v))
        if not points:
            return None
        return ArmModel(
            key=opt.key,
            kind=kind,
            curve=curve,
            depth=depth,
            rate=rate,
            per_proposal=per_proposal,
            fixed=fixed,
            unbiased=fixed or use_steps,
            ttft={label: statistics.fmean(v) for label, v in ttft.items()},
            measured={st.spec.num_speculative_tokens: st.per_level() for st in mine},
            points=tuple(points),
        )

    def step_model(self) -> StepModel | None:
        """One model over every measured arm and the baseline (the target's curve is shared)."""
        if self._model_done:
            return self._model
        self._model_done = True
        if not self.ready:
            return None
        points = [StepPoint(self.baseline.c[lb], self.baseline.step[lb]) for lb in self.labels]
        for opt in self.space.options:
            for lookup in opt.lookups or (None,):
                arm = self.arm(opt, lookup)
                if arm is not None:
                    points.extend(arm.points)
        self._model = fit_step_model(points)
        return self._model

    # ------------------------------------------------------------------------------------------ predictions
    def _per_level(self, arm: ArmModel, k: int, model: StepModel) -> dict[str, float]:
        v = arm.verified(k)
        tau = arm.tau(k)
        out = {}
        for label in self.labels:
            t_off = self.baseline.step[label]
            c = self.baseline.c[label]
            step = t_off + overhead_ms(t_off, c) + model.extra(arm.key, arm.kind, c, k, v)
            out[label] = phase_gain(
                self.baseline.ttft[label],
                t_off,
                arm.ttft.get(label, self.baseline.ttft[label]),
                step / tau,
                out_tokens=self.baseline.out[label],
                tpot_objective=self.objective is Objective.TPOT,
            )
        return out

    def _anchored(self, arm: ArmModel, k: int, model: StepModel) -> dict[str, float]:
        """The model's prediction scaled, level by level, by measured / modelled at the nearest measured depth:
        the model only has to get the change with depth right, not the absolute level."""
        pred = self._per_level(arm, k, model)
        if not arm.measured:
            return pred
        d = min(arm.measured, key=lambda x: (abs(x - k), -x))
        if d == k:
            return dict(arm.measured[d])
        at_d = self._per_level(arm, d, model)
        return {
            label: pred[label] * arm.measured[d][label] / at_d[label]
            if label in arm.measured[d] and at_d[label] > 0
            else pred[label]
            for label in self.labels
        }

    def predict(self, opt: MethodOptions, spec: SpecConfig) -> tuple[dict[str, float] | None, float]:
        """Per-level predicted speedups and the margin they may be beaten by; (None, inf) when the arm is
        unmeasured.

        The margin is the calibrated error band (how wrong this arm's checked predictions have been; all
        arms' pooled, or a prior, until some of its own were checked) times how much less is known here: 1
        within the measured depths of a fixed-length or step-counted arm, 1.5 for block drafters (their cost
        splits less cleanly), 2 for a lookup arm measured per proposal only, 3 beyond the deepest measured
        depth or for another lookup window.
        """
        if spec.is_off:
            return dict.fromkeys(self.labels, 1.0), 0.0
        lookup = (spec.prompt_lookup_min, spec.prompt_lookup_max) if opt.lookups else None
        arm = self.arm(opt, lookup) or (self.arm(opt, None) if lookup is not None else None)
        model = self.step_model()
        if arm is None or model is None:
            return None, math.inf
        k = spec.num_speculative_tokens
        own_window = lookup is None or self.arm(opt, lookup) is not None
        if k > arm.depth or not own_window:
            factor = 3.0
        elif arm.kind is Proposer.BLOCK:
            factor = 1.5
        elif arm.unbiased:
            factor = 1.0
        else:
            factor = 2.0
        return self._anchored(arm, k, model), self.arm_bands.get(spec.arm, self.band) * factor

    def pooled(self, st: ConfigStats, noise: float) -> dict[str, Estimate]:
        """A measured static config's figure at each level from every run of its arm, not only its own.

        One run per config at 1-4% noise (and the odd slow run) cannot tell depths 2% apart; the arm's other
        depths were measured at the same level, and where the model gets the change with depth right
        (acceptance is counted, not timed) it tells them apart better than one run does. So each measured
        depth's runs are moved to this depth by the model's ratio (``_per_level``), with a variance of
        ``noise**2 / runs`` plus the shape's error squared per depth step apart (``_shape_error``: learnt from
        how the arm's measured depths disagree with the model's ratios, a prior until they can), and pooled by
        inverse variance; runs far from the pooled figure count less (Huber). Its own runs carry most weight,
        and the only weight when the arm has no model or one depth measured. ``noise`` is one level's
        run-to-run noise (log scale).
        """
        own = {label: [math.log(v) for v in vals if v > 0] for label, vals in st.ratios.items()}
        members, curves = self._arm_members(st)
        shape = self._shape_error(members, curves, noise) if members else 0.0
        k = st.spec.num_speculative_tokens
        out: dict[str, Estimate] = {}
        for label, logs in own.items():
            if not logs:
                continue
            groups = [_Group(st.spec.key(), logs, 0.0, 0.0)]
            for o in members:
                d = o.spec.num_speculative_tokens
                vals = [math.log(v) for v in o.ratios.get(label, []) if v > 0]
                at_k, at_d = curves[k].get(label, 0.0), curves[d].get(label, 0.0)
                if o is st or not vals or at_k <= 0 or at_d <= 0:
                    continue
                groups.append(_Group(o.spec.key(), vals, math.log(at_k / at_d), (shape * abs(k - d)) ** 2))
            out[label] = _pool(groups, noise)
        return out

    def _arm_members(self, st: ConfigStats) -> tuple[list[ConfigStats], dict[int, dict[str, float]]]:
        """The measured static depths of ``st``'s arm (``st`` included) and the model's per-level figures at
        each; nothing when the arm has no model yet or only one depth measured."""
        opt = self.space.option_for(st.spec)
        model = self.step_model()
        if opt is None or model is None or st.spec.schedule is not None or st.spec.is_off:
            return [], {}
        lookup = (st.spec.prompt_lookup_min, st.spec.prompt_lookup_max) if opt.lookups else None
        arm = self.arm(opt, lookup)
        if arm is None:
            return [], {}
        window = (st.spec.prompt_lookup_min, st.spec.prompt_lookup_max)
        members = [
            o
            for o in self.stats.values()
            if o.spec.schedule is None
            and not o.diverged
            and self.space.option_for(o.spec) is opt
            and (o.spec.prompt_lookup_min, o.spec.prompt_lookup_max) == window
        ]
        if st not in members:
            members.append(st)
        depths = {o.spec.num_speculative_tokens for o in members}
        if len(depths) < 2:
            return [], {}
        return members, {d: self._per_level(arm, d, model) for d in depths}

    def _shape_error(
        self, members: list[ConfigStats], curves: Mapping[int, Mapping[str, float]], noise: float
    ) -> float:
        """How wrong the model's change with depth has been for this arm, per depth step (log scale).

        For every two measured depths at a level, the measured ratio's disagreement with the model's is
        ``e``; ``e**2`` is the runs' noise (``noise**2 * (1/n_a + 1/n_b)``) plus the shape's error squared
        times the depths' distance squared. What is left after the noise, pooled over the pairs with a prior
        of ``SHAPE_PRIOR`` worth ``SHAPE_PRIOR_WEIGHT`` squared depth steps: a model that misses the arm's
        shape lends its depths little weight, one that fits it lends much.
        """
        num = SHAPE_PRIOR**2 * SHAPE_PRIOR_WEIGHT
        den = SHAPE_PRIOR_WEIGHT
        for i, x in enumerate(members):
            for y in members[i + 1 :]:
                dx, dy = x.spec.num_speculative_tokens, y.spec.num_speculative_tokens
                if dx == dy:
                    continue
                for label in self.labels:
                    vx, vy = x.ratios.get(label), y.ratios.get(label)
                    px, py = curves[dx].get(label, 0.0), curves[dy].get(label, 0.0)
                    if not vx or not vy or px <= 0 or py <= 0:
                        continue
                    e = math.log(central(vx) / central(vy)) - math.log(px / py)
                    num += max(0.0, e * e - noise * noise * (1 / len(vx) + 1 / len(vy)))
                    den += (dx - dy) ** 2
        return math.sqrt(num / den)
