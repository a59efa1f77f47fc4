"""``tune``: the whole search as one function call, for any evaluator."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tuner.domain import (
    SLO,
    Budget,
    Failure,
    FailureClass,
    LoadLevel,
    ModelRef,
    Objective,
    Proposal,
    Purpose,
    ServingConfig,
    TrafficRequest,
    TrialResult,
    TrialSpec,
    TrialStatus,
    TuneOutcome,
    fingerprint,
)
from tuner.search._space import SearchSpace
from tuner.search.planner import DEFAULT_CONFIRM_RUNS, OptunaPlanner

log = logging.getLogger(__name__)
NO_SLO = SLO()
DEFAULT_BUDGET = Budget()
DEFAULT_SERVING = ServingConfig()


@dataclass(frozen=True)
class TuneReport:
    """What ``tune`` returns: the conclusion and every trial run for it, in order."""

    outcome: TuneOutcome
    history: list[tuple[Proposal, TrialResult]]

    @property
    def trials_run(self) -> int:
        """Server runs that were launched (not-launched fail-fast trials excluded), confirmations included."""
        return sum(1 for _, r in self.history if r.status is not TrialStatus.SKIPPED)

    @property
    def search_trials(self) -> int:
        return sum(1 for p, _ in self.history if p.purpose is not Purpose.CONFIRM)


def tune(
    space: SearchSpace,
    evaluator: Callable[[TrialSpec], TrialResult],
    *,
    model: ModelRef,
    requests: Sequence[TrafficRequest],
    levels: Sequence[LoadLevel],
    objective: Objective = Objective.THROUGHPUT,
    slo: SLO = NO_SLO,
    budget: Budget = DEFAULT_BUDGET,
    serving: ServingConfig = DEFAULT_SERVING,
    storage: str | None = None,
    seed: int = 0,
    confirm_runs: int = DEFAULT_CONFIRM_RUNS,
    study_name: str | None = None,
    hardware: str = "auto",
    level_weights: Mapping[str, float] | None = None,
    noise: float | None = None,
) -> TuneReport:
    """Search ``space`` by running ``evaluator`` on one trial at a time; return the outcome and the history.

    ``evaluator`` is any callable taking a ``TrialSpec`` (one server configuration, measured at every load
    level) and returning a ``TrialResult``: the real vLLM runner, the simulated engine, or your own. The
    first trial is the no-speculation baseline; its ``reference_outputs`` are passed to every later trial
    as the correctness reference. ``storage`` is an SQLAlchemy URL for Optuna's RDB storage (None: in
    memory); calling ``tune`` again with the same storage and ``study_name`` resumes the job, re-running
    no finished trial (trials left running by a dead process are re-queued). An evaluator that raises is
    recorded as a failed trial of class ``internal`` and the search goes on. Deploy
    ``report.outcome.deployed`` (the per-batch-size schedule when one was confirmed, else the static best);
    ``report.outcome.speedup`` is always its speedup (see ``tuner.domain.TuneOutcome``).
    """
    if study_name is None:
        study_name = (
            "tune-"
            + fingerprint(
                {
                    "model": model,
                    "grid": [s.to_vllm() for s in space.grid()],
                    "levels": tuple(levels),
                    "objective": objective,
                    "seed": seed,
                }
            )[:16]
        )
    planner = OptunaPlanner(
        space,
        levels,
        objective=objective,
        slo=slo,
        budget=budget,
        storage=storage,
        study_name=study_name,
        seed=seed,
        confirm_runs=confirm_runs,
        level_weights=level_weights,
        noise=noise,
        max_num_seqs=serving.args.get("max_num_seqs"),
    )
    for stale in planner.pending():
        planner.abandon(stale.number, "resumed: the process running this trial is gone")
    while (proposal := planner.ask()) is not None:
        spec = TrialSpec(
            model=model,
            spec=proposal.spec,
            levels=tuple(levels),
            requests=tuple(requests),
            serving=serving,
            slo=slo,
            hardware=hardware,
            reference_outputs=planner.baseline_reference(),
            number=proposal.number,
        )
        try:
            result = evaluator(spec)
        except Exception as exc:  # a broken evaluator must not lose the job
            log.exception("evaluator failed on trial %s", proposal.number)
            result = TrialResult(
                status=TrialStatus.FAILED,
                engine=planner.engine(),
                spec=proposal.spec,
                failure=Failure(FailureClass.INTERNAL, f"{type(exc).__name__}: {exc}"),
            )
        planner.tell(proposal.number, result)
    return TuneReport(outcome=planner.outcome(), history=planner.history())
