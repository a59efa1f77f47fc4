"""Confirmation: which decisions the search's runs leave open, and which fresh-server run settles them next.

Every trial runs on a fresh server, so a configuration's search run is its first run; confirmation only adds
runs where the evidence is weak. Two decisions are checked: the deployed candidate against "off" (is
speculation worth it at all) and, when there is a per-batch-size schedule, the schedule against the static
best (is the moving part worth it). A schedule is never in the search, so it always gets at least one run.
A decision is settled when the two sides' medians differ by more than three noise widths over the square
root of the smaller side's run count, or when both sides have ``confirm_runs`` runs (the cap for close
calls, at least 3, as vLLM's ``tune_speculative_k`` measures each point). The side with fewer runs gets the
next one. A clear decision therefore costs no extra server launch; a close one up to ``confirm_runs``
per side. Decisions use the median minus the median absolute deviation of the per-run speedups
(``robust_score``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import StrEnum

from tuner.domain import Purpose, SpecConfig, TrialResult, TrialStatus
from tuner.search._analysis import Analysis
from tuner.search._records import Record, pending_keys
from tuner.search.objective import combine, level_metric


class Role(StrEnum):
    """What a confirmation run re-measures (stored with the trial as its ``role``)."""

    WINNER = "winner"
    CANDIDATE = "candidate"  # a near miss one noisy run may have misjudged
    SCHEDULE = "schedule"
    BASELINE = "baseline"


# A winner that keeps failing its confirmations is replaced by the next; this bounds how often.
MAX_CONFIRM_ROUNDS = 4


def runs_of(records: Sequence[Record], spec: SpecConfig) -> list[TrialResult]:
    """Every successful run of ``spec`` (search and confirmation), in trial order."""
    key = spec.key()
    return [
        r.result
        for r in sorted(records, key=lambda r: r.number)
        if r.spec is not None
        and r.spec.key() == key
        and r.result is not None
        and r.result.status is TrialStatus.SUCCEEDED
    ]


def per_run_speedups(a: Analysis, runs: Sequence[TrialResult], baselines: Sequence[TrialResult]) -> list[float]:
    """Each run's objective against the baselines' mean figures at each level."""
    base: dict[str, float] = {}
    for label in a.labels:
        vals = [level_metric(lr, a.objective) for b in baselines if (lr := b.level(label)) is not None]
        if vals:
            base[label] = statistics.fmean(vals)
    out = []
    for run in runs:
        ratios = {
            label: level_metric(lr, a.objective) / base[label]
            for label in a.labels
            if label in base and (lr := run.level(label)) is not None
        }
        if ratios:
            out.append(combine(ratios, a.weights))
    return out


def robust_score(values: Sequence[float]) -> float:
    """Median minus the median absolute deviation: a lucky run cannot carry a config."""
    if not values:
        return 0.0
    med = statistics.median(values)
    return med - statistics.median(abs(v - med) for v in values)


def deploy_candidates(a: Analysis) -> list[tuple[Role, SpecConfig]]:
    """The static winner (when it beats off in the search) and the schedule (when predicted to), as roles."""
    out: list[tuple[Role, SpecConfig]] = []
    win = a.winner()
    if win is not None and not win.spec.is_off and a.speedup(win) > 1 + a.noise:
        out.append((Role.WINNER, win.spec))
    elif win is not None and not win.spec.is_off and a.speedup(win) > 1 - 3 * a.noise:
        out.append((Role.CANDIDATE, win.spec))
    sched, value, _, _ = a.schedule()
    if sched is not None and value > 1 + a.noise and (win is None or sched.key() != win.spec.key()):
        out.append((Role.SCHEDULE, sched))
    return out


def missing(a: Analysis, records: Sequence[Record], confirm_runs: int) -> list[tuple[Role, SpecConfig]]:
    """The next confirmation runs worth making (first one first); empty when every decision is settled."""
    if confirm_runs <= 0 or not a.has_baseline:
        return []
    if sum(1 for r in records if r.purpose is Purpose.CONFIRM) >= MAX_CONFIRM_ROUNDS * confirm_runs * 3:
        return []
    cands = [(role, spec) for role, spec in deploy_candidates(a) if spec.key() not in a.failed_configs]
    if not cands:
        return []
    off = SpecConfig()
    baselines = runs_of(records, off)
    pending = pending_keys(records)
    count = {
        spec.key(): len(runs_of(records, spec)) + (spec.key() in pending) for _, spec in [*cands, (Role.BASELINE, off)]
    }
    pairs: list[tuple[tuple[Role, SpecConfig], tuple[Role, SpecConfig]]] = []
    static = next((c for c in cands if c[0] is not Role.SCHEDULE), None)
    sched = next((c for c in cands if c[0] is Role.SCHEDULE), None)
    if static is not None:
        pairs.append((static, (Role.BASELINE, off)))
    if sched is not None:
        pairs.append((sched, static or (Role.BASELINE, off)))
    todo: list[tuple[Role, SpecConfig]] = []
    for (role_a, spec_a), (role_b, spec_b) in pairs:
        na, nb = count[spec_a.key()], count[spec_b.key()]
        if na == 0:
            todo.append((role_a, spec_a))
            continue
        if min(na, nb) >= confirm_runs:
            continue
        sa = robust_score(per_run_speedups(a, runs_of(records, spec_a), baselines))
        sb = 1.0 if spec_b.is_off else robust_score(per_run_speedups(a, runs_of(records, spec_b), baselines))
        if sa > 0 and sb > 0 and abs(math.log(sa / sb)) > 3 * a.noise / math.sqrt(min(na, nb)):
            continue  # settled
        todo.append((role_a, spec_a) if na <= nb else (role_b, spec_b))
    first: dict[str, tuple[Role, SpecConfig]] = {}  # one run per config, its first role
    for role, spec in todo:
        if spec.key() not in pending:
            first.setdefault(spec.key(), (role, spec))
    return list(first.values())
