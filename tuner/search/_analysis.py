"""What the trials so far say: baseline, per-config figures, exclusions, predictions, winner and schedule.

Everything here is recomputed from the stored trials on every call, so a planner rebuilt from storage after
a crash reaches exactly the same decisions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from tuner.domain import (
    SLO,
    FailureClass,
    LevelResult,
    Method,
    Objective,
    Purpose,
    SpecConfig,
    TrialStatus,
    arm_key,
)
from tuner.search._predict import Baseline, Candidate, Estimate, Predictor
from tuner.search._records import RETRYABLE, SEARCH, ConfigStats, Record, central
from tuner.search._space import MethodOptions, SearchSpace
from tuner.search.compat import BATCH_SCHEDULE
from tuner.search.cost_model import (
    in_flight,
    out_per_request,
)
from tuner.search.objective import combine, level_metric, slo_violation
from tuner.search.schedule import build_schedule

DEFAULT_NOISE = 0.03
# A drafter backend below this share of the same drafter's acceptance length on another backend collapsed.
COLLAPSE_SHARE = 0.6


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
        self.client_bound = self._client_bound_levels()
        # A level the client could not keep up with measured the client, not the server: it decides nothing
        # (its weight goes to the other levels) and the answer says so. When every level is, nothing is left
        # to decide on, so all stay and the answer says that instead.
        self.undecided = self.client_bound if len(self.client_bound) < len(self.labels) else {}
        self.weights = {lb: w for lb, w in self.weights.items() if lb not in self.undecided}
        search = [r for r in self.records if r.purpose in SEARCH]
        self.search_records = search
        self.baseline_runs = [r for r in search if r.spec is not None and r.spec.is_off and r.measured]
        # a failure of the baseline that no retry mends: nothing can be compared
        self.baseline_failure = next(
            (
                r.result.failure
                for r in search
                if r.purpose is Purpose.BASELINE
                and r.result is not None
                and not r.measured
                and r.result.failure is not None
                and r.result.failure.cls not in RETRYABLE
            ),
            None,
        )
        self.baseline: dict[str, LevelResult] = {}
        self.baseline_metric: dict[str, float] = {}
        self.baseline_tpot: dict[str, float] = {}  # the baseline's decode step as its requests saw it (ms)
        self.baseline_ttft: dict[str, float] = {}
        self.baseline_out: dict[str, float] = {}
        self.baseline_c: dict[str, float] = {}
        self.baseline_violation: dict[str, float] = {}
        self._baseline_figures()
        self.excluded_arms: dict[str, str] = {}
        self.failed_configs: dict[str, str] = {}
        self.caps: dict[str, int] = {}
        self._failures()
        self.stats = self._config_stats(search)
        self._collapsed(search)
        # measured even before the baseline is in (parallel runners): never proposed again
        self.measured_keys = {
            r.spec.key()
            for r in search
            if r.spec is not None and r.result is not None and r.result.status.has_figures()
        }
        if noise is not None:
            self.noise = self.level_noise = noise
        else:
            # every run counts, confirmations too (they re-measure on fresh servers)
            repeated = [st for st in self._config_stats(self.records).values() if st.runs >= 2]
            self.noise = self._estimate_noise(repeated)
            self.level_noise = self._estimate_level_noise(repeated)
        self._estimates: dict[str, dict[str, Estimate]] = {}
        self.prediction_errors = self._prediction_errors()
        self.band, self.arm_bands = self._bands()
        self.predictor = Predictor(
            space=space,
            labels=self.labels,
            weights=self.weights,
            objective=objective,
            baseline=Baseline(self.baseline_tpot, self.baseline_c, self.baseline_ttft, self.baseline_out),
            results={r.number: r.result for r in search if r.result is not None},
            stats=self.stats,
            band=self.band,
            arm_bands=self.arm_bands,
        )

    # ---------------------------------------------------------------------------------------------- inputs
    def _baseline_figures(self) -> None:
        for label in self.labels:
            lrs = [lr for r in self.baseline_runs if r.result is not None and (lr := r.result.level(label)) is not None]
            if not lrs:
                continue
            self.baseline[label] = lrs[0]
            # as every config's figure (``central``): one slow baseline run would lift every ratio at the level
            self.baseline_metric[label] = central([level_metric(lr, self.objective) for lr in lrs])
            if all(lr.tpot_ms.mean > 0 and lr.request_throughput > 0 for lr in lrs):
                tpot = statistics.fmean(lr.tpot_ms.mean for lr in lrs)
                ttft = statistics.fmean(lr.ttft_ms.mean for lr in lrs)
                self.baseline_ttft[label] = ttft
                self.baseline_tpot[label] = tpot
                self.baseline_out[label] = statistics.fmean(out_per_request(lr) for lr in lrs)
            self.baseline_c[label] = statistics.fmean(in_flight(lr) for lr in lrs)
            self.baseline_violation[label] = statistics.fmean(slo_violation(lr, self.slo) for lr in lrs)

    def _client_bound_levels(self) -> dict[str, str]:
        """Levels some trial measured while its client was the bottleneck, with the first such trial's reason."""
        out: dict[str, str] = {}
        for r in self.records:
            if r.result is None or not r.result.status.has_figures():
                continue
            for lr in r.result.levels:
                if lr.client_bound and lr.level.label in self.labels:
                    out.setdefault(lr.level.label, f"trial {r.number}: {lr.client_bound_reason or 'client-bound'}")
        return out

    @property
    def has_baseline(self) -> bool:
        return bool(self.baseline_metric) and len(self.baseline_metric) == len(self.labels)

    @property
    def can_predict(self) -> bool:
        """The step-cost model needs the baseline's decode step at every level. A level whose streams the
        client saw in one read each (TPOT 0: nothing between the first and the last token) has none; then
        every untried config counts as unmeasured rather than predicted."""
        return self.has_baseline and all(label in self.baseline_tpot for label in self.labels)

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
            if r.purpose is Purpose.CONFIRM and f.cls not in RETRYABLE:
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

    def _collapsed(self, records: Sequence[Record]) -> None:
        """A drafter backend whose acceptance length is below ``COLLAPSE_SHARE`` of the same method, draft and
        depth on another backend (ROCm attention paths have collapsed EAGLE-3's acceptance, vllm#47854) is
        dropped for that method: ``collapsed_acceptance``, a note, not a correctness failure."""
        lengths: dict[tuple[str, int], dict[str, tuple[float, int, SpecConfig]]] = {}
        for r in records:
            if r.spec is None or r.spec.is_off or not r.measured or r.result is None:
                continue
            counted = [lr.spec_decode for lr in r.result.levels if lr.spec_decode and lr.spec_decode.num_drafts]
            als = [sd.acceptance_length for sd in counted]
            if not als:
                continue
            same = arm_key(r.spec.method, r.spec.model, adaptive=r.spec.adaptive)
            by_backend = lengths.setdefault((same, r.spec.num_speculative_tokens), {})
            al = statistics.fmean(als)
            backend = r.spec.drafter_backend or "vLLM's default"
            if r.spec.target_backend:
                backend += f" (target on {r.spec.target_backend})"
            if al > by_backend.get(backend, (0.0, 0, r.spec))[0]:
                by_backend[backend] = (al, r.number, r.spec)
        for (_same, k), by_backend in lengths.items():
            best_backend, (best, _, _) = max(by_backend.items(), key=lambda kv: kv[1][0])
            for backend, (al, number, spec) in by_backend.items():
                if al >= COLLAPSE_SHARE * best:
                    continue
                reason = (
                    f"collapsed_acceptance: acceptance length {al:.2f} on {backend} in trial {number}, "
                    f"{best:.2f} on {best_backend} (k={k}; below {COLLAPSE_SHARE:.0%})"
                )
                # the backend is dropped for the method: every draft of it on the same backends
                for opt in self.space.options:
                    if (opt.method, opt.adaptive, opt.drafter_backend, opt.target_backend) == (
                        spec.method,
                        spec.adaptive,
                        spec.drafter_backend,
                        spec.target_backend,
                    ):
                        why = reason if opt.draft == spec.model else f"{reason}, with draft {spec.model}"
                        self.excluded_arms.setdefault(opt.key, why)

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

    def _estimate_noise(self, repeated: Sequence[ConfigStats]) -> float:
        """The measured run-to-run noise: pooled relative spread of repeated runs of one configuration.

        Every configuration run more than once counts: repeats in the search, and the confirmation runs,
        which re-measure the baseline, the winner and the schedule on fresh servers (with their search
        runs). Each run's objective is its weighted geometric mean of per-level ratios to the baseline's mean
        figures; the noise is the pooled standard deviation of its logarithm around each configuration's own
        mean (so the offset of one configuration against another does not count), kept within 1%-20%.
        3% (``DEFAULT_NOISE``) until there are at least two repeats to pool.
        """
        devs: list[float] = []
        for st in repeated:
            per_run = [
                combine({lb: v[i] for lb, v in st.ratios.items() if len(v) > i}, self.weights) for i in range(st.runs)
            ]
            devs.extend(_deviations([math.log(x) for x in per_run]))
        if len(devs) < 2:
            return DEFAULT_NOISE
        return max(0.01, min(0.2, math.sqrt(statistics.fmean(devs))))

    def _estimate_level_noise(self, repeated: Sequence[ConfigStats]) -> float:
        """The run-to-run noise of one level's figure (log scale): pooled over every level of every config run
        more than once, as ``_estimate_noise`` pools the objective. A level's figure is noisier than the
        objective, which averages the levels. ``DEFAULT_NOISE`` until two repeats are in."""
        devs: list[float] = []
        for st in repeated:
            for vals in st.ratios.values():
                devs.extend(_deviations([math.log(v) for v in vals if v > 0]))
        if len(devs) < 2:
            return DEFAULT_NOISE
        # the median squared deviation over that of a normal's (0.455): a slow run among them does not make
        # every run look as noisy as it
        return max(0.01, min(0.2, math.sqrt(statistics.median(devs) / 0.455)))

    def estimate(self, st: ConfigStats) -> dict[str, Estimate]:
        """A measured config's pooled figure per level (``Predictor.pooled``); off is 1 by definition, as
        uncertain as the baseline's runs."""
        key = f"{st.spec.key()}#{st.runs}"  # the search's stats, or with the confirmation runs too
        if key not in self._estimates:
            own = st.spec.key()
            if st.spec.is_off:
                n = max(1, st.runs)
                self._estimates[key] = {lb: Estimate(1.0, self.level_noise**2 / n) for lb in self.labels}
            elif self.can_predict:
                self._estimates[key] = self.predictor.pooled(st, self.level_noise)
            else:
                self._estimates[key] = {
                    lb: Estimate(v, (nv := self.level_noise**2 / len(st.ratios[lb])), {own: (1.0, nv)})
                    for lb, v in st.per_level().items()
                }
        return self._estimates[key]

    def level_estimates(self, label: str) -> list[tuple[Estimate, ConfigStats]]:
        """Every eligible static config measured at ``label``, with its pooled figure there (``estimate``)."""
        return [
            (est[label], st)
            for st in self.stats.values()
            if st.spec.schedule is None and self.eligible(st) and label in (est := self.estimate(st))
        ]

    def _prediction_errors(self) -> dict[str, list[float]]:
        """The prediction-error log, per arm: for every search trial proposed with a prediction and then
        measured, |log(measured / predicted)| at each level (its own run against the baseline's mean)."""
        out: dict[str, list[float]] = {}
        if not self.has_baseline:
            return out
        for r in self.search_records:
            if not r.predicted or not r.measured or r.spec is None or r.result is None:
                continue
            for label, pred in r.predicted.items():
                lr = r.result.level(label)
                if lr is None or label not in self.baseline_metric or pred <= 0:
                    continue
                got = level_metric(lr, self.objective) / self.baseline_metric[label]
                if got > 0:
                    out.setdefault(r.spec.arm, []).append(abs(math.log(got / pred)))
        return out

    def _band(self, errors: Sequence[float]) -> float:
        """How far a prediction may be off: the root mean square of the logged errors, never below the noise
        (a prediction is checked against one noisy run)."""
        return max(self.noise, math.sqrt(statistics.fmean(e * e for e in errors)))

    def _bands(self) -> tuple[float, dict[str, float]]:
        """The band for an arm with no checked prediction (all arms' errors pooled once two trials have been
        checked, else a prior of twice the noise) and each checked arm's own: one arm's misses (a lookup
        proposer's match rate, say) do not make every other arm's predictions look worse."""
        checked = sum(1 for r in self.search_records if r.predicted and r.measured)
        pooled = [e for errs in self.prediction_errors.values() for e in errs]
        default = self._band(pooled) if checked >= 2 and pooled else 2 * self.noise
        return default, {arm: self._band(errs) for arm, errs in self.prediction_errors.items() if errs}

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
                per_level, margin = self.predict(opt, spec)
                if per_level is None:
                    out.append(Candidate(spec, opt, None, None, math.inf))
                else:
                    value = combine(per_level, self.weights)
                    out.append(Candidate(spec, opt, per_level, value, value * (1 + margin), margin))
        return out

    def predict(self, opt: MethodOptions, spec: SpecConfig) -> tuple[dict[str, float] | None, float]:
        if not self.can_predict:
            return None, math.inf
        return self.predictor.predict(opt, spec)

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
        """The objective from the pooled per-level figures (``estimate``)."""
        return combine({lb: e.value for lb, e in self.estimate(st).items()}, self.weights)

    def ranked(self) -> list[ConfigStats]:
        """Eligible static configs (no schedule), best objective first; off always present once measured."""
        rows = [st for st in self.stats.values() if st.spec.schedule is None and self.eligible(st)]
        return sorted(rows, key=lambda st: (-self.speedup(st), st.numbers[0]))

    def incumbent(self) -> ConfigStats | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def threshold(self) -> float:
        """An untried candidate is worth a trial when its optimistic prediction beats this."""
        inc = self.incumbent()
        base = self.speedup(inc) if inc is not None else 1.0
        return max(1.0, base) * (1 + self.noise)

    # -------------------------------------------------------------------------------------- the answer
    def winner(self) -> ConfigStats | None:
        """Best eligible static config from the search trials (off if nothing else was measured)."""
        return self.incumbent()

    def schedule_arm(self) -> ConfigStats | None:
        """The static config whose method+draft (and ngram lookup window) a schedule may vary K for.

        A schedule varies K for one method and one draft, chosen by the objective over all levels: the arm of
        the static winner, or, when "off" wins, of the best speculative static config (a schedule with K = 0
        at the levels where speculation loses may still beat off). Per-level winners of other arms cannot
        be part of it (the outcome's notes say when they differ).
        """
        return next((st for st in self.ranked() if not st.spec.is_off), None)

    def schedule(self) -> tuple[SpecConfig | None, float, dict[str, float], list[str]]:
        """The per-batch-size schedule over the arm of ``schedule_arm`` (None if K would not vary).

        At each level the depth with the best measured (or, for untried fixed-length depths, predicted)
        speedup; K = 0 where no depth beats off at that level (assumed to run like off: the confirmation runs
        check it). Returns the schedule, its predicted objective, its per-level predictions and notes.
        """
        concurrency = {label: c for label in self.labels if (c := self.concurrency.get(label)) is not None}
        if any(label not in concurrency for label in self.labels):
            return None, 0.0, {}, ["no schedule: some levels are not closed-loop concurrencies"]
        static = self.schedule_arm()
        opt = self.option_of(static.spec) if static is not None else None
        if self.space.schedule_refusal is not None:
            return None, 0.0, {}, [f"no schedule: {self.space.schedule_refusal}"]
        if opt is not None and not opt.method.supports_batch_schedule:
            return None, 0.0, {}, [f"no schedule: vLLM takes no per-batch-size K for {opt.method.value}"]
        if opt is not None and (refusal := self.space.option_refusal(opt.method, BATCH_SCHEDULE)) is not None:
            return None, 0.0, {}, [f"no schedule: {refusal}"]
        if opt is not None and opt.adaptive:
            return None, 0.0, {}, ["no schedule: adaptive verification sizes the verification budget itself"]
        if static is None or opt is None or opt.key in self.excluded_arms:
            return None, 0.0, {}, []
        lookup = (static.spec.prompt_lookup_min, static.spec.prompt_lookup_max) if opt.lookups else None
        cap = self.caps.get(opt.key)
        arm = self.predictor.arm(opt, lookup) if opt.fixed_length else None
        picks: dict[str, tuple[int, float]] = {}
        for label in self.labels:
            choice = (0, 1.0)
            for spec in (opt.spec(k, lookup) for k in opt.depths):
                if cap is not None and spec.num_speculative_tokens >= cap:
                    continue
                st = self.stats.get(spec.key())
                if st is not None:
                    if not self.eligible(st) or label not in st.per_level():
                        continue
                    s = st.per_level()[label]
                elif opt.fixed_length and spec.key() not in self.failed_configs:
                    per_level, _ = self.predict(opt, spec)
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
            k = max(ks.values())
            why = f"K = {k} is best at every level" if k else "no depth beats off at any level"
            return (
                None,
                0.0,
                {},
                [f"no schedule for {opt.key}{f' lookup={lookup[0]}-{lookup[1]}' if lookup else ''}: {why}"],
            )
        lo, hi = lookup if lookup else (None, None)
        spec = SpecConfig(
            method=opt.method,
            num_speculative_tokens=max(ks.values()),
            model=opt.draft,
            prompt_lookup_min=lo,
            prompt_lookup_max=hi,
            schedule=build_schedule({int(concurrency[lb]): k for lb, k in ks.items()}, self.max_num_seqs),
        )
        per_level = {label: s for label, (_, s) in picks.items()}
        return spec, combine(per_level, self.weights), per_level, []


def _deviations(logs: Sequence[float]) -> list[float]:
    """Each run's squared deviation from its config's mean (log scale), scaled by n / (n - 1) so their mean is
    the unbiased variance; nothing from fewer than two runs (a ratio of 0 is no run to compare)."""
    if len(logs) < 2:
        return []
    mean = statistics.fmean(logs)
    return [(x - mean) ** 2 * len(logs) / (len(logs) - 1) for x in logs]
