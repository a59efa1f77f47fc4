"""One claimed job, from recovery to publication: heartbeat and fencing, the trial loop through an executor,
recovery of what a dead runner left, progress, and the outcome. ``tuner.job_runner`` claims the job and
hands it here with its frozen config and collaborators; see that module for the guarantees."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from tuner import runs, tuning
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
    TrialExecutor,
    TrialProgress,
    TrialResult,
    TrialSpec,
    TrialStatus,
    to_jsonable,
)
from tuner.errors import TunerError
from tuner.transient import DEFAULT_RETRY_S, is_transient
from tuner.tuning import Claim, LostClaim

log = logging.getLogger("tuner.runner")

PlannerFactory = Callable[[str, JobSpec, list[TrafficRequest]], Planner]
ExecutorFactory = Callable[[JobSpec], TrialExecutor]
Write = Callable[..., Any]  # JobRunner.write: (what, work(session), retry_s=None) -> work's value


@dataclass(frozen=True)
class RunnerConfig:
    """How a runner works, fixed for its lifetime; every job it runs reads it."""

    worker: str  # name@host
    heartbeat_s: float = 2.0
    stale_after_s: float = 15.0  # a job whose heartbeat is older is taken over
    poll_s: float = 0.5
    log_dir: Path | None = None
    hardware: tuple[str, ...] | None = None  # chip families it claims jobs for (None: any)
    trial_deadline_s: float | None = None  # a trial still running this long is killed: TIMEOUT
    db_retry_s: float = DEFAULT_RETRY_S


@dataclass
class _Running:
    proposal: Proposal
    future: Future[TrialResult]


class JobRun:
    """One claimed job, from recovery to publication. Reads the runner's frozen config and the collaborators
    it is handed; it never sees a row (the store hands back domain records, ``tuner.runs``)."""

    def __init__(
        self,
        config: RunnerConfig,
        claim: Claim,
        *,
        write: Write,
        write_once: Callable[[], AbstractContextManager[Session]],
        planner_factory: PlannerFactory,
        executor_factory: ExecutorFactory,
    ) -> None:
        self.cfg = config
        self.claim = claim
        self.job_id = claim.job_id
        self.worker = config.worker
        self._store_write = write
        self._write_once = write_once
        self._planner_factory = planner_factory
        self._executor_factory = executor_factory
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
            return self._store_write(what, fenced, retry_s)
        except LostClaim:
            self._lose()
            raise

    def _lose(self) -> None:
        if not self.lost.is_set():
            log.warning("job %s: %s lost its claim to another runner; stopping without writing", *self._who())
        self.lost.set()
        self.cancelled.set()

    def _who(self) -> tuple[str, str]:
        return self.job_id, self.worker

    def _heartbeat(self, done: threading.Event) -> None:
        failing = False
        while not done.wait(self.cfg.heartbeat_s):
            try:
                with self._write_once() as s:
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
        try:
            self._store_write(f"finish job {self.job_id}", lambda s: runs.end_job(s, self.claim, status, error))
        except LostClaim:
            self._lose()

    def _run(self) -> None:
        spec, requests = self._write("read the job", lambda s: runs.job_to_run(s, self.job_id))
        if requests is None:  # cancelled while its dead runner held it: clean up, run nothing
            self.cancelled.set()
            requests = []
        planner = self._planner_factory(self.job_id, spec, requests)
        executor = self._executor_factory(spec)
        try:
            self._recover(planner, executor)
        except BaseException:
            executor.close()
            raise
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
            log.warning("job %s was taken over by another runner; %s stops", self.job_id, self.worker)
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
                self.cancelled.wait(self.cfg.poll_s)
                continue
            done, _ = wait([i.future for i in running.values()], timeout=self.cfg.poll_s, return_when=FIRST_COMPLETED)
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
            lambda s: runs.start_trial(s, self.job_id, proposal, levels=levels, worker=self.worker),
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
            deadline_s=self.cfg.trial_deadline_s,
        )

        def on_started(pgid: int) -> None:
            # The lease file names the group already (before it runs anything); this copy is for recovery
            # from other hosts. A database away for long must not kill the trial: the lease covers it.
            try:
                self._write(
                    f"record pgid of trial {proposal.number}",
                    lambda s: runs.set_trial_pgid(s, self.job_id, proposal.number, pgid),
                )
            except LostClaim:
                raise
            except Exception as e:
                if not is_transient(e):
                    raise
                log.warning("trial %s of job %s: pgid %s not stored (database away)", proposal.number, *self._who())

        def on_progress(progress: TrialProgress) -> None:
            # What `GET /tune/{id}/trials` shows of a running trial; a lost write only loses the display.
            try:
                self._write(
                    f"record stage of trial {proposal.number}",
                    lambda s: runs.set_trial_stage(s, self.job_id, proposal.number, progress),
                    retry_s=0,
                )
            except LostClaim:
                pass  # the trial stops through is_cancelled; nothing of ours is written any more
            except Exception as e:
                log.debug("trial %s of job %s: stage not stored: %s", proposal.number, *self._who(), e)

        log_dir = str(self.cfg.log_dir / self.job_id) if self.cfg.log_dir else None
        ctx = TrialContext(
            is_cancelled=self._is_cancelled, on_process_started=on_started, log_dir=log_dir, on_progress=on_progress
        )
        try:
            return executor.submit(trial, ctx)
        except Exception as e:  # e.g. a job for one chip on a worker with another: recorded, never run
            future: Future[TrialResult] = Future()
            future.set_result(_infra(proposal, f"not launched: {e}", spec))
            return future

    def _record(self, planner: Planner, proposal: Proposal, result: TrialResult) -> None:
        if not result.worker:
            result = replace(result, worker=self.worker)
        if self.lost.is_set():
            return  # the new owner recovers this trial; nothing of ours is written
        try:
            stored = self._write(
                f"finish trial {proposal.number}",
                lambda s: runs.finish_trial(s, self.job_id, proposal.number, result),
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
            self._progress(planner, result.engine)

    def _progress(self, planner: Planner, engine: Engine) -> None:
        outcome = planner.outcome()
        best = runs.job_best(outcome, engine) if outcome.speedup is not None else None  # None: no baseline yet
        finished, failed = len(self.results), self.failed
        self._write(
            "record progress",
            lambda s: runs.record_progress(s, self.job_id, finished=finished, failed=failed, best=best),
        )

    # ------------------------------------------------------------------ recovery and publication
    def _recover(self, planner: Planner, executor: TrialExecutor) -> None:
        """Reclaim what a dead runner left running, fail its running trials (here and in Optuna), re-learn
        finished ones. The store's commit comes first: a crash after it leaves the processes to the next
        recovery's reclaim and to the orphan sweep."""
        rec = self._write("recover the job's trials", lambda s: runs.recover(s, self.job_id))
        if self.claim.epoch > 1:  # taken over: whatever ran before, its pgid stored or not, is reclaimed
            reclaimed = executor.reclaim(self.job_id)
            log.info(
                "job %s taken over (%d trial(s) left running): killed process groups %s, left %s to the live "
                "runner holding them, could not reach %s",
                self.job_id,
                len(rec.left_running),
                list(reclaimed.killed),
                list(reclaimed.held),
                list(reclaimed.unreachable),
            )
        self.results.update(rec.results)
        self.failed = sum(1 for r in self.results.values() if r.status is not TrialStatus.SUCCEEDED)
        self.failed += len(rec.abandoned)
        for number, result in sorted(self.results.items()):
            planner.tell(number, result)
        for number, worker in rec.abandoned:  # a no-op for those Optuna already knows as failed
            planner.abandon(number, f"runner {worker} died during the trial")
        for proposal in planner.pending():  # asked for, then the runner died before recording the launch
            if proposal.number not in rec.known:
                planner.abandon(proposal.number, "the runner died before launching the trial")

    def _publish(self, planner: Planner, spec: JobSpec) -> None:
        outcome = planner.outcome()
        results = dict(self.results)
        try:
            self._store_write(
                f"publish job {self.job_id}", lambda s: runs.publish_outcome(s, self.claim, spec, outcome, results)
            )
        except LostClaim:
            self._lose()


def _infra(proposal: Proposal, reason: str, spec: JobSpec) -> TrialResult:
    return TrialResult(
        status=TrialStatus.FAILED,
        engine=spec.engine,
        spec=proposal.spec,
        failure=Failure(FailureClass.INFRA, reason),
    )
