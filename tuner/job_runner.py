"""The job runner: claim a job, drive its planner's trials through an executor, publish the answer.

A job is claimed by exactly one runner (an atomic conditional UPDATE) which heartbeats while it works. A job
whose runner stopped heart-beating is claimed by another runner, which marks the trials left running failed
(``runs.recover``; in Optuna too, through ``Planner.abandon``), has its executor reclaim what they left
running (``TrialExecutor.reclaim``: the GPU leases of this host, every node of a Ray cluster) and re-queues
them; finished trials are never run again and no result is stored twice (``runs.finish_trial`` ignores a
second result, ``Planner.tell`` is idempotent). Servers on a host no executor reaches are killed by that
host's own runner, which sweeps the process groups of finished trials (``sweep_orphans``).

The database may go away for a while (a restart, a failover): every write is a transaction retried through
transient errors (``tuner.transient``) and written so that a repeat is a no-op. Every write also checks the
claim's epoch (``tuning.fence``): a runner cut off long enough for another to take its job over learns so at
its next write, stops its trials and writes nothing more. What the old owner left is killed only when its
GPU lease says its holder is dead: a fenced runner that is still alive keeps its lease's flock and stops its
own servers. ``tuner.job_run`` runs one claimed job.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tuner import runs, tuning
from tuner.job_run import ExecutorFactory, JobRun, PlannerFactory, RunnerConfig
from tuner.store.db import in_transaction, transaction
from tuner.transient import DEFAULT_RETRY_S
from tuner.tuning import Claim

log = logging.getLogger("tuner.runner")

KillGroup = Callable[[int], object]


def default_worker_name() -> str:
    return f"worker-{os.getpid()}"


def worker_identity(name: str) -> str:
    """``name@host``: the host part tells a recovering runner whether it can kill what the trial left."""
    return name if "@" in name else f"{name}@{socket.gethostname()}"


def _never(pgid: int) -> bool:
    return False


ORPHAN_SWEEP_S = 60.0
ORPHAN_WINDOW = timedelta(days=1)  # older process groups are left alone: by then a pid may have been reused


class JobRunner:
    """Runs jobs from the store until stopped. Thread-safe start/stop; one job at a time per runner.

    The process-group functions are injected by wiring (``tuner.workers.process_group``): the runner kills
    nothing itself unless given them. They serve the orphan sweep; what a dead runner left running of a job
    it takes over is the executor's to reclaim (``TrialExecutor.reclaim``).
    """

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
        kill_group: KillGroup | None = None,
        group_alive: Callable[[int], bool] = _never,
        host_report: dict[str, Any] | None = None,
        hardware: Sequence[str] | None = None,
        trial_deadline_s: float | None = None,
        held_by_live_runner: Callable[[int], bool] = _never,
        db_retry_s: float = DEFAULT_RETRY_S,
    ) -> None:
        self.config = RunnerConfig(
            worker=worker_identity(worker or default_worker_name()),
            heartbeat_s=heartbeat_s,
            stale_after_s=stale_after_s,
            poll_s=poll_s,
            log_dir=log_dir,
            hardware=None if hardware is None else tuple(hardware),
            trial_deadline_s=trial_deadline_s,
            db_retry_s=db_retry_s,
        )
        self.worker = self.config.worker
        self._factory = factory
        self._planner_factory = planner_factory
        self._executor_factory = executor_factory
        self._kill_group = kill_group
        self._group_alive = group_alive
        # pgid -> whether a live runner on this host still holds it (its GPU lease): never kill those
        self._held_by_live_runner = held_by_live_runner
        self._host_report = host_report
        self._next_sweep = 0.0
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
                    self._stop.wait(self.config.poll_s)
            except Exception:  # a bug must not kill the runner thread: log, back off, go on
                log.exception("runner %s: unexpected error", self.worker)
                self._stop.wait(max(self.config.poll_s, 1.0))

    def run_once(self, job_id: str | None = None) -> str | None:
        """Claim one job (or the given one) and run it to the end. Returns its id, or None if none was free."""
        attempts = 0
        cfg = self.config

        def claim(s: Session) -> Claim | None:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # the previous attempt's commit may have gone through: that claim is ours
                own = tuning.own_running_job(s, self.worker)
                if own is not None and (job_id is None or own.id == job_id):
                    return Claim(own.id, self.worker, own.attempts)
            tuning.purge_expired_traffic(s)
            job = tuning.claim_job(
                s, self.worker, stale_after_s=cfg.stale_after_s, job_id=job_id, hardware=cfg.hardware
            )
            return None if job is None else Claim(job.id, self.worker, job.attempts)

        claimed = self.write("claim a job", claim)
        if claimed is None:
            return None
        log.info("runner %s claimed job %s (epoch %s)", self.worker, claimed.job_id, claimed.epoch)
        JobRun(
            cfg,
            claimed,
            write=self.write,
            write_once=self.write_once,
            planner_factory=self._planner_factory,
            executor_factory=self._executor_factory,
        ).run()
        return claimed.job_id

    def sweep_orphans(self) -> list[int]:
        """Kill servers left on this host by trials the store says are over (a job recovered from another
        host cannot kill them: only a runner on their host can). Returns the process groups killed."""
        if self._kill_group is None:
            return []
        host = socket.gethostname()
        since = datetime.now(UTC) - ORPHAN_WINDOW
        groups = self.write("list finished trials", lambda s: runs.finished_trial_processes(s, host, since))
        killed = []
        for g in groups:
            if self._group_alive(g.pgid) and not self._held_by_live_runner(g.pgid):
                log.warning("killing process group %s left by finished trial %s of job %s", g.pgid, g.number, g.job_id)
                self._kill_group(g.pgid)
                killed.append(g.pgid)
        return killed

    # ------------------------------------------------------------------ store access, shared with JobRun
    def write_once(self) -> AbstractContextManager[Session]:
        """One transaction, not retried (the heartbeat: its next beat is the retry)."""
        return transaction(self._factory)

    def write(self, what: str, work: Callable[[Session], Any], retry_s: float | None = None) -> Any:
        """``work(session)`` in a transaction retried through transient database errors."""
        return in_transaction(
            self._factory,
            work,
            what=what,
            retry_s=self.config.db_retry_s if retry_s is None else retry_s,
            stop=self._stop,
        )
