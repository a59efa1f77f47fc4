"""The Executor contract, run against every implementation (local threads, Ray tasks)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.domain import Engine, FailureClass, TrialContext, TrialResult, TrialStatus
from tuner.workers.executors import EvaluatorRecipe, Executor, ExecutorClosed, HardwareMismatch, LocalExecutor
from tuner.workers.executors.recipe import build_evaluator
from tuner.workers.executors.testing import group_gone, leave_trial, make_spec, read_records, wait_for

MakeExecutor = Callable[..., Executor]
TESTING = "tuner.workers.executors.testing"


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def make_executor(request: pytest.FixtureRequest, tmp_path: Path) -> MakeExecutor:
    """``make_executor(evaluator_name, **options)`` -> an MI300X executor running that test evaluator.

    ``make_executor.records``: (kind, directory) of the files its trials record their process groups in,
    for ``testing.leave_trial``: the GPU lease (local), this host's trial records (Ray)."""
    made: list[Executor] = []

    def make(name: str = "SleepEvaluator", **options: object) -> Executor:
        recipe = EvaluatorRecipe(Engine.SIMULATED, options, factory=f"{TESTING}:{name}")
        if request.param == "local":
            ex: Executor = LocalExecutor(
                lambda: build_evaluator(recipe),
                gpus=[0, 1],
                lease_dir=tmp_path / "lease",
                family="mi300x",
                hang_grace_s=0.5,
                cancel_grace_s=5,
            )
        else:
            request.getfixturevalue("ray_cluster")
            from tuner.workers.executors.ray_executor import RayExecutor

            ex = RayExecutor(
                recipe, hardware="mi300x", hang_grace_s=0.5, cancel_grace_s=5, ledger_dir=tmp_path / "ledger"
            )
        made.append(ex)
        return ex

    if request.param == "local":
        make.records = ("lease", tmp_path / "lease")  # type: ignore[attr-defined]
    else:
        from tuner.workers.executors.ray_tasks import ledger_dir

        make.records = ("record", ledger_dir(str(tmp_path / "ledger")))  # type: ignore[attr-defined]
    yield make
    for ex in made:
        ex.close()


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records"
    path.mkdir()
    return path


def test_each_trial_resolves_to_exactly_one_result(make_executor: MakeExecutor, records: Path) -> None:
    ex = make_executor(duration_s=0.3, record_dir=str(records))
    assert ex.free_slots(1) >= 2 and ex.free_slots(64) == 0
    futures = [ex.submit(make_spec(i, hardware="mi300x"), TrialContext()) for i in range(3)]
    results = [f.result(timeout=120) for f in futures]
    assert all(isinstance(r, TrialResult) and r.status is TrialStatus.SUCCEEDED for r in results)
    assert all(r.simulated and r.hardware == "mi300x" and r.worker for r in results)
    assert len(read_records(records, "done")) == 3


def test_evaluator_bug_is_an_internal_failure(make_executor: MakeExecutor) -> None:
    result = make_executor("FailingEvaluator").submit(make_spec(0), TrialContext()).result(timeout=120)
    assert result.status is TrialStatus.FAILED and result.failure.cls is FailureClass.INTERNAL
    assert result.engine is Engine.SIMULATED


def test_hang_is_killed_at_its_deadline(make_executor: MakeExecutor, records: Path) -> None:
    ex = make_executor(hang=True, record_dir=str(records))
    result = ex.submit(make_spec(0, deadline_s=1.0), TrialContext()).result(timeout=120)
    assert result.failure.cls is FailureClass.TIMEOUT
    (start,) = read_records(records, "start")
    wait_for(lambda: group_gone(start["pgid"]), 30, "the hung trial's process group to be killed")


def test_cancellation_reaches_the_evaluator(make_executor: MakeExecutor, records: Path) -> None:
    flag = threading.Event()
    ex = make_executor(duration_s=60, record_dir=str(records))
    future = ex.submit(make_spec(0), TrialContext(is_cancelled=flag.is_set))
    wait_for(lambda: read_records(records, "start"), 60, "the trial to start")
    flag.set()
    assert future.result(timeout=60).status is TrialStatus.CANCELLED


def test_caller_errors_raise(make_executor: MakeExecutor) -> None:
    ex = make_executor()
    with pytest.raises(HardwareMismatch):
        ex.submit(make_spec(0, hardware="mi355x"), TrialContext())
    ex.close()
    with pytest.raises(ExecutorClosed):
        ex.submit(make_spec(1), TrialContext())
    assert ex.free_slots(1) == 0


def test_reclaim_kills_what_a_dead_runner_left_of_the_job_and_nothing_else(make_executor: MakeExecutor) -> None:
    kind, directory = make_executor.records  # type: ignore[attr-defined]
    job = uuid.uuid4().hex
    orphaned = leave_trial(kind, directory, job, 0, die=True)  # its runner died, its server did not
    held = leave_trial(kind, directory, job, 1, die=False)  # a live runner (fenced, say) still holds it
    other = leave_trial(kind, directory, job + "0", 2, die=True)  # another job's (whose id starts like it)
    try:
        reclaimed = make_executor().reclaim(job)  # a fresh executor: it ran none of them
        assert reclaimed.killed == (orphaned.pgid,)
        assert reclaimed.held == (held.pgid,)
        assert reclaimed.unreachable == ()
        wait_for(lambda: group_gone(orphaned.pgid), 10, "the orphaned group to be gone")
        assert not group_gone(held.pgid) and not group_gone(other.pgid)
        assert make_executor().reclaim(job).killed == ()  # nothing left to kill
    finally:
        for left in (orphaned, held, other):
            left.stop()
