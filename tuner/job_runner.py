"""The job runner: claim a job, drive its planner's trials through an executor, publish the answer.

A job is claimed by exactly one runner (an atomic conditional UPDATE) which heartbeats while it works. A job
whose runner stopped heart-beating is claimed by another runner, which first kills the process groups the
dead runner left (their ids are stored with each trial), marks those trials failed (in Optuna too, through
``Planner.abandon``) and re-queues them; finished trials are never run again and no result is stored twice
(``tuning.finish_trial`` ignores a second result, ``Planner.tell`` is idempotent).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from tuner import recommendations, tuning
from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    JobSpec,
    JobStatus,
    Planner,
    Proposal,
    TrafficRequest,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
    to_jsonable,
)
from tuner.errors import TunerError
from tuner.store.db import transaction
from tuner.store.models import JobRow

log = logging.getLogger("tuner.runner")


class TrialExecutor(Protocol):
    """What the runner needs of an executor (tuner.workers.executors implements it)."""

    def free_slots(self, tensor_parallel_size: int = 1) -> int: ...

    def submit(self, spec: TrialSpec, ctx: TrialContext) -> Future[TrialResult]: ...

    def close(self) -> None: ...


PlannerFactory = Callable[[str, JobSpec, list[TrafficRequest]], Planner]
ExecutorFactory = Callable[[JobSpec], TrialExecutor]
KillGroup = Callable[[int], None]


def default_worker_name() -> str:
    return f"worker-{os.getpid()}"


def worker_identity(name: str) -> str:
    """``name@host``: the host part tells a recovering runner whether it can kill what the trial left."""
    return name if "@" in name else f"{name}@{socket.gethostname()}"


def _kill_group(pgid: int) -> None:
    from tuner.workers.vllm_server import kill_process_group

    kill_process_group(pgid, grace_s=5.0)


def _group_alive(pgid: int) -> bool:
    from tuner.workers.vllm_server import group_alive

    return group_alive(pgid)


ORPHAN_SWEEP_S = 60.0
ORPHAN_WINDOW = timedelta(days=1)  # older process groups are left alone: by then a pid may have been reused


@dataclass
class _Running:
    proposal: Proposal
    future: Future[TrialResult]


class JobRunner:
    """Runs jobs from the store until stopped. Thread-safe start/stop; one job at a time per runner."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        planner_factory: PlannerFactory,
        executor_factory: ExecutorFactory,
        worker: str | None = None,
        heartbeat_s: float = 2.0,
        stale_after_s: float = 15.0,
        poll_s: float = 0.5,
        log_dir: Path | None = None,
        kill_group: KillGroup = _kill_group,
        group_alive: Callable[[int], bool] = _group_alive,
        host_report: dict[str, Any] | None = None,
        hardware: Sequence[str] | None = None,
        trial_deadline_s: float | None = None,
    ) -> None:
        self._factory = factory
        self._planner_factory = planner_factory
        self._executor_factory = executor_factory
        self.worker = worker_identity(worker or default_worker_name())
        self._heartbeat_s = heartbeat_s
        self._stale_after_s = stale_after_s
        self._poll_s = poll_s
        self._log_dir = log_dir
        self._kill_group = kill_group
        self._group_alive = group_alive
        self._next_sweep = 0.0
        self._host_report = host_report
        self._hardware = hardware
        self._trial_deadline_s = trial_deadline_s  # a trial still running this long is killed: TIMEOUT
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name=f"tuner-runner-{self.worker}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_forever(self) -> None:
        if self._host_report is not None:
            with transaction(self._factory) as s:
                tuning.report_worker(s, self.worker, self._host_report)
        while not self._stop.is_set():
            try:
                if time.monotonic() >= self._next_sweep:
                    self._next_sweep = time.monotonic() + ORPHAN_SWEEP_S
                    self.sweep_orphans()
                if self.run_once() is None:
                    self._stop.wait(self._poll_s)
            except Exception:  # a bug must not kill the runner thread: log, back off, go on
                log.exception("runner %s: unexpected error", self.worker)
                self._stop.wait(max(self._poll_s, 1.0))

    def run_once(self, job_id: str | None = None) -> str | None:
        """Claim one job (or the given one) and run it to the end. Returns its id, or None if none was free."""
        with transaction(self._factory) as s:
            tuning.purge_expired_traffic(s)
            job = tuning.claim_job(
                s, self.worker, stale_after_s=self._stale_after_s, job_id=job_id, hardware=self._hardware
            )
            if job is None:
                return None
            claimed_id = job.id
        log.info("runner %s claimed job %s", self.worker, claimed_id)
        _JobRun(self, claimed_id).run()
        return claimed_id

    def sweep_orphans(self) -> list[int]:
        """Kill servers left on this host by trials the store says are over (a job recovered from another
        host cannot kill them: only a runner on their host can). Returns the process groups killed."""
        host = socket.gethostname()
        since = datetime.now(UTC) - ORPHAN_WINDOW
        with transaction(self._factory) as s:
            rows = [(r.job_id, r.number, r.pgid) for r in tuning.finished_trials_with_processes(s, host, since)]
        killed = []
        for job_id, number, pgid in rows:
            if pgid and self._group_alive(pgid):
                log.warning("killing process group %s left by finished trial %s of job %s", pgid, number, job_id)
                self._kill_group(pgid)
                killed.append(pgid)
        return killed

    # ------------------------------------------------------------------ helpers used by _JobRun
    def session(self) -> Any:
        return transaction(self._factory)


class _JobRun:
    """One claimed job, from recovery to publication."""

    def __init__(self, runner: JobRunner, job_id: str) -> None:
        self.r = runner
        self.job_id = job_id
        self.cancelled = threading.Event()
        self.lost = threading.Event()  # another runner took the job over: stop without writing the outcome
        self.results: dict[int, TrialResult] = {}
        self.failed = 0

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat(self, done: threading.Event) -> None:
        while not done.wait(self.r._heartbeat_s):
            try:
                with self.r.session() as s:
                    ours, cancel = tuning.heartbeat(s, self.job_id, self.r.worker)
            except Exception:
                log.exception("heartbeat failed for job %s", self.job_id)
                continue
            if cancel:
                self.cancelled.set()
            if not ours:
                self.lost.set()
                self.cancelled.set()
                return

    def _is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    # ------------------------------------------------------------------ main
    def run(self) -> None:
        done = threading.Event()
        hb = threading.Thread(target=self._heartbeat, args=(done,), daemon=True, name=f"hb-{self.job_id[:8]}")
        hb.start()
        try:
            self._run()
        except TunerError as e:  # the job cannot run as asked (refused input, deleted traffic): say why
            log.warning("job %s refused: %s", self.job_id, e.detail)
            with self.r.session() as s:
                tuning.finish_job(s, self.job_id, self.r.worker, JobStatus.FAILED, error=e.detail)
        except Exception as e:
            log.exception("job %s failed", self.job_id)
            with self.r.session() as s:
                tuning.finish_job(s, self.job_id, self.r.worker, JobStatus.FAILED, error=f"internal error: {e}")
        finally:
            done.set()
            hb.join(5)

    def _run(self) -> None:
        with self.r.session() as s:
            job = tuning.get_job(s, self.job_id)
            spec = tuning.job_spec(job)
            if job.cancel_requested:  # cancelled while its dead runner held it: clean up, run nothing
                self.cancelled.set()
            requests = [] if self.cancelled.is_set() else tuning.traffic_requests(s, job.traffic_id)
        planner = self.r._planner_factory(self.job_id, spec, requests)
        self._recover(planner)
        executor = self.r._executor_factory(spec)
        started = time.monotonic()
        running: dict[int, _Running] = {}
        try:
            self._loop(planner, executor, spec, requests, running, started)
        finally:
            if running:  # cancelled or lost: let the evaluators stop their servers, then record what came back
                self.cancelled.set()
                for item in list(running.values()):
                    try:
                        result = item.future.result(timeout=120)
                    except Exception as e:
                        result = _infra(item.proposal, f"trial did not stop cleanly: {e}", spec)
                    self._record(planner, item.proposal, result)
            executor.close()
        if self.lost.is_set():
            log.warning("job %s was taken over by another runner; %s stops", self.job_id, self.r.worker)
            return
        if self.cancelled.is_set():
            with self.r.session() as s:
                tuning.finish_job(s, self.job_id, self.r.worker, JobStatus.CANCELLED, error="cancelled on request")
            return
        self._publish(planner, spec)

    def _loop(
        self,
        planner: Planner,
        executor: TrialExecutor,
        spec: JobSpec,
        requests: list[TrafficRequest],
        running: dict[int, _Running],
        started: float,
    ) -> None:
        tp = spec.serving.tensor_parallel_size
        while not self.cancelled.is_set():
            over_time = spec.budget.max_wall_s is not None and time.monotonic() - started > spec.budget.max_wall_s
            # The baseline runs alone: its greedy outputs are every later trial's correctness reference.
            baseline_known = any(r.spec.is_off and r.status.has_figures() for r in self.results.values())
            limit = executor.free_slots(tp) if baseline_known else (0 if running else 1)
            exhausted = False
            while not over_time and limit > 0 and not self.cancelled.is_set():
                proposal = planner.ask()
                if proposal is None:
                    exhausted = True
                    break
                if proposal.number in self.results:  # finished before a restart: tell again, never re-run
                    planner.tell(proposal.number, self.results[proposal.number])
                    continue
                running[proposal.number] = _Running(proposal, self._launch(executor, spec, requests, proposal))
                limit -= 1
                if not baseline_known:
                    break
            if not running and (exhausted or over_time):
                return
            done, _ = wait([i.future for i in running.values()], timeout=self.r._poll_s, return_when=FIRST_COMPLETED)
            for number, item in list(running.items()):
                if item.future in done:
                    del running[number]
                    try:
                        result = item.future.result()
                    except Exception as e:  # an executor must return results; treat a raise as infrastructure
                        result = _infra(item.proposal, f"executor error: {e}", spec)
                    self._record(planner, item.proposal, result)

    def _launch(
        self, executor: TrialExecutor, spec: JobSpec, requests: list[TrafficRequest], proposal: Proposal
    ) -> Future[TrialResult]:
        levels = to_jsonable(list(spec.levels))
        with self.r.session() as s:
            tuning.start_trial(s, self.job_id, proposal, levels=levels, worker=self.r.worker)
        reference = next(
            (r.reference_outputs for r in self.results.values() if r.spec.is_off and r.reference_outputs), None
        )
        hardware = spec.hardware
        if hardware == "auto" and spec.engine is Engine.VLLM:
            # An "auto" job stays on the chip its baseline ran on (stamped by the executor), also after a
            # restart: its trials are compared with that baseline, and its recommendation is keyed by it.
            hardware = next(
                (r.hardware for _, r in sorted(self.results.items()) if r.hardware and r.hardware != "auto"), hardware
            )
        trial = TrialSpec(
            model=spec.model,
            spec=proposal.spec,
            levels=spec.levels,
            requests=tuple(requests),
            serving=spec.serving,
            slo=spec.slo,
            hardware=hardware,
            correctness_prompts=spec.correctness_prompts,
            reference_outputs=None if proposal.spec.is_off else reference,
            job_id=self.job_id,
            number=proposal.number,
            deadline_s=self.r._trial_deadline_s,
        )

        def on_started(pgid: int) -> None:
            with self.r.session() as s:
                tuning.set_trial_pgid(s, self.job_id, proposal.number, pgid)

        log_dir = str(self.r._log_dir / self.job_id) if self.r._log_dir else None
        ctx = TrialContext(is_cancelled=self._is_cancelled, on_process_started=on_started, log_dir=log_dir)
        try:
            return executor.submit(trial, ctx)
        except Exception as e:  # e.g. a job for one chip on a worker with another: recorded, never run
            future: Future[TrialResult] = Future()
            future.set_result(_infra(proposal, f"not launched: {e}", spec))
            return future

    def _record(self, planner: Planner, proposal: Proposal, result: TrialResult) -> None:
        if not result.worker:
            result = replace(result, worker=self.r.worker)
        with self.r.session() as s:
            stored = tuning.finish_trial(s, self.job_id, proposal.number, result)
        if stored is None:
            return
        self.results[proposal.number] = result
        if result.status is not TrialStatus.SUCCEEDED:
            self.failed += 1
        planner.tell(proposal.number, result)  # a cancelled one too: Optuna marks it failed, learns nothing
        if result.status is not TrialStatus.CANCELLED:
            self._progress(planner)

    def _progress(self, planner: Planner) -> None:
        try:
            outcome = planner.outcome()
            best = {
                "speculative_config": outcome.deployed.to_vllm(),
                "label": outcome.deployed.label(),
                "trial": outcome.best_trial,
                "speedup": to_jsonable(outcome.speedup),
            }
        except Exception:  # no baseline yet: nothing to compare with
            best = None
        with self.r.session() as s:
            job = tuning.get_job(s, self.job_id)
            progress = dict(job.progress or {})
            progress.update(trials_finished=len(self.results), trials_failed=self.failed)
            tuning.set_progress(s, self.job_id, progress, best)

    # ------------------------------------------------------------------ recovery and publication
    def _recover(self, planner: Planner) -> None:
        """Kill what a dead runner left, fail its running trials (here and in Optuna), re-learn finished ones."""
        host = socket.gethostname()
        with self.r.session() as s:
            rows = tuning.list_trials(s, self.job_id)
            for row in rows:
                result = tuning.trial_result(row)
                if result is not None and TrialStatus(row.status).is_finished():
                    self.results[row.number] = result
                    if result.status is not TrialStatus.SUCCEEDED:
                        self.failed += 1
            stale = tuning.abandoned_trials(s, self.job_id)
            for row in stale:
                if row.pgid and (row.worker or "").rpartition("@")[2] == host:
                    log.warning("killing process group %s left by %s (trial %s)", row.pgid, row.worker, row.number)
                    self.r._kill_group(row.pgid)
                tuning.mark_trial_abandoned(s, row, f"runner {row.worker} died during the trial; re-queued")
                self.failed += 1
            stale_numbers = [(row.number, row.worker) for row in stale]
            known = {row.number for row in rows}
        for number, result in sorted(self.results.items()):
            planner.tell(number, result)
        for number, worker in stale_numbers:
            planner.abandon(number, f"runner {worker} died during the trial")
        for proposal in planner.pending():  # asked for, then the runner died before recording the launch
            if proposal.number not in known:
                planner.abandon(proposal.number, "the runner died before launching the trial")

    def _publish(self, planner: Planner, spec: JobSpec) -> None:
        outcome = planner.outcome()
        with self.r.session() as s:
            job: JobRow = tuning.get_job(s, self.job_id)
            traffic = tuning.get_traffic(s, job.traffic_id)
            baseline = outcome.baseline_trial
            if baseline is None or baseline not in self.results or not self.results[baseline].status.has_figures():
                reason = next(
                    (r.failure.reason for r in self.results.values() if r.spec.is_off and r.failure), "no baseline"
                )
                tuning.finish_job(
                    s,
                    self.job_id,
                    self.r.worker,
                    JobStatus.FAILED,
                    error=f"the no-speculation baseline could not be measured: {reason}",
                )
                return
            recommendations.publish(s, job, spec, outcome, self.results, traffic)
            job.best = {
                "speculative_config": outcome.deployed.to_vllm(),
                "label": outcome.deployed.label(),
                "speedup": to_jsonable(outcome.speedup),
                "notes": list(outcome.notes),
                "skipped": to_jsonable(outcome.skipped),
                "engine": spec.engine.value,
                "simulated": spec.engine is Engine.SIMULATED,
            }
            tuning.finish_job(s, self.job_id, self.r.worker, JobStatus.SUCCEEDED)


def _infra(proposal: Proposal, reason: str, spec: JobSpec) -> TrialResult:
    return TrialResult(
        status=TrialStatus.FAILED,
        engine=spec.engine,
        spec=proposal.spec,
        failure=Failure(FailureClass.INFRA, reason),
    )
