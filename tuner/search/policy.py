"""The search's next step, as a pure function: what the trials so far say in, ``Run | Wait | Stop`` out.

1. The baseline first (the planner enqueues it); if it fails, stop: nothing can be compared.
2. Each arm (method + draft, each ngram lookup window) is probed once at its deepest allowed depth: one
   trial at depth K gives the acceptance curve of every depth <= K. After an out-of-memory failure with
   nothing measured, the next probe halves the depth.
3. Per-level verification: at every level, each arm's predicted-best depth (over its measured and untried
   depths) has been measured, or is predicted to lose to the level's best measured config by more than its
   margin (the calibrated error band, see ``Predictor.predict``). The candidate with the largest predicted
   gain over a level's best measured is run next; its prediction is logged with it, so the band learns how
   wrong the model has been: a model that misses widens it and the search measures more, one that hits
   narrows it and the search stops sooner. Per-range answers are therefore always measured configs.
4. Close calls: where a level's best measured config and another are within noise of each other and the
   other may be better by more than 2%, the one with fewer runs is measured again (``_close_call``).
5. Otherwise stop, or wait while search trials are pending (their results may change the answer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.domain import Method, SpecConfig
from tuner.search._analysis import Analysis
from tuner.search._predict import Candidate, diff_var
from tuner.search._records import MAX_SEARCH_REPEATS, SEARCH, Record, pending_keys

# Two configs within 1% of each other at a level are a tie (vLLM's tune_speculative_k breaks it toward the
# smaller K): a candidate is worth a launch only if it may beat the level's best by more than that.
TIE = 0.01
# A close call at a level (see ``_close_call``): the answer should be within HIT of the level's best, and
# two configs are told apart once their figures differ by CLOSE_Z standard errors of their difference;
# MAX_RUNS runs of a config at most (vLLM's tune_speculative_k measures each point three times).
HIT = 0.02
CLOSE_Z = 2.0
# two runs of a config this many noise widths apart at a level: one of them was slow (``_split_runs``)
SPLIT_Z = 2.5
MAX_RUNS = 3


@dataclass(frozen=True)
class Run:
    """Run ``spec``; its prediction (if any) is logged with the trial."""

    spec: SpecConfig
    why: str
    predicted: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing to run until a pending trial reports."""


@dataclass(frozen=True)
class Stop:
    reason: str


Step = Run | Wait | Stop


def arm_of(spec: SpecConfig) -> tuple[str, tuple[int | None, int | None] | None]:
    """Method+draft, and the lookup window for lookup proposers."""
    lookup = None
    if spec.prompt_lookup_min is not None or spec.prompt_lookup_max is not None:
        lookup = (spec.prompt_lookup_min, spec.prompt_lookup_max)
    return spec.arm, lookup


def next_search(
    a: Analysis,
    records: Sequence[Record],
    *,
    budget_left: int,
    out_of_time: str | None = None,
) -> Step:
    """The next search step (see the module docstring)."""
    if (f := a.baseline_failure) is not None:
        return Stop(f"the baseline failed ({f.cls.value}: {f.reason}); nothing can be compared")
    if budget_left <= 0:
        return Stop(f"budget: {budget_left + _launched(records)} trials run")
    if out_of_time:
        return Stop(out_of_time)
    pending = pending_keys(records)
    cands = a.candidates(pending)
    probe = _probe(a, cands, records)
    if probe is not None:
        return probe
    if not a.has_baseline:
        return Wait() if pending else Stop("no baseline figures")
    verify = _verify(a, cands)
    if verify is not None:
        return verify
    repeat = _split_runs(a, records, budget_left) or _close_call(a, records, budget_left)
    if repeat is not None:
        return repeat
    if any(r.pending and r.purpose in SEARCH for r in records):
        return Wait()
    return Stop(
        "stopping rule: at every level, each arm's predicted best has been measured or is predicted to lose "
        f"by more than its margin (error band {a.band:.1%} pooled, "
        + ", ".join(f"{arm} {b:.1%}" for arm, b in a.arm_bands.items())
        + f"; from {sum(len(e) for e in a.prediction_errors.values())} checked per-level predictions)"
    )


def _launched(records: Sequence[Record]) -> int:
    return sum(1 for r in records if r.purpose in SEARCH and r.launched)


def _probe(a: Analysis, cands: list[Candidate], records: Sequence[Record]) -> Run | None:
    covered: set[str] = set()
    for r in records:
        if r.spec is None or r.spec.is_off or r.spec.schedule is not None:
            continue
        if r.pending or (r.result is not None and r.result.status.has_figures()):
            covered.add(arm_of(r.spec)[0])
    for opt in a.space.options:
        if opt.method is Method.OFF or opt.key in a.excluded_arms or opt.key in covered:
            continue
        first_lookup = opt.lookups[0] if opt.lookups else None
        mine = [c for c in cands if c.option is opt and arm_of(c.spec)[1] == first_lookup]
        if not mine:
            continue
        depths = sorted(c.spec.num_speculative_tokens for c in mine)
        depth = depths[-1]
        if opt.key in a.caps:
            halved = [d for d in depths if d <= max(1, a.caps[opt.key] // 2)]
            depth = halved[-1] if halved else depths[0]
        return Run(opt.spec(depth, first_lookup), f"probe {opt.key} at its deepest depth")
    return None


def _verify(a: Analysis, cands: list[Candidate]) -> Run | None:
    """The untried config with the largest predicted gain at a level where it is its arm's predicted best
    and may beat that level's best measured config by more than nothing, given its margin."""
    ranked = a.ranked()
    best: tuple[float, Candidate, str, float] | None = None  # gain, candidate, level, its prediction there
    for label in a.labels:
        if label in a.undecided:
            continue
        measured = {st.spec.key(): st.per_level().get(label) for st in ranked}
        top = max((v for v in measured.values() if v is not None), default=1.0)
        top = max(top, 1.0)  # off is always there
        arms: dict[tuple[str, object], tuple[float, Candidate | None]] = {}
        for st in ranked:
            v = st.per_level().get(label)
            if st.spec.is_off or v is None:
                continue
            key = arm_of(st.spec)
            if v > arms.get(key, (0.0, None))[0]:
                arms[key] = (v, None)
        for c in cands:
            if c.per_level is None or label not in c.per_level:
                continue
            key = arm_of(c.spec)
            if c.per_level[label] > arms.get(key, (0.0, None))[0]:
                arms[key] = (c.per_level[label], c)
        for value, cand in arms.values():
            if cand is None or value * (1 + cand.margin) <= top * (1 + TIE):
                continue  # measured already, or cannot beat the level's best by more than a tie
            gain = value / top
            if best is None or gain > best[0]:
                best = (gain, cand, label, value)
    if best is None:
        return None
    _, c, label, value = best
    why = f"verify {label}: predicted {value:.3f}x, the best of its arm there"
    return Run(c.spec, why, c.per_level)


def _split_runs(a: Analysis, records: Sequence[Record], budget_left: int) -> Run | None:
    """A third run where two runs of a config that decides something disagree beyond the noise: the
    baseline (every ratio at a level is over it) or a level's best. Two runs ``SPLIT_Z`` noise widths
    apart at a level say one of them was slow (a noisy neighbour, a throttle), not which; the median of
    three does. Not bounded by the close calls' cap: at most one per level's best and the baseline."""
    if budget_left <= 0:
        return None
    pending = pending_keys(records)
    tops = []
    for label in a.labels:
        if label in a.undecided:
            continue
        scored = a.level_estimates(label)
        if scored:
            tops.append(max(scored, key=lambda t: t[0].value)[1])
    off = next((st for st in a.stats.values() if st.spec.is_off), None)
    width = SPLIT_Z * a.level_noise * math.sqrt(2)
    for st in ([off] if off is not None else []) + tops:
        if st.runs != 2 or st.spec.key() in pending:
            continue
        split = [
            lb
            for lb, v in st.ratios.items()
            if lb not in a.undecided and len(v) == 2 and min(v) > 0 and abs(math.log(v[0] / v[1])) > width
        ]
        if split:
            return Run(st.spec, f"re-measure: its two runs disagree at {', '.join(split)} (run 3)")
    return None


def _repeats(records: Sequence[Record]) -> int:
    """Search runs of a config run before."""
    seen: set[str] = set()
    n = 0
    for r in sorted(records, key=lambda r: r.number):
        if r.purpose not in SEARCH or not r.launched or r.spec is None:
            continue
        n += r.spec.key() in seen
        seen.add(r.spec.key())
    return n


def _close_call(a: Analysis, records: Sequence[Record], budget_left: int) -> Run | None:
    """Re-measure where one noisy run may have picked a level's answer: at a level, the best measured config
    and another eligible one whose pooled figures are within ``CLOSE_Z`` standard errors of their difference
    (``diff_var``: two depths of one arm share runs) while the other may still be better by more than ``HIT``
    (so a true tie does not count). The less certain side runs again (off too: its runs are the baseline's); the
    config in the most such calls, by level weight, first. At most ``MAX_RUNS`` runs of a config, and
    ``MAX_SEARCH_REPEATS`` times the number of levels repeats in a search."""
    if budget_left <= 0 or _repeats(records) >= MAX_SEARCH_REPEATS * len(a.labels):
        return None
    pending = pending_keys(records)
    score: dict[str, float] = {}
    by_key = {st.spec.key(): st for st in a.stats.values()}
    for label in a.labels:
        if label in a.undecided:
            continue
        scored = a.level_estimates(label)
        if len(scored) < 2:
            continue
        best, top = max(scored, key=lambda t: t[0].value)
        for e, st in scored:
            if st is top or e.value <= 0:
                continue
            width = CLOSE_Z * math.sqrt(diff_var(best, e))
            if math.log(best.value / e.value) >= width - HIT:
                continue  # separated, or a tie either way
            # the less certain side runs again (off's runs are the baseline's)
            fewer = max(((top, best), (st, e)), key=lambda t: (t[1].var, -t[0].runs, -t[0].numbers[0]))[0]
            if fewer.runs >= MAX_RUNS or fewer.spec.key() in pending:
                continue
            score[fewer.spec.key()] = score.get(fewer.spec.key(), 0.0) + a.weights.get(label, 0.0)
    if not score:
        return None
    key = max(score, key=lambda k: (score[k], -by_key[k].runs, -by_key[k].numbers[0]))
    st = by_key[key]
    return Run(st.spec, f"re-measure: a close call at {score[key]:.0%} of the level weight (run {st.runs + 1})")
