"""Whole jobs through the job runner and a local executor: the trial deadline reaches the executor and a hung
trial is killed with its processes; SQLite runs trials one at a time; Optuna's SQLite storage waits for locks."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine

from tests.fakes import ListPlanner, submit
from tuner import tuning
from tuner.domain import (
    Engine,
    JobSpec,
    Method,
    ModelRef,
    SpecConfig,
    TrialContext,
    TrialResult,
    TrialSpec,
)
from tuner.job_runner import JobRunner
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory
from tuner.store.models import JobRow
from tuner.wiring import claimable_hardware, make_executor, make_runner, optuna_storage_url
from tuner.workers.executors import LocalExecutor
from tuner.workers.executors.testing import SleepEvaluator, group_gone, read_records


class HangsWhenSpeculating:
    """The baseline measures; a speculative trial starts its "server" and hangs, ignoring cancellation."""

    engine = Engine.SIMULATED

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = str(record_dir)

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        hang = not spec.spec.is_off
        return SleepEvaluator(0.05, hang=hang, record_dir=self.record_dir)(spec, ctx)


def test_a_hung_trial_is_killed_at_the_jobs_deadline(db_url: str, tmp_path: Path) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    rec = tmp_path / "rec"
    rec.mkdir()
    runner = JobRunner(
        factory,
        planner_factory=lambda job_id, spec, reqs: ListPlanner([SpecConfig(Method.NGRAM, 3)]),
        executor_factory=lambda spec: LocalExecutor(
            HangsWhenSpeculating(rec), gpus=[0], lease_dir=tmp_path / "lease", family="mi300x", hang_grace_s=0.2
        ),
        heartbeat_s=0.1,
        poll_s=0.05,
        trial_deadline_s=1.0,
    )
    t0 = time.monotonic()
    assert runner.run_once() == job_id
    assert time.monotonic() - t0 < 30
    hung = next(s for s in read_records(rec, "start") if s["number"] == 1)
    assert hung["deadline_s"] == 1.0  # the evaluator saw the job's deadline
    with factory() as s:
        assert s.get(JobRow, job_id).status == "succeeded"  # the job went on without the hung trial
        row = next(t for t in tuning.list_trials(s, job_id) if t.number == 1)
        assert row.status == "failed" and row.failure_class == "timeout"
        assert "deadline of 1 s" in row.failure_reason
        assert row.pgid == hung["pgid"]
    assert group_gone(hung["pgid"])  # killed with its processes


def test_the_runner_gets_the_deadline_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, trial_deadline_s=123.0)
    runner = make_runner(settings, make_session_factory(make_engine(settings.db_url)), report=False)
    assert runner.config.trial_deadline_s == 123.0


def test_sqlite_runs_trials_one_at_a_time(tmp_path: Path) -> None:
    spec = JobSpec(model=ModelRef("org/m"), traffic_id="t", engine=Engine.VLLM)
    on_sqlite = make_executor(Settings(data_dir=tmp_path, cpu_vllm=True), spec)
    on_pg = make_executor(
        Settings(data_dir=tmp_path, cpu_vllm=True, database_url="postgresql+psycopg://u@127.0.0.1/db"), spec
    )
    try:
        assert isinstance(on_sqlite, LocalExecutor) and on_sqlite.max_parallel == 1
        assert isinstance(on_pg, LocalExecutor) and on_pg.max_parallel is None
    finally:
        on_sqlite.close()
        on_pg.close()


def test_optuna_waits_for_the_sqlite_lock(tmp_path: Path) -> None:
    url = optuna_storage_url(Settings(data_dir=tmp_path))
    engine = create_engine(url)
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    assert kwargs["timeout"] == 30.0
    assert optuna_storage_url(Settings(database_url=f"sqlite:///{tmp_path}/x.db?timeout=5")).endswith("timeout=5")
    pg = "postgresql+psycopg://u@127.0.0.1/db"
    assert optuna_storage_url(Settings(database_url=pg)) == pg


def test_a_local_runner_claims_jobs_for_the_chips_it_has() -> None:
    settings = Settings()
    mixed = {"gpus": [{"family": "mi300x"}, {"family": "mi325x"}, {"family": "mi300x"}], "hardware": None}
    assert claimable_hardware(settings, mixed) == ["mi300x", "mi325x"]
    assert claimable_hardware(settings, {"gpus": [], "hardware": "cpu"}) == ["cpu"]
    assert claimable_hardware(settings, None) is None
