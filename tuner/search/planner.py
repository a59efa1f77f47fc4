# Over 400 lines on purpose: the study's ask/tell bookkeeping and the proposal policy share one lock and trial view.
"""The Optuna-backed planner: one study per job, ask/tell over whole server configurations.

How a job is searched (all decisions are recomputed from the stored trials, so a planner rebuilt from the
same storage and study name after a crash continues where it stopped without re-running anything):

1. The baseline (no speculation) is enqueued first; its figures are the denominator of every speedup.
2. The search itself is the pure step function of ``policy.py`` (the trials' analysis in, ``Run | Wait |
   Stop`` out): each arm probed once at its deepest depth, then per-level verification with predictions
   from ``_predict.py`` (acceptance curves, the learnt step-cost model of ``cost_model.py``) and margins from
   the prediction-error log, repeats where two arms are within noise. Every proposal is enqueued with its
   prediction (the ``predicted`` user attr) so the log survives restarts. Optuna keeps the study: the
   conditional parameters are registered on every trial (the seeded multivariate TPE sampler, ``group=True``,
   ``constant_liar=True``) and SLOs are per-level trial constraints (Optuna 5's ``Trial.set_constraint``), so
   the study reads like any other in optuna-dashboard.
3. Confirmation (``_confirm.py``): fresh-server runs only where a decision is close (winner vs off,
   schedule vs static winner), the search run counting as the first; ``confirm_runs`` caps a close call.
4. The outcome (``_outcome.py``): per-level winners (a 1% tie to the smaller K), the static best and the
   schedule by the median minus MAD of their runs, and a deployed config that never loses to off at levels
   carrying most of the weight.
5. Noise: the pooled run-to-run spread of every configuration measured more than once (search repeats and
   confirmation runs), 3% until there are repeats; it floors the error band and sets "off" and the
   confirmation's settling rule.

Failures keep their class: ``unsupported_config`` excludes the method+draft and does not count against
``budget.max_trials``; ``oom`` narrows that arm's depths to below the failed depth; a crash or startup
timeout excludes the arm; a diverged trial is never recommended and stops its arm; infrastructure
failures re-queue the same configuration (at most twice). Nothing else is retried.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from tuner.domain import (
    SLO,
    Budget,
    Engine,
    LoadLevel,
    Method,
    Objective,
    Proposal,
    Purpose,
    SpecConfig,
    Speedup,
    TrialResult,
    TrialStatus,
    TuneOutcome,
    fingerprint,
    from_jsonable,
    to_jsonable,
)
from tuner.search import _confirm
from tuner.search._analysis import Analysis
from tuner.search._figures import trial_figures
from tuner.search._outcome import OutcomeContext, build_outcome
from tuner.search._records import MAX_RETRIES, RETRYABLE, SEARCH, Record
from tuner.search._space import SearchSpace
from tuner.search.objective import constraints, log_value, weights_for
from tuner.search.policy import Run, Stop, Wait, next_search
from tuner.search.storage import RetryingRDBStorage

# Fresh-server re-measurements of the baseline, the winner and the schedule: at least 3, enough to see noise.
DEFAULT_CONFIRM_RUNS = 3
NO_SLO = SLO()
DEFAULT_BUDGET = Budget()


def _lookup_label(lookup: tuple[int, int]) -> str:
    return f"{lookup[0]}-{lookup[1]}"


class OptunaPlanner:
    """Implements ``tuner.domain.Planner`` over an Optuna study (see the module docstring for the method).

    ``ask()`` returns the next proposal, or None when there is nothing to run *right now*: with no trial
    pending that means the job is done (``finished`` is then True); with trials pending, call again after
    the next ``tell``. ``ask_batch(n)`` returns up to n proposals for parallel runners.

    ``budget.max_trials`` counts launched search trials, the baseline included; confirmation runs, refused
    (``unsupported_config``) and infrastructure failures do not count. ``budget.max_wall_s`` (from the
    study's creation) stops the search; the confirmations still run. ``noise`` (relative, e.g. 0.03) fixes
    the noise the stopping rule, the "off" decision and the schedule-vs-static decision use; None estimates
    it from repeated measurements of one config, search repeats and confirmation runs alike (3% until
    there are any). ``confirm_runs`` (default 3; 0 disables confirmation, and with it any
    schedule) is how often each confirmation target is re-measured on a fresh server. ``max_num_seqs`` ends
    the schedule's last range (1024 when None). ``keep_outputs=False`` keeps the baseline's greedy outputs
    (derived from user prompts) out of the study: the service stores them once, on its trial rows, so that
    deleting a sample can delete them; a resumed study then has them only from this process's ``tell``.

    ``former_study_names``: names the study may have been created under before ``study_name``; when only one
    of those exists, it is resumed under its old name. ``study_attrs`` are set on the study (what it is for,
    as optuna-dashboard lists it). Every told trial also carries its figures as flat user attrs
    (``_figures.py``), for a person reading the study; the planner reads only its ``result`` attr.
    """

    def __init__(
        self,
        space: SearchSpace,
        levels: Sequence[LoadLevel],
        *,
        objective: Objective = Objective.THROUGHPUT,
        slo: SLO = NO_SLO,
        budget: Budget = DEFAULT_BUDGET,
        storage: str | None = None,
        study_name: str = "spec-tuner",
        seed: int = 0,
        confirm_runs: int = DEFAULT_CONFIRM_RUNS,
        level_weights: Mapping[str, float] | None = None,
        noise: float | None = None,
        max_num_seqs: int | None = None,
        n_startup_trials: int = 4,
        keep_outputs: bool = True,
        former_study_names: Sequence[str] = (),
        study_attrs: Mapping[str, Any] | None = None,
    ) -> None:
        if not levels:
            raise ValueError("at least one load level is needed")
        self.space = space
        self.levels = tuple(levels)
        self.labels = [lv.label for lv in self.levels]
        self.objective = Objective(objective)
        self.slo = slo
        self.budget = budget
        self.confirm_runs = max(0, int(confirm_runs))
        self.weights = weights_for(self.labels, level_weights)
        self.noise = noise
        self.max_num_seqs = max_num_seqs
        self.keep_outputs = keep_outputs
        self._reference: tuple[tuple[int, ...], ...] | None = None
        self._lock = threading.RLock()
        self._cache: dict[int, Record] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,
                constant_liar=True,
                n_startup_trials=n_startup_trials,
            )
        # a database URL: retried through restarts, with writes safe to repeat (tuner.search.storage)
        rdb = RetryingRDBStorage(storage) if isinstance(storage, str) else storage
        self.study = optuna.create_study(
            storage=rdb,
            study_name=_existing_name(rdb, study_name, former_study_names),
            direction="maximize",
            sampler=sampler,
            load_if_exists=True,
        )
        self._fingerprint = fingerprint(
            {"grid": [s.to_vllm() for s in space.grid()], "levels": self.levels, "objective": self.objective}
        )
        attrs = self.study.user_attrs
        if "space" not in attrs:
            self.study.set_user_attr("space", self._fingerprint)
            self.study.set_user_attr("started_at", time.time())
            self._enqueue(SpecConfig(), Purpose.BASELINE)
        elif attrs["space"] != self._fingerprint:
            raise ValueError(f"study {study_name!r} holds a different search space or levels; use a new name")
        for key, value in (study_attrs or {}).items():
            if attrs.get(key) != value:
                self.study.set_user_attr(key, value)

    # ------------------------------------------------------------------------------------------ contract
    def ask(self) -> Proposal | None:
        with self._lock:
            return self._ask()

    def ask_batch(self, n: int) -> list[Proposal]:
        """Up to ``n`` proposals to run in parallel (fewer when fewer are worth running now)."""
        out: list[Proposal] = []
        with self._lock:
            for _ in range(max(0, n)):
                p = self._ask()
                if p is None:
                    break
                out.append(p)
        return out

    def tell(self, number: int, result: TrialResult) -> None:
        """Record the result of trial ``number``; a second tell for the same number is ignored."""
        with self._lock:
            t = self._frozen(number)
            if t.state.is_finished() or "result" in t.user_attrs or "spec" not in t.user_attrs:
                return
            trial = optuna.trial.Trial(self.study, t._trial_id)
            if result.reference_outputs and self._reference is None and result.spec.is_off:
                self._reference = result.reference_outputs
            kept = result if self.keep_outputs else replace(result, reference_outputs=None)
            # the baseline's own figures count in its speedup (1.0 when it is the only baseline run)
            records = [r if r.number != number else replace(r, result=result) for r in self._records()]
            figures = trial_figures(result, self.labels, self.objective, self._analysis(records).baseline_metric)
            self._set_trial_attrs(t._trial_id, {"result": to_jsonable(kept), **figures})
            if result.status.has_figures():
                # SLOs as Optuna constraints, one per level (<= 0 feasible): TPE ranks infeasible trials last
                for label, v in zip(self.labels, constraints(result, self.slo, self.labels), strict=True):
                    trial.set_constraint(label, v)
            value = log_value(result, self.objective, self.weights) if result.status.has_figures() else None
            if value is not None and math.isfinite(value):
                self.study.tell(number, value)
            else:
                self.study.tell(number, state=TrialState.FAIL)
            f = result.failure
            if result.status is TrialStatus.FAILED and f is not None and f.cls in RETRYABLE:
                self._requeue(t, f"{f.cls.value}: {f.reason}")
            self._cache.pop(number, None)

    def _set_trial_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        storage = self.study._storage
        # Optuna wraps an RDB storage in its _CachedStorage, which passes attr writes to it and re-reads
        # unfinished trials from it: writing to it directly is what a set_user_attr would do.
        backend = getattr(storage, "_backend", storage)
        if isinstance(backend, RetryingRDBStorage):
            backend.set_trial_user_attrs(trial_id, attrs)  # one commit for all of them
        else:  # in memory
            for key, value in attrs.items():
                storage.set_trial_user_attr(trial_id, key, value)

    def abandon(self, number: int, reason: str) -> None:
        """The runner of trial ``number`` died: mark it FAIL (never left RUNNING) and queue it again."""
        with self._lock:
            t = self._frozen(number)
            if t.state.is_finished() or "result" in t.user_attrs:
                return
            optuna.trial.Trial(self.study, t._trial_id).set_user_attr("abandoned", reason)
            self.study.tell(number, state=TrialState.FAIL)
            self._requeue(t, reason)
            self._cache.pop(number, None)

    def outcome(self) -> TuneOutcome:
        """The conclusion so far. Deploy ``outcome.deployed`` (the schedule if any, else the static best);
        ``outcome.speedup`` is always that config's speedup, from its confirmation runs once complete. A
        schedule is only set once confirmed and at least as good as the static best (see
        ``tuner.domain.TuneOutcome``)."""
        with self._lock:
            records = self._records()
            return build_outcome(self._outcome_context(records), self._analysis(records), records)[0]

    def schedule_speedup(self) -> Speedup | None:
        """The schedule's own speedup from its confirmation runs, deployed or not (None until they exist)."""
        with self._lock:
            records = self._records()
            return build_outcome(self._outcome_context(records), self._analysis(records), records)[1]

    def _outcome_context(self, records: list[Record]) -> OutcomeContext:
        finished = self.study.user_attrs.get("search_finished")
        done = finished is not None and not any(r.pending for r in records) and self._peek_done(records)
        return OutcomeContext(self.space, self.confirm_runs, finished, self.engine(records), done)

    # ------------------------------------------------------------------------------------------ helpers
    @property
    def finished(self) -> bool:
        """True when the search and the confirmations are complete (nothing pending, nothing left to ask)."""
        with self._lock:
            records = self._records()
            if any(r.pending for r in records):
                return False
            return self._peek_done(records)

    def pending(self) -> list[Proposal]:
        """Trials proposed and not yet told (after a crash: abandon them, or re-dispatch them)."""
        with self._lock:
            return [
                Proposal(r.number, r.spec, r.purpose)
                for r in self._records()
                if r.pending and r.state == "RUNNING" and r.spec is not None
            ]

    def history(self) -> list[tuple[Proposal, TrialResult]]:
        """Every told trial in order, the previous processes' included."""
        with self._lock:
            return [
                (Proposal(r.number, r.spec, r.purpose), r.result)
                for r in self._records()
                if r.result is not None and r.spec is not None
            ]

    def baseline_reference(self) -> tuple[tuple[int, ...], ...] | None:
        """The baseline's greedy outputs, the correctness reference for every later trial."""
        if self._reference is not None:
            return self._reference
        for r in self._records():
            if r.spec is not None and r.spec.is_off and r.result is not None and r.result.reference_outputs:
                return r.result.reference_outputs
        return None

    def _frozen(self, number: int) -> FrozenTrial:
        trials = self.study.get_trials(deepcopy=False)
        if 0 <= number < len(trials) and trials[number].number == number:
            return trials[number]
        for t in trials:
            if t.number == number:
                return t
        raise KeyError(f"no trial {number} in study {self.study.study_name!r}")

    def _records(self) -> list[Record]:
        out = []
        for t in self.study.get_trials(deepcopy=False):
            cached = self._cache.get(t.number)
            if cached is not None and cached.state == t.state.name:
                out.append(cached)
                continue
            ua = t.user_attrs
            spec = from_jsonable(SpecConfig, ua["spec"]) if "spec" in ua else None
            result = from_jsonable(TrialResult, ua["result"]) if "result" in ua else None
            rec = Record(
                number=t.number,
                state=t.state.name,
                spec=spec,
                purpose=Purpose(ua.get("purpose", Purpose.SEARCH)),
                result=result,
                skipped=ua.get("skipped"),
                abandoned=ua.get("abandoned"),
                retry_of=ua.get("retry_of"),
                predicted=ua.get("predicted"),
            )
            if t.state.is_finished():
                self._cache[t.number] = rec
            out.append(rec)
        return out

    def _analysis(self, records: list[Record]) -> Analysis:
        return Analysis(
            self.space,
            records,
            labels=self.labels,
            weights=self.weights,
            objective=self.objective,
            slo=self.slo,
            noise=self.noise,
            concurrency={lv.label: lv.concurrency for lv in self.levels},
            max_num_seqs=self.max_num_seqs,
        )

    def _params(self, spec: SpecConfig) -> dict[str, Any] | None:
        if spec.schedule is not None:
            return None
        opt = self.space.option_for(spec)
        if opt is None:
            return None
        params: dict[str, Any] = {"arm": opt.key}
        if opt.method is not Method.OFF:
            params[f"k:{opt.key}"] = spec.num_speculative_tokens
            if opt.lookups and spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None:
                params[f"lookup:{opt.key}"] = _lookup_label((spec.prompt_lookup_min, spec.prompt_lookup_max))
        return params

    def _suggest(self, trial: optuna.Trial) -> SpecConfig:
        """Register (or sample) the conditional parameters and return the config they name."""
        arm = trial.suggest_categorical("arm", [o.key for o in self.space.options])
        opt = self.space.option(arm)
        if opt is None or opt.method is Method.OFF:
            return SpecConfig()
        k = trial.suggest_categorical(f"k:{arm}", list(opt.depths))
        lookup: tuple[int | None, int | None] | None = None
        if opt.lookups:
            label = trial.suggest_categorical(f"lookup:{arm}", [_lookup_label(x) for x in opt.lookups])
            lo, hi = (int(x) for x in label.split("-"))
            lookup = (lo, hi)
        return opt.spec(int(k), lookup)

    def _enqueue(self, spec: SpecConfig, purpose: Purpose, **attrs: Any) -> None:
        user_attrs = {"spec": to_jsonable(spec), "purpose": purpose.value, **{k: v for k, v in attrs.items() if v}}
        self.study.enqueue_trial(self._params(spec) or {}, user_attrs=user_attrs)

    def _requeue(self, t: FrozenTrial, reason: str) -> None:
        root = t.user_attrs.get("retry_of", t.number)
        retries = sum(1 for r in self._records() if r.retry_of == root)
        if retries >= MAX_RETRIES or "spec" not in t.user_attrs:
            return
        self.study.enqueue_trial(
            dict(t.params),
            user_attrs={
                "spec": t.user_attrs["spec"],
                "purpose": t.user_attrs.get("purpose", Purpose.SEARCH.value),
                "retry_of": root,
                "requeued_because": reason,
            },
        )

    def _pop(self) -> Proposal:
        """Start the oldest queued trial."""
        trial = self.study.ask()
        spec = from_jsonable(SpecConfig, trial.user_attrs["spec"])
        if self._params(spec) is not None:
            self._suggest(trial)
        return Proposal(trial.number, spec, Purpose(trial.user_attrs.get("purpose", Purpose.SEARCH)))

    def _propose(self, spec: SpecConfig, purpose: Purpose, **attrs: Any) -> Proposal:
        self._enqueue(spec, purpose, **attrs)
        return self._pop()

    # ------------------------------------------------------------------------------------------ planning
    def _ask(self) -> Proposal | None:
        records = self._records()
        if any(r.state == "WAITING" for r in records):
            return self._pop()
        a = self._analysis(records)
        searching = any(r.pending and r.purpose in SEARCH for r in records)
        if "search_finished" not in self.study.user_attrs:
            step = next_search(
                a, records, budget_left=self._search_budget_left(records), out_of_time=self._out_of_time()
            )
            if isinstance(step, Run):
                return self._propose(step.spec, Purpose.SEARCH, predicted=_jsonable(step.predicted))
            if isinstance(step, Wait) or searching:
                return None
            assert isinstance(step, Stop)
            self.study.set_user_attr("search_finished", step.reason)
        elif searching:
            return None
        return self._next_confirm(a, records)

    def _search_budget_left(self, records: list[Record]) -> int:
        used = sum(1 for r in records if r.purpose in SEARCH and r.launched)
        return self.budget.max_trials - used

    def _out_of_time(self) -> str | None:
        started = self.study.user_attrs.get("started_at", time.time())
        if self.budget.max_wall_s is not None and time.time() - started > self.budget.max_wall_s:
            return f"budget: {self.budget.max_wall_s:g} s of wall time spent"
        return None

    def _next_confirm(self, a: Analysis, records: list[Record]) -> Proposal | None:
        todo = _confirm.missing(a, records, self.confirm_runs)
        if not todo:
            return None
        role, spec = todo[0]
        return self._propose(spec, Purpose.CONFIRM, role=role.value)

    def _peek_done(self, records: list[Record]) -> bool:
        if "search_finished" not in self.study.user_attrs:
            return False
        return not _confirm.missing(self._analysis(records), records, self.confirm_runs)

    def engine(self, records: list[Record] | None = None) -> Engine:
        """The engine the results so far came from (simulated until one says otherwise)."""
        records = self._records() if records is None else records
        return next((r.result.engine for r in records if r.result is not None), Engine.SIMULATED)


def _existing_name(storage: str | BaseStorage | None, name: str, former: Sequence[str]) -> str:
    """``name``, unless only a study under a former name exists: a job started before its study got the
    present name resumes that study (never a new, empty one that would run its finished trials again)."""
    if not former or storage is None or isinstance(storage, str):
        return name
    for candidate in (name, *former):
        try:
            storage.get_study_id_from_name(candidate)
        except KeyError:  # no study by that name
            continue
        return candidate
    return name


def _jsonable(per_level: Mapping[str, float] | None) -> dict[str, float] | None:
    """A prediction as stored with its trial (finite floats only: the study's JSON has no infinities)."""
    if not per_level:
        return None
    return {label: float(v) for label, v in per_level.items() if math.isfinite(v)}
