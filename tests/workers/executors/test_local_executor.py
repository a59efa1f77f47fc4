"""LocalExecutor: disjoint GPU groups from the shared lease, parallelism bounded by GPUs, hangs killed."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tuner.domain import Engine, FailureClass, TrialContext, TrialResult, TrialStatus
from tuner.workers.executors import HardwareMismatch, LocalExecutor
from tuner.workers.executors.testing import (
    FailingEvaluator,
    SleepEvaluator,
    group_gone,
    make_spec,
    read_records,
    wait_for,
)
from tuner.workers.gpu_lease import GpuLease
from tuner.workers.hardware import GpuInfo


def _four_gpus(tmp_path: Path, duration_s: float, **kw: Any) -> tuple[LocalExecutor, Path]:
    """An executor of four MI300X GPUs whose trials sleep ``duration_s``, and the folder they record into."""
    rec = tmp_path / "rec"
    rec.mkdir()
    evaluator = lambda: SleepEvaluator(duration_s, record_dir=str(rec))  # noqa: E731 - one per trial
    return LocalExecutor(evaluator, gpus=[0, 1, 2, 3], lease_dir=tmp_path / "lease", family="mi300x", **kw), rec


def _all_succeed(futures: list[Future[TrialResult]]) -> list[TrialResult]:
    results = [f.result(timeout=60) for f in futures]
    assert [r.status for r in results] == [TrialStatus.SUCCEEDED] * len(futures)
    return results


def test_trials_get_disjoint_groups_and_parallelism_is_bounded(tmp_path):
    ex, rec = _four_gpus(tmp_path, 0.4)
    try:
        assert ex.free_slots(1) == 4 and ex.free_slots(2) == 2 and ex.free_slots(8) == 0
        futures = [ex.submit(make_spec(i, tp=2), TrialContext()) for i in range(5)]
        wait_for(lambda: len(read_records(rec, "start")) >= 2, 20, "two trials running")
        assert ex.free_slots(2) == 0
        results = _all_succeed(futures)
        assert ex.free_slots(2) == 2
    finally:
        ex.close()
    assert {r.hardware for r in results} == {"mi300x"} and all(r.worker for r in results)
    starts = read_records(rec, "start")
    assert len(starts) == 5 and all(len(s["gpu_ids"]) == 2 for s in starts)
    # Trials running at the same time never shared a GPU (each held its group until it returned).
    dones = {d["pgid"]: d["t"] for d in read_records(rec, "done")}
    for a in starts:
        for b in starts:
            if a is not b and a["t"] < b["t"] < dones[a["pgid"]]:
                assert not set(a["gpu_ids"]) & set(b["gpu_ids"])


def test_two_executors_share_the_lease(tmp_path):
    release = threading.Event()

    class Blocking:
        engine = Engine.SIMULATED

        def __call__(self, spec, ctx=None):
            release.wait(30)
            return SleepEvaluator(0)(spec, ctx)

    a = LocalExecutor(Blocking(), gpus=[0, 1], lease_dir=tmp_path, family="h100")
    b = LocalExecutor(Blocking(), gpus=[0, 1], lease_dir=tmp_path, family="h100")
    try:
        fa = a.submit(make_spec(0, tp=2), TrialContext())
        wait_for(lambda: b.free_slots(1) == 0, 10, "the other executor to see the GPUs taken")
        fb = b.submit(make_spec(1, tp=1), TrialContext())
        assert b.free_slots(1) == 0  # its own trial is waiting for a GPU
        release.set()
        assert fa.result(timeout=30).status is TrialStatus.SUCCEEDED
        assert fb.result(timeout=30).status is TrialStatus.SUCCEEDED
    finally:
        a.close()
        b.close()


def test_hang_killed_at_deadline_and_gpus_kept_until_it_returns(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    ex = LocalExecutor(
        SleepEvaluator(hang=True, record_dir=str(rec)),
        gpus=[0],
        lease_dir=tmp_path / "l",
        family="mi300x",
        hang_grace_s=0.2,
    )
    try:
        result = ex.submit(make_spec(0, deadline_s=0.5), TrialContext()).result(timeout=30)
        assert result.status is TrialStatus.FAILED and result.failure.cls is FailureClass.TIMEOUT
        (start,) = read_records(rec, "start")
        assert group_gone(start["pgid"])
        assert result.engine is Engine.SIMULATED
    finally:
        ex.close()


def test_cancel_and_errors_and_hardware(tmp_path):
    ex = LocalExecutor(FailingEvaluator(), gpus=[0, 1], lease_dir=tmp_path, family="mi300x")
    try:
        r = ex.submit(make_spec(0), TrialContext()).result(timeout=30)
        assert r.failure.cls is FailureClass.INTERNAL and "evaluator bug" in r.failure.reason
        with pytest.raises(HardwareMismatch):
            ex.submit(make_spec(1, hardware="mi325x"), TrialContext())
        r = ex.submit(make_spec(2, tp=4), TrialContext()).result(timeout=5)
        assert r.failure.cls is FailureClass.UNSUPPORTED
    finally:
        ex.close()
    with pytest.raises(HardwareMismatch):
        LocalExecutor(FailingEvaluator(), gpus=[0], lease_dir=tmp_path, family="h100", hardware="mi300x")

    flag = threading.Event()
    ex = LocalExecutor(lambda: SleepEvaluator(30), gpus=[0], lease_dir=tmp_path, family="mi300x")
    try:
        fut = ex.submit(make_spec(3), TrialContext(is_cancelled=flag.is_set))
        wait_for(lambda: ex.free_slots(1) == 0, 10, "the trial to start")
        flag.set()
        assert fut.result(timeout=30).status is TrialStatus.CANCELLED
    finally:
        ex.close()


def test_cpu_only_is_one_slot_across_executors(tmp_path):
    a = LocalExecutor(lambda: SleepEvaluator(0.3), gpus=[], lease_dir=tmp_path)
    b = LocalExecutor(lambda: SleepEvaluator(0.3), gpus=[], lease_dir=tmp_path)
    try:
        assert a.family == "cpu" and a.free_slots(2) == 1
        held = GpuLease(tmp_path / "cpu").acquire(1, [0], timeout=0)
        assert a.free_slots() == 0 and b.free_slots() == 0
        held.close()
        fut = a.submit(make_spec(0, tp=2), TrialContext())
        r = fut.result(timeout=30)
        assert r.status is TrialStatus.SUCCEEDED and r.hardware == "cpu"
    finally:
        a.close()
        b.close()


def test_close_cancels_running_trials(tmp_path):
    ex = LocalExecutor(lambda: SleepEvaluator(60), gpus=[0], lease_dir=tmp_path, family="mi300x")
    fut = ex.submit(make_spec(0), TrialContext())
    queued = ex.submit(make_spec(1), TrialContext())
    wait_for(lambda: ex.free_slots(1) == 0, 10, "the first trial to start")
    ex.close()
    assert fut.result(timeout=5).status is TrialStatus.CANCELLED
    assert queued.result(timeout=5).status is TrialStatus.CANCELLED
    assert ex.free_slots() == 0


def _gpus(*families: str) -> list[GpuInfo]:
    return [GpuInfo(i, "amd", f"AMD Instinct {f.upper()}", f) for i, f in enumerate(families)]


def test_one_family_of_a_mixed_host(tmp_path):
    host = _gpus("mi300x", "mi300x", "mi325x")
    auto = LocalExecutor(FailingEvaluator(), lease_dir=tmp_path, detect=lambda: host)
    assert auto.gpus == (0, 1) and auto.family == "mi300x"  # the most numerous family, never both
    one = LocalExecutor(FailingEvaluator(), lease_dir=tmp_path, hardware="mi325x", detect=lambda: host)
    assert one.gpus == (2,) and one.family == "mi325x"
    # TUNER_GPUS names ids; detection names their chip
    named = LocalExecutor(FailingEvaluator(), gpus=[2], lease_dir=tmp_path, detect=lambda: host)
    assert named.family == "mi325x"
    with pytest.raises(HardwareMismatch):
        LocalExecutor(FailingEvaluator(), lease_dir=tmp_path, hardware="mi355x", detect=lambda: host)
    with pytest.raises(HardwareMismatch):
        LocalExecutor(FailingEvaluator(), gpus=[0, 1], lease_dir=tmp_path, hardware="mi325x", detect=lambda: host)


def test_an_auto_trial_is_stamped_with_the_chip_that_ran_it(tmp_path):
    # The vLLM runner echoes the job's hardware ("auto"); the record must name the chip instead.
    ex = LocalExecutor(
        SleepEvaluator(0.05, echo_hardware=True), lease_dir=tmp_path, detect=lambda: _gpus("mi355x", "mi355x")
    )
    try:
        auto = ex.submit(make_spec(0, hardware="auto"), TrialContext()).result(timeout=30)
        named = ex.submit(make_spec(1, hardware="MI355X"), TrialContext()).result(timeout=30)
    finally:
        ex.close()
    assert auto.status is TrialStatus.SUCCEEDED and auto.hardware == "mi355x"
    assert named.hardware == "MI355X"  # what the evaluator said, when it said a chip, is kept


def test_max_parallel_runs_trials_one_at_a_time(tmp_path):
    ex, rec = _four_gpus(tmp_path, 0.3, max_parallel=1)
    try:
        assert ex.free_slots(1) == 1
        futures = [ex.submit(make_spec(i), TrialContext()) for i in range(3)]
        assert ex.free_slots(1) == 0
        _all_succeed(futures)
        assert ex.free_slots(1) == 1
    finally:
        ex.close()
    starts = sorted(read_records(rec, "start"), key=lambda s: s["t"])
    dones = {d["pgid"]: d["t"] for d in read_records(rec, "done")}
    for a, b in zip(starts, starts[1:], strict=False):
        assert dones[a["pgid"]] <= b["t"]  # each started after the previous one ended


def test_the_lease_names_the_trials_process_group_while_it_runs(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    ex = LocalExecutor(lambda: SleepEvaluator(30, record_dir=str(rec)), gpus=[0], lease_dir=tmp_path, family="h100")
    try:
        fut = ex.submit(make_spec(0), TrialContext())
        (start,) = wait_for(lambda: read_records(rec, "start"), 10, "the trial to start")
        lock = tmp_path / "gpu-0.lock"
        wait_for(lambda: f"pgid={start['pgid']}" in lock.read_text(), 10, "the pgid in the lease file")
    finally:
        ex.close()
    assert fut.result(timeout=10).status is TrialStatus.CANCELLED
    assert lock.read_text() == ""  # released cleanly: nothing left to keep the GPU busy
