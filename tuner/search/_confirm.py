"""Confirmation: what is re-measured on fresh servers after the search, and what is still missing."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.domain import SpecConfig, TrialStatus
from tuner.search._analysis import Analysis
from tuner.search._records import Record

# A winner that keeps failing its confirmations is replaced by the next; this bounds how often.
MAX_CONFIRM_ROUNDS = 4


def targets(a: Analysis, confirm_runs: int) -> list[tuple[str, SpecConfig]]:
    """The baseline, the static winner and the schedule, when either beats the baseline beyond noise.

    When nothing does, "off" is still the answer to confirm: the baseline is re-measured on fresh servers, and
    so is the best speculative candidate when its search figure is within three noise widths of the baseline
    (a near miss that one noisy measurement may have misjudged). A clear loser is not re-run.
    """
    if confirm_runs <= 0 or not a.has_baseline:
        return []
    out: list[tuple[str, SpecConfig]] = []
    win = a.winner()
    if win is not None and not win.spec.is_off and a.speedup(win) > 1 + a.noise:
        out.append(("winner", win.spec))
    sched, value, _, _ = a.schedule()
    if sched is not None and value > 1 + a.noise and (win is None or sched.key() != win.spec.key()):
        out.append(("schedule", sched))
    if not out and win is not None and not win.spec.is_off and a.speedup(win) > 1 - 3 * a.noise:
        out.append(("candidate", win.spec))
    return [("baseline", SpecConfig()), *out]


def counts(records: Sequence[Record]) -> dict[str, int]:
    """Confirmation runs per config that succeeded or are still running."""
    out: dict[str, int] = {}
    for r in records:
        if r.purpose != "confirm" or r.spec is None:
            continue
        if r.pending or (r.result is not None and r.result.status is TrialStatus.SUCCEEDED):
            out[r.spec.key()] = out.get(r.spec.key(), 0) + 1
    return out


def missing(a: Analysis, records: Sequence[Record], confirm_runs: int) -> list[tuple[str, SpecConfig]]:
    """Targets still short of ``confirm_runs`` runs, fewest first (so the three interleave)."""
    if sum(1 for r in records if r.purpose == "confirm") >= MAX_CONFIRM_ROUNDS * confirm_runs * 3:
        return []
    done = counts(records)
    todo = [
        (done.get(spec.key(), 0), i, role, spec)
        for i, (role, spec) in enumerate(targets(a, confirm_runs))
        if spec.key() not in a.failed_configs and done.get(spec.key(), 0) < confirm_runs
    ]
    return [(role, spec) for _, _, role, spec in sorted(todo, key=lambda t: (t[0], t[1]))]
