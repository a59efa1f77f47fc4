"""Turning the analysed trials into a ``TuneOutcome``: best, schedule, per-level winners, skipped, notes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.domain import (
    LevelWinner,
    SkippedCandidate,
    SpecConfig,
    Speedup,
    TrialResult,
    TrialStatus,
    TuneOutcome,
)
from tuner.search._analysis import Analysis, ConfigStats, Record
from tuner.search.objective import combine, level_metric

if TYPE_CHECKING:
    from tuner.search.planner import OptunaPlanner


def _confirm_runs(records: Sequence[Record], spec: SpecConfig) -> list[TrialResult]:
    key = spec.key()
    return [
        r.result for r in sorted(records, key=lambda r: r.number)
        if r.purpose == "confirm" and r.spec is not None and r.spec.key() == key
        and r.result is not None and r.result.status is TrialStatus.SUCCEEDED
    ]


def paired_speedup(a: Analysis, runs: Sequence[TrialResult], baselines: Sequence[TrialResult]) -> Speedup | None:
    """Run i of the config against baseline run i (both on fresh servers); mean, min and max over runs."""
    per_run: list[float] = []
    per_level: dict[str, list[float]] = {}
    for run, base in zip(runs, baselines, strict=False):
        ratios = {}
        for label in a.labels:
            lr, lb = run.level(label), base.level(label)
            if lr is None or lb is None:
                continue
            ratios[label] = level_metric(lr, a.objective) / level_metric(lb, a.objective)
            per_level.setdefault(label, []).append(ratios[label])
        per_run.append(combine(ratios, a.weights))
    if not per_run:
        return None
    return Speedup(
        mean=statistics.fmean(per_run), low=min(per_run), high=max(per_run), runs=len(per_run),
        per_level={label: statistics.fmean(v) for label, v in per_level.items()},
    )


def search_speedup(a: Analysis, st: ConfigStats) -> Speedup:
    per_run = [combine({lb: v[i] for lb, v in st.ratios.items() if len(v) > i}, a.weights) for i in range(st.runs)]
    return Speedup(
        mean=a.speedup(st), low=min(per_run), high=max(per_run), runs=st.runs, per_level=st.per_level()
    )


def per_level_winners(a: Analysis, records: Sequence[Record]) -> tuple[LevelWinner, ...]:
    """Best eligible config at each level, read from every trial (search and confirmation)."""
    stats = a._config_stats(records)
    out = []
    for label in a.labels:
        best: tuple[float, ConfigStats] | None = None
        for st in stats.values():
            if st.diverged or st.spec.key() in a.failed_configs or label not in st.per_level():
                continue
            v = st.violations.get(label) or [0.0]
            if not a.slo.is_empty() and statistics.fmean(v) > 0 and a.baseline_violation.get(label, -1) <= 0:
                continue
            s = 1.0 if st.spec.is_off else st.per_level()[label]
            if best is None or s > best[0] or (s == best[0] and st.spec.is_off):
                best = (s, st)
        if best is not None:
            out.append(LevelWinner(label, best[1].spec, best[0], best[1].numbers[0]))
    return tuple(out)


def _short(spec: SpecConfig) -> str:
    if spec.is_off:
        return "off"
    return f"{spec.method.value} k={spec.num_speculative_tokens}" + (" (schedule)" if spec.schedule else "")


def build_outcome(
    planner: OptunaPlanner, a: Analysis, records: Sequence[Record]
) -> tuple[TuneOutcome, Speedup | None]:
    notes: list[str] = []
    noise = a.noise
    notes.append(
        f"objective {a.objective.value}: weighted geometric mean over levels of the per-level speedup vs the "
        f"baseline (weights {', '.join(f'{k}={v:g}' for k, v in a.weights.items())}); noise taken as {noise:.1%}"
    )
    finished = planner.study.user_attrs.get("search_finished")
    if finished:
        notes.append(f"search stopped: {finished}")
    baseline_trial = a.baseline_runs[0].number if a.baseline_runs else None
    engine = planner.engine(list(records))
    winners = per_level_winners(a, records) if a.has_baseline else ()
    if not a.has_baseline:
        notes.append("no baseline figures yet: nothing to compare" if a.baseline_failed is None
                     else "the baseline failed: no speculative configuration can be compared")
        return TuneOutcome(
            best=SpecConfig(), schedule=None, per_level_winners=(), speedup=None, baseline_trial=baseline_trial,
            best_trial=None, notes=tuple(notes), engine=engine,
            skipped=_skipped(planner, a, records), confirm_trials=_confirm_numbers(records),
        ), None

    baselines = _confirm_runs(records, SpecConfig())
    off_speedup = Speedup(1.0, 1.0, 1.0, max(len(baselines), len(a.baseline_runs)), dict.fromkeys(a.labels, 1.0))
    targets = dict((role, spec) for role, spec in planner.confirm_targets(a))
    win = a.winner()
    best, best_trial, speedup = SpecConfig(), baseline_trial, off_speedup
    if win is not None and not win.spec.is_off:
        s_search = a.speedup(win)
        runs = _confirm_runs(records, win.spec)
        confirmed = paired_speedup(a, runs, baselines) if "winner" in targets else None
        if s_search <= 1 + noise:
            candidate = paired_speedup(a, runs, baselines) if "candidate" in targets else None
            measured = (
                f"; re-measured at {candidate.mean:.3f}x ({candidate.low:.3f}-{candidate.high:.3f}) over "
                f"{candidate.runs} confirmation runs" if candidate is not None and candidate.runs else ""
            )
            notes.append(f"off: the best configuration found ({win.spec.label()}, {s_search:.3f}x in the search"
                         f"{measured}) does not beat the baseline beyond the noise ({noise:.1%}); do not speculate")
        elif confirmed is not None and confirmed.runs >= planner.confirm_runs:
            if confirmed.mean <= 1 + noise:
                notes.append(f"off: {win.spec.label()} measured {s_search:.3f}x in the search but "
                             f"{confirmed.mean:.3f}x over {confirmed.runs} confirmation runs, within noise of the "
                             "baseline; "
                             "do not speculate")
            else:
                best, best_trial, speedup = win.spec, win.numbers[0], confirmed
        else:
            best, best_trial = win.spec, win.numbers[0]
            speedup = search_speedup(a, win) if confirmed is None or not confirmed.runs else confirmed
            notes.append(f"unconfirmed: speedup of {win.spec.label()} from {speedup.runs} "
                         f"{'search' if confirmed is None or not confirmed.runs else 'confirmation'} run(s); "
                         f"{planner.confirm_runs} confirmation runs pending")
    elif win is not None:
        notes.append("off: no speculative configuration was measured that beats the baseline; do not speculate")

    schedule, sched_speedup = None, None
    sched, value, sched_levels, sched_notes = a.schedule()
    notes.extend(sched_notes)
    if sched is not None and "schedule" in targets:
        runs = _confirm_runs(records, sched)
        sched_speedup = paired_speedup(a, runs, baselines)
        if sched_speedup is not None and sched_speedup.runs >= planner.confirm_runs:
            if sched_speedup.mean > 1 + noise:
                schedule = sched
                cmp = f" vs the static best's {speedup.mean:.3f}x" if not best.is_off else ""
                notes.append(f"schedule {sched.label()}: {sched_speedup.mean:.3f}x "
                             f"({sched_speedup.low:.3f}-{sched_speedup.high:.3f}) over {sched_speedup.runs} runs{cmp}")
            else:
                notes.append(f"schedule {sched.label()} confirmed at {sched_speedup.mean:.3f}x, within noise of off: "
                             "not recommended")
        else:
            schedule = sched
            notes.append(f"unconfirmed schedule {sched.label()}: predicted {value:.3f}x from the search trials")
    elif sched is not None:
        notes.append(f"no schedule: the best one ({sched.label()}, {value:.3f}x predicted) does not beat the "
                     "baseline beyond noise")

    labels = [w.level for w in winners]
    arms = {_arm(w.spec) for w in winners}
    if len(arms) > 1:
        notes.append("per-level winners differ: " + ", ".join(f"{_short(w.spec)} wins at {w.level}" for w in winners))
    elif winners:
        notes.append(f"one method+draft wins at every level ({', '.join(labels)}): {_arm(winners[0].spec)}")
    for arm, reason in a.excluded_arms.items():
        notes.append(f"{arm} excluded: {reason}")
    for arm, cap in a.caps.items():
        notes.append(f"{arm}: out of memory at depth {cap}; only depths below {cap} tried")
    for ex in planner.space.excluded:
        notes.append(f"{ex.method.value}{'@' + ex.draft if ex.draft else ''} not in the space: {ex.reason}")
    outcome = TuneOutcome(
        best=best, schedule=schedule, per_level_winners=winners, speedup=speedup, baseline_trial=baseline_trial,
        best_trial=best_trial, confirm_trials=_confirm_numbers(records), skipped=_skipped(planner, a, records),
        notes=tuple(notes), engine=engine,
    )
    return outcome, sched_speedup


def _arm(spec: SpecConfig) -> str:
    return "off" if spec.is_off else f"{spec.method.value}@{spec.model}"


def _confirm_numbers(records: Sequence[Record]) -> tuple[int, ...]:
    return tuple(r.number for r in records if r.purpose == "confirm" and r.result is not None)


def _skipped(planner: OptunaPlanner, a: Analysis, records: Sequence[Record]) -> tuple[SkippedCandidate, ...]:
    """Every configuration of the space that was never run, with its prediction and the reason."""
    out: list[SkippedCandidate] = []
    pending = {r.spec.key() for r in records if r.pending and r.spec is not None}
    inc = a.incumbent()
    inc_s = a.speedup(inc) if inc is not None else 1.0
    threshold = a.threshold()
    for c in a.candidates(pending):
        if c.predicted is None:
            reason = "not run: the search stopped before this arm was measured"
            pred = 0.0
        elif c.optimistic <= threshold:
            reason = (f"dominated: predicted {c.predicted:.3f}x (optimistic {c.optimistic:.3f}x) does not beat the "
                      f"incumbent {inc_s:.3f}x by more than the noise ({a.noise:.1%})")
            pred = c.predicted
        else:
            reason = f"not run: budget spent (predicted {c.predicted:.3f}x)"
            pred = c.predicted
        out.append(SkippedCandidate(c.spec, _finite(pred), reason))
    for opt in planner.space.options:
        if opt.key in a.excluded_arms:
            for spec in opt.specs():
                if spec.key() not in a.stats:
                    out.append(SkippedCandidate(spec, 0.0, a.excluded_arms[opt.key]))
        elif opt.key in a.caps:
            for spec in opt.specs():
                if spec.num_speculative_tokens >= a.caps[opt.key] and spec.key() not in a.stats:
                    out.append(SkippedCandidate(spec, 0.0, f"depth >= {a.caps[opt.key]} ran out of memory"))
    for ex in planner.space.excluded:
        out.append(SkippedCandidate(SpecConfig(method=ex.method, model=ex.draft), 0.0, ex.reason))
    return tuple(out)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0
