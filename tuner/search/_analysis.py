"""What the trials so far say: baseline, per-config figures, exclusions, predictions, winner and schedule.

Everything here is recomputed from the stored trials on every call, so a planner rebuilt from storage after
a crash reaches exactly the same decisions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner.domain import (
    SLO,
    FailureClass,
    LevelResult,
    Method,
    Objective,
    SpecConfig,
    TrialResult,
    TrialStatus,
)
from tuner.search._space import MethodOptions, SearchSpace
from tuner.search.cost_model import (
    BLOCK,
    CHAIN,
    LOOKUP,
    CostPoint,
    StepCost,
    closed_loop_gain,
    fit,
    in_flight,
    out_per_request,
    overhead_ms,
    prefill_share,
    raw_step,
)
from tuner.search.extrapolation import AcceptanceCurve
from tuner.search.objective import combine, level_metric, slo_violation
from tuner.search.schedule import build_schedule

DEFAULT_NOISE = 0.03
SEARCH = ("baseline", "search")
# Failure classes that say nothing about the configuration: the same config is queued again (at most twice).
RETRYABLE = {FailureClass.INFRA, FailureClass.CANCELLED}
MAX_RETRIES = 2
MAX_SEARCH_REPEATS = 2


@dataclass
class Record:
    """One stored Optuna trial as the planner sees it."""

    number: int
    state: str  # optuna TrialState name
    spec: SpecConfig | None
    purpose: str
    result: TrialResult | None = None
    skipped: str | None = None  # never launched (fail-fast)
    abandoned: str | None = None
    retry_of: int | None = None

    @property
    def pending(self) -> bool:
        return self.state in {"RUNNING", "WAITING"} and self.result is None and not self.skipped

    @property
    def measured(self) -> bool:
        return self.result is not None and self.result.status is TrialStatus.SUCCEEDED

    @property
    def launched(self) -> bool:
        """Counts against the trial budget: proposed and not a not-launched/infrastructure failure."""
        if self.skipped or self.abandoned or self.spec is None:
            return False
        if self.result is None:
            return self.pending
        f = self.result.failure
        return not (f is not None and (f.cls is FailureClass.UNSUPPORTED or f.cls in RETRYABLE))


@dataclass
class ConfigStats:
    spec: SpecConfig
    numbers: list[int] = field(default_factory=list)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # per level, per run: metric / baseline
    violations: dict[str, list[float]] = field(default_factory=dict)
    diverged: bool = False

    def per_level(self) -> dict[str, float]:
        return {label: statistics.fmean(v) for label, v in self.ratios.items() if v}

    @property
    def runs(self) -> int:
        return len(self.numbers)


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


class Analysis:
    def __init__(
        self,
        space: SearchSpace,
        records: Sequence[Record],
        *,
        labels: Sequence[str],
        weights: Mapping[str, float],
        objective: Objective,
        slo: SLO,
        noise: float | None,
        concurrency: Mapping[str, int | None],
        max_num_seqs: int | None = None,
    ) -> None:
        self.space = space
        self.records = list(records)
        self.labels = list(labels)
        self.weights = dict(weights)
        self.objective = objective
        self.slo = slo
        self.concurrency = dict(concurrency)
        self.max_num_seqs = max_num_seqs
        self.notes: list[str] = []
        search = [r for r in self.records if r.purpose in SEARCH]
        self.search_records = search
        self.baseline_runs = [r for r in search if r.spec is not None and r.spec.is_off and r.measured]
        self.baseline_failed = next(
            (r for r in search if r.purpose == "baseline" and r.result is not None and not r.measured
             and r.result.failure is not None and r.result.failure.cls not in RETRYABLE),
            None,
        )
        self.baseline: dict[str, LevelResult] = {}
        self.baseline_metric: dict[str, float] = {}
        self.baseline_tpot: dict[str, float] = {}  # raw decode step of the baseline (ms)
        self.baseline_prefill: dict[str, float] = {}  # GPU ms of prefill per request
        self.baseline_out: dict[str, float] = {}
        self.baseline_c: dict[str, float] = {}
        self.baseline_violation: dict[str, float] = {}
        self._baseline_figures()
        self.excluded_arms: dict[str, str] = {}
        self.failed_configs: dict[str, str] = {}
        self.caps: dict[str, int] = {}
        self._failures()
        self.stats = self._config_stats(search)
        # measured even before the baseline is in (parallel runners): never proposed again
        self.measured_keys = {
            r.spec.key() for r in search
            if r.spec is not None and r.result is not None and r.result.status.has_figures()
        }
        self.noise = noise if noise is not None else self._estimate_noise()
        self._models: dict[tuple[str, str], ArmModel | None] = {}

    # ---------------------------------------------------------------------------------------------- inputs
    def _baseline_figures(self) -> None:
        for label in self.labels:
            lrs = [lr for r in self.baseline_runs if (lr := r.result.level(label)) is not None]
            if not lrs:
                continue
            self.baseline[label] = lrs[0]
            self.baseline_metric[label] = statistics.fmean(level_metric(lr, self.objective) for lr in lrs)
            if all(lr.tpot_ms.mean > 0 and lr.request_throughput > 0 for lr in lrs):
                tpot = statistics.fmean(lr.tpot_ms.mean for lr in lrs)
                ttft = statistics.fmean(lr.ttft_ms.mean for lr in lrs)
                rate = statistics.fmean(lr.request_throughput for lr in lrs) / 1000.0
                self.baseline_prefill[label] = prefill_share(ttft, tpot, rate)
                self.baseline_tpot[label] = raw_step(tpot, 1.0, rate, self.baseline_prefill[label])
                self.baseline_out[label] = statistics.fmean(out_per_request(lr) for lr in lrs)
            self.baseline_c[label] = statistics.fmean(in_flight(lr) for lr in lrs)
            self.baseline_violation[label] = statistics.fmean(slo_violation(lr, self.slo) for lr in lrs)

    @property
    def has_baseline(self) -> bool:
        return bool(self.baseline_metric) and len(self.baseline_metric) == len(self.labels)

    def option_of(self, spec: SpecConfig) -> MethodOptions | None:
        return self.space.option_for(spec)

    def _failures(self) -> None:
        for r in self.records:
            if r.spec is None or r.spec.is_off or r.result is None:
                continue
            opt = self.option_of(r.spec)
            arm = opt.key if opt else r.spec.method.value
            if r.result.status is TrialStatus.DIVERGED:
                self.excluded_arms.setdefault(arm, f"outputs diverged from the baseline in trial {r.number}")
                self.failed_configs.setdefault(r.spec.key(), f"outputs diverged from the baseline in trial {r.number}")
                continue
            f = r.result.failure
            if r.result.status is not TrialStatus.FAILED or f is None:
                if r.result.status is TrialStatus.SKIPPED:
                    self.failed_configs.setdefault(r.spec.key(), "skipped by the runner")
                continue
            if r.purpose == "confirm" and f.cls not in RETRYABLE:
                self.failed_configs.setdefault(r.spec.key(), f"{f.cls.value} on a confirmation run ({f.reason})")
            elif f.cls is FailureClass.UNSUPPORTED:
                self.excluded_arms.setdefault(arm, f"unsupported: {f.reason}")
            elif f.cls is FailureClass.OOM and r.spec.schedule is None:
                k = r.spec.num_speculative_tokens
                self.caps[arm] = min(self.caps.get(arm, k), k)
            elif f.cls in {FailureClass.CRASH, FailureClass.STARTUP_TIMEOUT}:
                self.excluded_arms.setdefault(arm, f"{f.cls.value} at start in trial {r.number}: {f.reason}")
            elif f.cls not in RETRYABLE:
                self.failed_configs.setdefault(r.spec.key(), f"{f.cls.value} in trial {r.number}: {f.reason}")

    def _config_stats(self, records: Sequence[Record]) -> dict[str, ConfigStats]:
        out: dict[str, ConfigStats] = {}
        if not self.has_baseline:
            return out
        for r in records:
            if r.spec is None or r.result is None or not r.result.status.has_figures():
                continue
            st = out.setdefault(r.spec.key(), ConfigStats(r.spec))
            st.numbers.append(r.number)
            st.diverged |= r.result.status is TrialStatus.DIVERGED
            for label in self.labels:
                lr = r.result.level(label)
                if lr is None:
                    continue
                st.ratios.setdefault(label, []).append(level_metric(lr, self.objective) / self.baseline_metric[label])
                st.violations.setdefault(label, []).append(slo_violation(lr, self.slo))
        return out

    def _estimate_noise(self) -> float:
        """Pooled relative spread of repeated measurements of one config; 3% until there are repeats."""
        devs: list[float] = []
        for st in self.stats.values():
            if st.runs < 2:
                continue
            per_run = [
                combine({lb: v[i] for lb, v in st.ratios.items() if len(v) > i}, self.weights) for i in range(st.runs)
            ]
            logs = [math.log(x) for x in per_run]
            mean = statistics.fmean(logs)
            devs.extend((x - mean) ** 2 * st.runs / (st.runs - 1) for x in logs)
        if len(devs) < 2:
            return DEFAULT_NOISE
        return max(0.01, min(0.2, math.sqrt(statistics.fmean(devs))))

    # ----------------------------------------------------------------------------------------- feasibility
    def infeasible_levels(self, st: ConfigStats) -> list[str]:
        """Levels where this config breaks a p99 SLO the baseline meets (levels the baseline breaks too are
        a capacity problem speculation is not asked to solve, and are ignored)."""
        if self.slo.is_empty():
            return []
        bad = []
        for label, v in st.violations.items():
            if v and statistics.fmean(v) > 0 and self.baseline_violation.get(label, -1.0) <= 0:
                bad.append(label)
        return bad

    def eligible(self, st: ConfigStats) -> bool:
        return (
            not st.diverged
            and not self.infeasible_levels(st)
            and st.spec.key() not in self.failed_configs
            and (st.spec.is_off or (self.option_of(st.spec) is not None))
        )

    def speedup(self, st: ConfigStats) -> float:
        return combine(st.per_level(), self.weights)

    def ranked(self) -> list[ConfigStats]:
        """Eligible static configs (no schedule), best objective first; off always present once measured."""
        rows = [st for st in self.stats.values() if st.spec.schedule is None and self.eligible(st)]
        return sorted(rows, key=lambda st: (-self.speedup(st), st.numbers[0]))

    def incumbent(self) -> ConfigStats | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    # ------------------------------------------------------------------------------------------ prediction
    def _arm_model(self, opt: MethodOptions, lookup: tuple[int, int] | None) -> ArmModel | None:
        key = (opt.key, repr(lookup))
        if key not in self._models:
            self._models[key] = self._fit_arm(opt, lookup)
        return self._models[key]

    def _fit_arm(self, opt: MethodOptions, lookup: tuple[int, int] | None) -> ArmModel | None:
        numbers = {
            n for st in self.stats.values()
            if st.spec.schedule is None and self.option_of(st.spec) is opt and not st.diverged
            and (lookup is None or (st.spec.prompt_lookup_min, st.spec.prompt_lookup_max) == lookup)
            for n in st.numbers
        }
        results = [r.result for r in self.search_records if r.number in numbers and r.result is not None]
        if not results or not self.baseline_tpot:
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
        kind = BLOCK if opt.method in {Method.DFLASH, Method.DSPARK} else (CHAIN if fixed else LOOKUP)
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
            curve=curve, costs=costs, depth=depth, rate=rate, per_proposal=per_proposal, fixed=fixed,
            unbiased=fixed or use_steps, block=kind == BLOCK,
            ttft={label: statistics.fmean(v) for label, v in ttft.items()},
            prefill={label: statistics.fmean(v) for label, v in prefill.items()},
            measured={
                st.spec.num_speculative_tokens: st.per_level() for st in self.stats.values()
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
                t_off, step, tau, c=c, prefill=self.baseline_prefill[label], out_tokens=self.baseline_out[label],
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
            label: model[label] * arm.measured[d][label] / at_d[label] if label in arm.measured[d] and at_d[label] > 0
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
        if arm is None or not self.has_baseline:
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

    def threshold(self) -> float:
        """An untried candidate is worth a trial when its optimistic prediction beats this."""
        inc = self.incumbent()
        base = self.speedup(inc) if inc is not None else 1.0
        return max(1.0, base) * (1 + self.noise)

    # -------------------------------------------------------------------------------------- the answer
    def winner(self) -> ConfigStats | None:
        """Best eligible static config from the search trials (off if nothing else was measured)."""
        return self.incumbent()

    def schedule(self) -> tuple[SpecConfig | None, float, dict[str, float], list[str]]:
        """The best per-batch-size schedule over one method+draft (None if K would not vary)."""
        notes: list[str] = []
        if any(self.concurrency.get(label) is None for label in self.labels):
            return None, 0.0, {}, ["no schedule: some levels are not closed-loop concurrencies"]
        best: tuple[float, SpecConfig, dict[str, float]] | None = None
        for opt in self.space.options:
            if not opt.method.supports_batch_schedule or opt.key in self.excluded_arms:
                continue
            for lookup in opt.lookups or (None,):
                picks: dict[str, tuple[int, float]] = {}
                for label in self.labels:
                    choice = (0, 1.0)
                    for spec in (opt.spec(k, lookup) for k in opt.depths):
                        cap = self.caps.get(opt.key)
                        if cap is not None and spec.num_speculative_tokens >= cap:
                            continue
                        st = self.stats.get(spec.key())
                        if st is not None:
                            if not self.eligible(st) or label not in st.per_level():
                                continue
                            s = st.per_level()[label]
                        elif opt.fixed_length and spec.key() not in self.failed_configs:
                            per_level, _ = self.predict(opt, spec)
                            arm = self._arm_model(opt, lookup)
                            if per_level is None or arm is None or spec.num_speculative_tokens > arm.depth:
                                continue
                            s = per_level[label]
                        else:
                            continue
                        if s > choice[1]:
                            choice = (spec.num_speculative_tokens, s)
                    picks[label] = choice
                ks = {label: k for label, (k, _) in picks.items()}
                if len(set(ks.values())) < 2 or max(ks.values()) == 0:
                    continue
                value = combine({label: s for label, (_, s) in picks.items()}, self.weights)
                by_c = {int(self.concurrency[label]): k for label, k in ks.items()}
                lo, hi = lookup if lookup else (None, None)
                spec = SpecConfig(
                    method=opt.method, num_speculative_tokens=max(ks.values()), model=opt.draft,
                    prompt_lookup_min=lo, prompt_lookup_max=hi,
                    schedule=build_schedule(by_c, self.max_num_seqs),
                )
                if best is None or value > best[0]:
                    best = (value, spec, {label: s for label, (_, s) in picks.items()})
        if best is None:
            return None, 0.0, {}, notes
        return best[1], best[0], best[2], notes
