"""The runner's use cases hand back domain records: what recovery learns, and a publication done once."""

from __future__ import annotations

from tests.fakes import GHOST, LEVELS, SPECS, FakeEvaluator, ListPlanner, submit
from tuner import runs, tuning
from tuner.domain import (
    FailureClass,
    JobSpec,
    JobStatus,
    ModelRef,
    Proposal,
    Recovery,
    SpecConfig,
    TrialProcess,
    TrialSpec,
    TrialStatus,
)
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.tuning import Claim


def test_recover_fails_what_a_dead_runner_left_running_and_returns_records(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    result = FakeEvaluator()(TrialSpec(model=ModelRef("org/m"), spec=SpecConfig(), levels=LEVELS, requests=()))
    with transaction(factory) as s:
        runs.start_trial(s, job_id, Proposal(0, SpecConfig()), levels=[], worker=GHOST)
        runs.finish_trial(s, job_id, 0, result)
        runs.start_trial(s, job_id, Proposal(1, SPECS[0]), levels=[], worker=GHOST)
        runs.set_trial_pgid(s, job_id, 1, 4242)
        runs.start_trial(s, job_id, Proposal(2, SPECS[1]), levels=[], worker=GHOST)  # pgid never stored
    with transaction(factory) as s:
        rec = runs.recover(s, job_id)
    assert isinstance(rec, Recovery)
    assert set(rec.results) == {0} and rec.results[0].status is TrialStatus.SUCCEEDED
    assert rec.left_running == (TrialProcess(job_id, 1, 4242, GHOST),)
    assert rec.left_running[0].host == GHOST.rpartition("@")[2]
    assert sorted(n for n, _ in rec.abandoned) == [1, 2] and rec.known == (0, 1, 2)
    with factory() as s:
        rows = {r.number: r for r in tuning.list_trials(s, job_id)}
        assert rows[1].status == rows[2].status == TrialStatus.FAILED.value
        assert rows[1].failure_class == FailureClass.INFRA.value
    with transaction(factory) as s:  # a second recovery finds nothing left running and re-fails nothing
        again = runs.recover(s, job_id)
    assert again.left_running == () and again.abandoned == rec.abandoned


def test_publish_outcome_is_done_once_per_claim(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    planner = ListPlanner([])
    result = FakeEvaluator()(TrialSpec(model=ModelRef("org/m"), spec=SpecConfig(), levels=LEVELS, requests=()))
    planner.tell(0, result)
    with transaction(factory) as s:
        job = tuning.claim_job(s, "me@here", stale_after_s=60)
        claim = Claim(job_id, "me@here", job.attempts)
        spec: JobSpec = tuning.job_spec(job)
        runs.start_trial(s, job_id, Proposal(0, SpecConfig()), levels=[], worker="me@here")
        runs.finish_trial(s, job_id, 0, result)
    with transaction(factory) as s:
        assert runs.publish_outcome(s, claim, spec, planner.outcome(), {0: result}) is JobStatus.SUCCEEDED
    with transaction(factory) as s:  # a retried commit: nothing published twice
        assert runs.publish_outcome(s, claim, spec, planner.outcome(), {0: result}) is None
    with factory() as s:
        job = tuning.get_job(s, job_id)
        assert job.status == JobStatus.SUCCEEDED.value
        assert job.best["simulated"] is True and job.best["trial"] == 0
