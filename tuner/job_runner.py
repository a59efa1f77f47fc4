"""The job runner: claim a job, drive its planner's trials through an executor, publish the answer.

A job is claimed by exactly one runner (an atomic conditional UPDATE) which heartbeats while it works. A job
whose runner stopped heart-beating is claimed by another runner, which first kills the process groups the
dead runner left (their ids are stored with each trial), marks those trials failed (in Optuna too, through
``Planner.abandon``) and re-queues them; finished trials are never run again and no result is stored twice
(``tuning.finish_trial`` ignores a second result, ``Planner.tell`` is idempotent).

The database may go away for a while (a restart, a failover): every write is a transaction retried through
transient errors (``tuner.transient``) and written so that a repeat is a no-op. Every write also checks the
claim's epoch (``tuning.fence``): a runner cut off long enough for another to take its job over learns so at
its next write, stops its trials and writes nothing more. The new owner kills what the old one left only
when the GPU lease says its holder is dead (``orphans.held_by_live_runner``): a fenced runner that is still
alive keeps its lease's flock and stops its own servers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
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
from tuner.store.db import in_transaction, transaction
from tuner.store.models import JobRow
from tuner.transient import DEFAULT_RETRY_S, is_transient
from tuner.tuning import Claim, LostClaim

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
    from tuner.workers.process_group import kill_process_group

    kill_process_group(pgid, grace_s=5.0)


def _group_alive(pgid: int) -> bool:
    from tuner.workers.process_group import group_alive

    return group_alive(pgid)


def _never_held(pgid: int) -> bool:
    return False


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
        held_by_live_runner: Callable[[int], bool] = _never_held,
        db_retry_s: float = DEFAULT_RETRY_S,
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
        # pgid -> whether a live runner on this host still holds it (its GPU lease): never kill those
        self._held_by_live_runner = held_by_live_runner
        self._db_retry_s = db_retry_s
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
            report = self._host_report
            self.write("report the worker", lambda s: tuning.report_worker(s, self.worker, report))
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
        attempts = 0

        def claim(s: Session) -> Claim | None:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # the previous attempt's commit may have gone through: that claim is ours
                own = tuning.own_running_job(s, self.worker)
                if own is not None and (job_id is None or own.id == job_id):
                    return Claim(own.id, self.worker, own.attempts)
            tuning.purge_expired_traffic(s)
            job = tuning.claim_job(
                s, self.worker, stale_after_s=self._stale_after_s, job_id=job_id, hardware=self._hardware
            )
            return None if job is None else Claim(job.id, self.worker, job.attempts)

        claimed = self.write("claim a job", claim)
        if claimed is None:
            return None
        log.info("runner %s claimed job %s (epoch %s)", self.worker, claimed.job_id, claimed.epoch)
        _JobRun(self, claimed).run()
        return claimed.job_id

    def sweep_orphans(self) -> list[int]:
        """Kill servers left on this host by trials the store says are over (a job recovered from another
        host cannot kill them: only a runner on their host can). Returns the process groups killed."""
        host = socket.gethostname()
        since = datetime.now(UTC) - ORPHAN_WINDOW
        rows = self.write(
            "list finished trials",
            lambda s: [(r.job_id, r.number, r.pgid) for r in tuning.finished_trials_with_processes(s, host, since)],
        )
        killed = []
        for job_id, number, pgid in rows:
            if pgid and self._group_alive(pgid) and not self._held_by_live_runner(pgid):
                log.warning("killing process group %s left by finished trial %s of job %s", pgid, number, job_id)
                self._kill_group(pgid)
                killed.append(pgid)
        return killed

    # ------------------------------------------------------------------ helpers used by _JobRun
    def write_once(self) -> Any:
        """One transaction, not retried (the heartbeat: its next beat is the retry)."""
        return transaction(self._factory)

    def write(self, what: str, work: Callable[[Session], Any], retry_s: float | None = None) -> Any:
        """``work(session)`` in a transaction retried through transient database errors."""
        return in_transaction(
            self._factory, work, what=what, retry_s=self._db_retry_s if retry_s is None else retry_s, stop=self._stop
        )


class _JobRun:
    """One claimed job, from recovery to publication."""

    def __init__(self, runner: JobRunner, claim: Claim) -> None:
        self.r = runner
        self.claim = claim
        self.job_id = claim.job_id
        self.cancelled = threading.Event()
        self.lost = threading.Event()  # another runner took the job over: stop without writing the outcome
        self.results: dict[int, TrialResult] = {}
        self.failed = 0

    # ------------------------------------------------------------------ writes and heartbeat
    def _write(self, what: str, work: Callable[[Session], Any], retry_s: float | None = None) -> Any:
        """A write of this job's: fenced by the claim (LostClaim once another runner holds the job)."""

        def fenced(s: Session) -> Any:
            if tuning.fence(s, self.claim):
                self.cancelled.set()
            return work(s)

        try:
            return self.r.write(what, fenced, retry_s)
        except LostClaim:
            self._lose()
            raise

    def _lose(self) -> None:
        if not self.lost.is_set():
            log.warning("job %s: %s lost its claim to another runner; stopping without writing", *self._who())
        self.lost.set()
        self.cancelled.set()

    def _who(self) -> tuple[str, str]:
        return self.job_id, self.r.worker

    def _heartbeat(self, done: threading.Event) -> None:
        failing = False
        while not done.wait(self.r._heartbeat_s):
            try:
                with self.r.write_once() as s:
                    cancel = tuning.fence(s, self.claim)
            except LostClaim:
                self._lose()
                return
            except Exception as e:  # the database is away: keep the trials going, the claim may still be ours
                if not failing:
                    log.warning("heartbeat of job %s failed (%s); retrying", self.job_id, type(e).__name__)
                failing = True
                continue
            if failing:
                log.info("heartbeat of job %s is back", self.job_id)
                failing = False
            if cancel:
                self.cancelled.set()

    def _is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    # ------------------------------------------------------------------ main
    def run(self) -> None:
        done = threading.Event()
        hb = threading.Thread(target=self._heartbeat, args=(done,), daemon=True, name=f"hb-{self.job_id[:8]}")
        hb.start()
        try:
            self._run()
        except LostClaim:
            pass  # logged by _lose; the new owner carries on
        except TunerError as e:  # the job cannot run as asked (refused input, deleted traffic): say why
            log.warning("job %s refused: %s", self.job_id, e.detail)
            self._finish(JobStatus.FAILED, e.detail)
        except Exception as e:
            if is_transient(e):  # the database stayed away past the retries: leave the job to be re-claimed
                log.error("job %s: database unavailable for too long; leaving the job to be taken over", self.job_id)
                return
            # The client sees a message and an id; the details (SQL, traceback) stay in this log.
            cid = uuid.uuid4().hex[:12]
            log.exception("job %s failed [correlation id %s]", self.job_id, cid)
            self._finish(JobStatus.FAILED, f"internal error (correlation id {cid}); the worker's log has the details")
        finally:
            done.set()
            hb.join(5)

    def _finish(self, status: JobStatus, error: str | None) -> None:
        def work(s: Session) -> None:
            if tuning.finished_under(s, self.claim) is not None:
                return  # a retry whose first commit went through
            tuning.fence(s, self.claim)
            tuning.finish_job(s, self.job_id, self.r.worker, status, error=error, epoch=self.claim.epoch)

        try:
            self.r.write(f"finish job {self.job_id}", work)
        except LostClaim:
            self._lose()

    def _run(self) -> None:
        def read(s: Session) -> tuple[JobSpec, list[TrafficRequest]]:
            job = tuning.get_job(s, self.job_id)
            if job.cancel_requested:  # cancelled while its dead runner held it: clean up, run nothing
                self.cancelled.set()
            requests = [] if self.cancelled.is_set() else tuning.traffic_requests(s, job.traffic_id)
            return tuning.job_spec(job), requests

        spec, requests = self._write("read the job", read)
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
            self._finish(JobStatus.CANCELLED, "cancelled on request")
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
            if not running:  # no free slot and nothing of ours to wait for: sleep, never spin
                self.cancelled.wait(self.r._poll_s)
                continue
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
        self._write(
            f"start trial {proposal.number}",
            lambda s: tuning.start_trial(s, self.job_id, proposal, levels=levels, worker=self.r.worker),
        )
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
            # The lease file names the group already (before it runs anything); this copy is for recovery
            # from other hosts. A database away for long must not kill the trial: the lease covers it.
            try:
                self._write(
                    f"record pgid of trial {proposal.number}",
                    lambda s: tuning.set_trial_pgid(s, self.job_id, proposal.number, pgid),
                )
            except LostClaim:
                raise
            except Exception as e:
                if not is_transient(e):
                    raise
                log.warning("trial %s of job %s: pgid %s not stored (database away)", proposal.number, *self._who())

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
        if self.lost.is_set():
            return  # the new owner recovers this trial; nothing of ours is written
        try:
            stored = self._write(
                f"finish trial {proposal.number}",
                lambda s: tuning.finish_trial(s, self.job_id, proposal.number, result),
            )
        except LostClaim:
            return
        if stored is None or proposal.number in self.results:
            return
        result = stored  # ours, or the one a retried commit had stored already
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

        def work(s: Session) -> None:
            job = tuning.get_job(s, self.job_id)
            progress = dict(job.progress or {})
            progress.update(trials_finished=len(self.results), trials_failed=self.failed)
            tuning.set_progress(s, self.job_id, progress, best)

        self._write("record progress", work)

    # ------------------------------------------------------------------ recovery and publication
    def _recover(self, planner: Planner) -> None:
        """Kill what a dead runner left, fail its running trials (here and in Optuna), re-learn finished ones."""
        host = socket.gethostname()

        def work(s: Session) -> tuple[list[Any], list[tuple[int, int, str | None]]]:
            stale = tuning.abandoned_trials(s, self.job_id)
            groups = [(row.number, row.pgid, row.worker) for row in stale if row.pgid]
            for row in stale:
                tuning.mark_trial_abandoned(s, row, f"runner {row.worker} died during the trial; re-queued")
            rows = tuning.list_trials(s, self.job_id)
            return [(r.number, r.status, tuning.trial_result(r), r.worker) for r in rows], groups

        rows, groups = self._write("recover the job's trials", work)
        for number, pgid, worker in groups:  # after the commit: a crash here leaves them to the orphan sweep
            if (worker or "").rpartition("@")[2] != host:
                continue  # only a runner on their host can kill them (its orphan sweep does)
            if self.r._held_by_live_runner(pgid):
                # Its runner is alive (cut off from the database, then fenced): it stops its own server.
                log.warning("process group %s of trial %s is still held by a live runner; not killing it", pgid, number)
                continue
            log.warning("killing process group %s left by %s (trial %s)", pgid, worker, number)
            self.r._kill_group(pgid)
        abandoned = []
        for number, status, result, worker in rows:
            if not TrialStatus(status).is_finished():
                continue
            if result is None:  # failed without a result: its runner died (now, or in an earlier recovery)
                abandoned.append((number, worker))
                continue
            self.results[number] = result
        self.failed = sum(1 for r in self.results.values() if r.status is not TrialStatus.SUCCEEDED) + len(abandoned)
        known = {number for number, *_ in rows}
        for number, result in sorted(self.results.items()):
            planner.tell(number, result)
        for number, worker in abandoned:  # a no-op for those Optuna already knows as failed
            planner.abandon(number, f"runner {worker} died during the trial")
        for proposal in planner.pending():  # asked for, then the runner died before recording the launch
            if proposal.number not in known:
                planner.abandon(proposal.number, "the runner died before launching the trial")

    def _publish(self, planner: Planner, spec: JobSpec) -> None:
        outcome = planner.outcome()

        def work(s: Session) -> None:
            if tuning.finished_under(s, self.claim) is not None:
                return  # a retry whose first commit went through: published once
            if tuning.fence(s, self.claim):
                self.cancelled.set()
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
                    epoch=self.claim.epoch,
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
            tuning.finish_job(s, self.job_id, self.r.worker, JobStatus.SUCCEEDED, epoch=self.claim.epoch)

        try:
            self.r.write(f"publish job {self.job_id}", work)
        except LostClaim:
            self._lose()


def _infra(proposal: Proposal, reason: str, spec: JobSpec) -> TrialResult:
    return TrialResult(
        status=TrialStatus.FAILED,
        engine=spec.engine,
        spec=proposal.spec,
        failure=Failure(FailureClass.INFRA, reason),
    )
