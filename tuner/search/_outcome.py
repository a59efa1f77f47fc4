"""Turning the analysed trials into a ``TuneOutcome``: best, schedule, per-level winners, skipped, notes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.domain import (
    Engine,
    LevelWinner,
    Purpose,
    SkippedCandidate,
    SpecConfig,
    Speedup,
    TrialResult,
    TuneOutcome,
)
from tuner.search import _confirm
from tuner.search._analysis import Analysis
from tuner.search._records import ConfigStats, Record, pending_keys
from tuner.search._space import SearchSpace
from tuner.search.objective import combine, level_metric


@dataclass(frozen=True)
class OutcomeContext:
    """What the outcome needs besides the trials: the space, how often a target is confirmed, why the
    search stopped (None: it has not) and the engine the figures came from."""

    space: SearchSpace
    confirm_runs: int
    finished: str | None
    engine: Engine
    confirm_done: bool = False


def speedup_of(a: Analysis, runs: Sequence[TrialResult], baselines: Sequence[TrialResult]) -> Speedup | None:
    """A config's speedup over every run of it (search and confirmation, each on a fresh server) against the
    baseline's runs: mean, min and max of the per-run objective, per-level means."""
    per_run = _confirm.per_run_speedups(a, runs, baselines)
    if not per_run:
        return None
    per_level: dict[str, list[float]] = {}
    for label in a.labels:
        base = [level_metric(lr, a.objective) for b in baselines if (lr := b.level(label)) is not None]
        vals = [level_metric(lr, a.objective) for r in runs if (lr := r.level(label)) is not None]
        if base and vals:
            per_level[label] = [v / statistics.fmean(base) for v in vals]
    return Speedup(
        mean=statistics.fmean(per_run),
        low=min(per_run),
        high=max(per_run),
        runs=len(per_run),
        per_level={label: statistics.fmean(v) for label, v in per_level.items()},
    )


def search_speedup(a: Analysis, st: ConfigStats) -> Speedup:
    per_run = [combine({lb: v[i] for lb, v in st.ratios.items() if len(v) > i}, a.weights) for i in range(st.runs)]
    return Speedup(mean=a.speedup(st), low=min(per_run), high=max(per_run), runs=st.runs, per_level=st.per_level())


def per_level_winners(a: Analysis, records: Sequence[Record]) -> tuple[LevelWinner, ...]:
    """Best eligible static config at each level, read from every trial (search and confirmation).

    A per-range answer is a static config: a schedule is measured once or a few times, as a whole, to judge
    the all-ranges answer, and one lucky run of it at a level must not outbid the static configs measured
    and re-measured there (it did, by up to 10% below the level's optimum, on the benchmark's noisy family).
    Configs are compared on their pooled figures (``Analysis.estimate``: the arm's other depths lend theirs
    through the model), and the answer's speedup is what its own runs measured.
    """
    stats = a._config_stats(records)
    out = []
    for label in a.labels:
        if label in a.undecided:
            continue  # measured the client's ceiling: no per-range answer from it
        scored = [
            (a.estimate(st)[label].value, st)
            for st in stats.values()
            if st.spec.schedule is None and _eligible_at(a, st, label)
        ]
        if not scored:
            continue
        best = max(s for s, _ in scored)
        # a 1% tie goes to the smaller K (off is K = 0), as in vLLM's tune_speculative_k: cheaper to run and
        # less to lose when acceptance drifts
        _, _, st = min(
            ((_k_at(a, st.spec, label), st.numbers[0], st) for s, st in scored if s >= best / 1.01),
            key=lambda t: (t[0], t[1]),
        )
        measured = 1.0 if st.spec.is_off else st.per_level()[label]
        out.append(LevelWinner(label, st.spec, measured, st.numbers[0]))
    return tuple(out)


def _k_at(a: Analysis, spec: SpecConfig, label: str) -> int:
    c = a.concurrency.get(label)
    return 0 if spec.is_off else spec.k_at(int(c)) if c else spec.num_speculative_tokens


def _eligible_at(a: Analysis, st: ConfigStats, label: str) -> bool:
    """Measured at ``label``, never diverged or failed, and within the SLOs there where the baseline is."""
    if st.diverged or st.spec.key() in a.failed_configs or label not in st.per_level():
        return False
    v = st.violations.get(label) or [0.0]
    return a.slo.is_empty() or statistics.fmean(v) <= 0 or a.baseline_violation.get(label, -1) > 0


def _short(spec: SpecConfig) -> str:
    if spec.is_off:
        return "off"
    return f"{spec.method.value} k={spec.num_speculative_tokens}" + (" (schedule)" if spec.schedule else "")


def build_outcome(ctx: OutcomeContext, a: Analysis, records: Sequence[Record]) -> tuple[TuneOutcome, Speedup | None]:
    notes: list[str] = []
    noise = a.noise
    notes.append(
        f"objective {a.objective.value}: weighted geometric mean over levels of the per-level speedup vs the "
        f"baseline (weights {', '.join(f'{k}={v:g}' for k, v in a.weights.items())}); noise taken as {noise:.1%}"
    )
    finished = ctx.finished
    if finished:
        notes.append(f"search stopped: {finished}")
    baseline_trial = a.baseline_runs[0].number if a.baseline_runs else None
    engine = ctx.engine
    winners = per_level_winners(a, records) if a.has_baseline else ()
    if not a.has_baseline:
        notes.append(
            "no baseline figures yet: nothing to compare"
            if a.baseline_failure is None
            else "the baseline failed: no speculative configuration can be compared"
        )
        return TuneOutcome(
            best=SpecConfig(),
            schedule=None,
            per_level_winners=(),
            speedup=None,
            baseline_trial=baseline_trial,
            best_trial=None,
            notes=tuple(notes),
            engine=engine,
            noise=a.noise,
            skipped=_skipped(ctx, a, records),
            confirm_trials=_confirm_numbers(records),
            grid_size=ctx.space.grid_size,
        ), None

    baselines = _confirm.runs_of(records, SpecConfig())
    best, best_trial, speedup = _static_best(ctx, a, records, baselines, notes)
    schedule, speedup, sched_speedup = _schedule(ctx, a, records, baselines, best, speedup, notes)
    # The all-ranges answer never loses to off at levels carrying most (over half) of the weight; where it loses
    # elsewhere, the outcome says where and by how much (the per-range answers give off there).
    losses: dict[str, float] = {}
    for _ in range(2):
        deployed = schedule or best
        if deployed.is_off:
            break
        losses = _losses(a, speedup)
        if _loss_share(a, losses) <= 0.5:
            break
        where = ", ".join(f"{lb} {v:.3f}x" for lb, v in losses.items())
        notes.append(
            f"not deployed: {deployed.label()} is slower than off at levels carrying "
            f"{_loss_share(a, losses):.0%} of the weight ({where})"
        )
        losses = {}
        if schedule is not None:
            schedule, speedup = None, _static_best(ctx, a, records, baselines, [])[2]
        else:
            best, best_trial = SpecConfig(), baseline_trial
            speedup = Speedup(1.0, 1.0, 1.0, len(baselines), dict.fromkeys(a.labels, 1.0))
    if losses:
        notes.append(
            f"{(schedule or best).label()} is slower than off at "
            + ", ".join(f"{lb} ({v:.3f}x, {1 - v:.1%} slower)" for lb, v in losses.items())
            + "; deploy the per-range answers there"
        )
    if schedule is None and best.is_off:
        notes.append("do not speculate: nothing beats the baseline beyond noise")

    labels = [w.level for w in winners]
    arms = {_arm(w.spec) for w in winners}
    if len(arms) > 1:
        sched_arm = a.schedule_arm()
        one = (
            f"; a schedule varies K for one method+draft only, the best over all levels: {_arm(sched_arm.spec)}"
            if sched_arm is not None
            else ""
        )
        notes.append(
            "per-level winners differ: " + ", ".join(f"{_short(w.spec)} wins at {w.level}" for w in winners) + one
        )
    elif winners:
        notes.append(f"one method+draft wins at every level ({', '.join(labels)}): {_arm(winners[0].spec)}")
    model = a.predictor.step_model() if a.can_predict else None
    errors = [e for errs in a.prediction_errors.values() for e in errs]
    if model is not None and model.residuals:
        res = math.sqrt(statistics.fmean(r * r for r in model.residuals))
        checked = (
            f"; predictions checked against measurements: {len(errors)} per-level, error RMS "
            f"{math.sqrt(statistics.fmean(e * e for e in errors)):.1%}"
            if errors
            else ""
        )
        notes.append(
            f"step-cost model: residual RMS {res:.1%} over {len(model.residuals)} speculative level figures{checked}"
        )
    for label, reason in a.client_bound.items():
        if label in a.undecided:
            notes.append(f"{label} decided nothing: the client could not keep up ({reason}); not measured")
        else:
            notes.append(
                f"{label}: the client could not keep up ({reason}); every level was client-bound, so these "
                "figures are the client's ceiling, not the server's: re-run with more client processes"
            )
    for arm, reason in a.excluded_arms.items():
        notes.append(f"{arm} excluded: {reason}")
    for arm, cap in a.caps.items():
        notes.append(f"{arm}: out of memory at depth {cap}; only depths below {cap} tried")
    for ex in ctx.space.excluded:
        notes.append(f"{ex.method.value}{'@' + ex.draft if ex.draft else ''} not in the space: {ex.reason}")
    if (note := _catalog_note(ctx, schedule or best, engine)) is not None:
        notes.append(note)
    outcome = TuneOutcome(
        best=best,
        schedule=schedule,
        per_level_winners=winners,
        speedup=speedup,
        baseline_trial=baseline_trial,
        best_trial=best_trial,
        confirm_trials=_confirm_numbers(records),
        skipped=_skipped(ctx, a, records),
        notes=tuple(notes),
        engine=engine,
        noise=a.noise,
        deployed_losses=losses,
        grid_size=ctx.space.grid_size,
    )
    return outcome, sched_speedup


def _static_best(
    ctx: OutcomeContext,
    a: Analysis,
    records: Sequence[Record],
    baselines: Sequence[TrialResult],
    notes: list[str],
) -> tuple[SpecConfig, int | None, Speedup]:
    """The static best, its search trial and its speedup over all its runs: "off" unless the median minus
    the MAD of its per-run speedups beats the baseline beyond noise."""
    noise = a.noise
    baseline_trial = a.baseline_runs[0].number if a.baseline_runs else None
    off = Speedup(1.0, 1.0, 1.0, len(baselines), dict.fromkeys(a.labels, 1.0))
    win = a.winner()
    if win is None or win.spec.is_off:
        if win is not None:
            notes.append("off: no static speculative configuration measured beats the baseline")
        return SpecConfig(), baseline_trial, off
    runs = _confirm.runs_of(records, win.spec)
    speedup = speedup_of(a, runs, baselines) or search_speedup(a, win)
    score = _confirm.robust_score(_confirm.per_run_speedups(a, runs, baselines))
    if score <= 1 + noise:
        notes.append(
            f"off: the best configuration found ({win.spec.label()}) measured {speedup.mean:.3f}x "
            f"({speedup.low:.3f}-{speedup.high:.3f}) over {speedup.runs} run(s), median minus MAD {score:.3f}x: "
            f"within noise ({noise:.1%}) of the baseline"
        )
        return SpecConfig(), baseline_trial, off
    if not ctx.confirm_done:
        notes.append(f"unconfirmed: speedup of {win.spec.label()} from {speedup.runs} run(s); confirmation pending")
    return win.spec, win.numbers[0], speedup


def _schedule(
    ctx: OutcomeContext,
    a: Analysis,
    records: Sequence[Record],
    baselines: Sequence[TrialResult],
    best: SpecConfig,
    speedup: Speedup,
    notes: list[str],
) -> tuple[SpecConfig | None, Speedup, Speedup | None]:
    """The schedule to deploy (or None), the speedup of what is deployed, and the schedule's own speedup.

    A schedule is deployed only once it has been run (it never is in the search) and the confirmation is
    done, when the median minus the MAD of its runs beats the baseline beyond noise and is at least the
    static best's (a 1% tie goes to the static config: fewer moving parts).
    """
    noise = a.noise
    sched, value, _, sched_notes = a.schedule()
    notes.extend(sched_notes)
    if sched is None:
        return None, speedup, None
    runs = _confirm.runs_of(records, sched)
    own = speedup_of(a, runs, baselines) if runs else None
    label = sched.label()
    if own is None or not ctx.confirm_done:
        if value <= 1 + noise:
            notes.append(
                f"no schedule: the best one ({label}, {value:.3f}x predicted) does not beat the baseline beyond noise"
            )
        elif ctx.confirm_runs <= 0:
            notes.append(
                f"no schedule: {label} ({value:.3f}x predicted) is deployed only after it has been run, and "
                "confirm_runs is 0"
            )
        else:
            notes.append(f"no schedule yet: {label} ({value:.3f}x predicted) is deployed only after it has been run")
        return None, speedup, own
    score = _confirm.robust_score(_confirm.per_run_speedups(a, runs, baselines))
    static_runs = _confirm.runs_of(records, best) if not best.is_off else []
    static_score = _confirm.robust_score(_confirm.per_run_speedups(a, static_runs, baselines)) if static_runs else 1.0
    measured = f"{own.mean:.3f}x ({own.low:.3f}-{own.high:.3f}) over {own.runs} run(s)"
    static = "off" if best.is_off else f"the static best's {static_score:.3f}x ({best.label()})"
    if score <= 1 + noise:
        notes.append(f"no schedule: {label} measured {measured}, within noise ({noise:.1%}) of the baseline")
        return None, speedup, own
    if not best.is_off and score < static_score * 1.01:
        notes.append(
            f"no schedule: {label} measured {measured} (median minus MAD {score:.3f}x), not 1% above {static}; "
            "the static best is deployed"
        )
        return None, speedup, own
    notes.append(f"schedule {label}: {measured} vs {static}; the schedule is deployed and the speedup is its own")
    return sched, own, own


def _losses(a: Analysis, speedup: Speedup) -> dict[str, float]:
    """Levels where a config's per-level mean is below off beyond noise."""
    return {label: v for label, v in speedup.per_level.items() if label not in a.undecided and v < 1.0 / (1 + a.noise)}


def _loss_share(a: Analysis, losses: dict[str, float]) -> float:
    total = sum(a.weights.values()) or 1.0
    return sum(a.weights.get(label, 0.0) for label in losses) / total


def _catalog_note(ctx: OutcomeContext, deployed: SpecConfig, engine: Engine) -> str | None:
    """Where a deployed draft from the built-in catalog comes from, and whether this job is evidence for it."""
    opt = ctx.space.option_for(deployed)
    if opt is None or opt.source != "catalog" or opt.draft is None:
        return None
    evidence = (
        "this job ran it on vLLM: cite the job to set the catalog entry's 'verified' flag"
        if engine is Engine.VLLM
        else "simulated here, so not evidence for it"
    )
    return (
        f"draft {opt.draft} comes from the built-in catalog ({opt.source_url}; verified: {bool(opt.verified)}); "
        f"{evidence}"
    )


def _arm(spec: SpecConfig) -> str:
    return "off" if spec.is_off else spec.arm


def _confirm_numbers(records: Sequence[Record]) -> tuple[int, ...]:
    return tuple(r.number for r in records if r.purpose is Purpose.CONFIRM and r.result is not None)


def _skipped(ctx: OutcomeContext, a: Analysis, records: Sequence[Record]) -> tuple[SkippedCandidate, ...]:
    """Every configuration of the space that was never run, with its prediction and the reason."""
    out: list[SkippedCandidate] = []
    pending = pending_keys(records)
    inc = a.incumbent()
    inc_s = a.speedup(inc) if inc is not None else 1.0
    threshold = a.threshold()
    for c in a.candidates(pending):
        if c.predicted is None:
            reason = "not run: the search stopped before this arm was measured"
            pred = 0.0
        elif c.optimistic <= threshold:
            reason = (
                f"dominated: predicted {c.predicted:.3f}x (optimistic {c.optimistic:.3f}x) does not beat the "
                f"incumbent {inc_s:.3f}x by more than the noise ({a.noise:.1%})"
            )
            pred = c.predicted
        else:
            reason = f"not run: budget spent (predicted {c.predicted:.3f}x)"
            pred = c.predicted
        per_level = {lb: _finite(v) for lb, v in (c.per_level or {}).items()}
        out.append(SkippedCandidate(c.spec, _finite(pred), reason, per_level))
    for opt in ctx.space.options:
        if opt.key in a.excluded_arms:
            for spec in opt.specs():
                if spec.key() not in a.stats:
                    out.append(SkippedCandidate(spec, 0.0, a.excluded_arms[opt.key]))
        elif opt.key in a.caps:
            for spec in opt.specs():
                if spec.num_speculative_tokens >= a.caps[opt.key] and spec.key() not in a.stats:
                    out.append(SkippedCandidate(spec, 0.0, f"depth >= {a.caps[opt.key]} ran out of memory"))
    for ex in ctx.space.excluded:
        out.append(SkippedCandidate(SpecConfig(method=ex.method, model=ex.draft), 0.0, ex.reason))
    return tuple(out)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0
