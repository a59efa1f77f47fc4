"""The executor contract the job runner codes against, and the helpers both implementations share."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    Reclaimed,
    TrialContext,
    TrialExecutor,
    TrialResult,
    TrialSpec,
    TrialStatus,
)
from tuner.workers.gpu_lease import left_running
from tuner.workers.process_group import KILL_GRACE_S, kill_process_group

log = logging.getLogger(__name__)


class HardwareMismatch(ValueError):
    """A trial asked for hardware this executor does not have: a routing error, never run elsewhere."""


class ExecutorClosed(RuntimeError):
    """``submit`` after ``close``."""


class Executor(ABC, TrialExecutor):
    """The base of both implementations of :class:`~tuner.domain.TrialExecutor`; this is that contract in
    detail, as every implementation keeps it. Trials run on GPUs, as many at once as there are free GPU
    groups.

    - ``free_slots(tp)`` says how many more trials of tensor-parallel size ``tp`` could start now. It is
      checked against what is actually free (the host's GPU lease, the Ray cluster's available
      resources), less the trials already submitted that have not started yet. It is a snapshot: other
      workers may take GPUs meanwhile, in which case a submitted trial waits for its group.
    - ``submit(spec, ctx)`` returns at once with a future. The future always resolves to exactly one
      :class:`~tuner.domain.TrialResult`, never to an exception and never twice: a trial failure is a
      result with ``status=FAILED`` and a classified ``failure``. A worker or node lost mid-trial is
      retried once (on another node when the cluster has one); if the retry is lost too the result is an
      ``INFRA`` failure. A trial still running ``deadline_s`` (plus a short grace) after it started is
      killed with its process group: ``TIMEOUT``. ``ctx.is_cancelled()`` is forwarded to the evaluator;
      a trial that ignores it is killed after a grace period: ``CANCELLED``.
      ``submit`` raises only for caller errors: :class:`HardwareMismatch` when ``spec.hardware`` is not
      this executor's hardware, :class:`ExecutorClosed` after ``close``.
    - The spec the evaluator sees carries the GPUs it may use: ``gpu_ids`` set to the leased physical ids
      (local), or ``None`` inside Ray, which has already set the visibility variables for the task.
    - Every process group a trial starts is on record on its host before it runs anything, under the
      trial's label (``job=<id> trial=<n>``), in a file its runner's process keeps locked while the trial
      runs: the GPU lease's files (local), a trial record per task on the node (Ray; see
      :mod:`tuner.workers.gpu_lease`).
    - ``reclaim(job_id)`` reads those records wherever this executor reaches (this host's lease
      directories; every alive Ray node, one task per host) and kills, SIGTERM then SIGKILL after
      ``KILL_GRACE_S``, the live groups of ``job_id`` whose file nobody holds any more: their runner died
      and left them running. Groups whose file a live process still holds (a runner cut off from the
      store, then fenced) are left to it and returned as ``held``; hosts that could not be asked, as
      ``unreachable``. It needs no trial submitted, so a fresh executor reclaims what another process left;
      it raises for nothing but bugs.
    - ``close()`` stops accepting trials, cancels those still running (their futures resolve
      ``CANCELLED``), kills their processes and releases GPUs. It is idempotent.
    """

    @abstractmethod
    def free_slots(self, tensor_parallel_size: int = 1) -> int: ...

    @abstractmethod
    def submit(self, spec: TrialSpec, ctx: TrialContext) -> concurrent.futures.Future[TrialResult]: ...

    @abstractmethod
    def reclaim(self, job_id: str) -> Reclaimed: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class SubmittedTrial:
    """A trial an executor has accepted and not yet finished: its key, what it runs on how many GPUs, the
    future its caller holds, and the executor-side cancel (``close``). Each executor adds its own state."""

    key: str
    spec: TrialSpec
    ctx: TrialContext
    tp: int
    future: concurrent.futures.Future[TrialResult]
    kill: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class AttemptRecord:
    """One run of a trial on a worker, for logs and tests: what happened and where."""

    trial: str  # the executor's key for the submitted trial
    attempt: int  # 0, or 1 for the retry after a lost worker
    outcome: str  # "result" | "lost" | "timeout" | "cancelled" | "error"
    where: str | None = None  # host or Ray node id
    detail: str = ""
    pgids: tuple[int, ...] = ()


def failed_result(
    spec: TrialSpec,
    engine: Engine,
    cls: FailureClass,
    reason: str,
    *,
    status: TrialStatus = TrialStatus.FAILED,
    worker: str | None = None,
    hardware: str | None = None,
    pgid: int | None = None,
    wall_s: float | None = None,
    log_tail: str = "",
) -> TrialResult:
    return TrialResult(
        status=status,
        engine=engine,
        spec=spec.spec,
        failure=Failure(cls, reason, log_tail),
        hardware=hardware,
        worker=worker,
        pgid=pgid,
        wall_s=wall_s,
    )


def with_origin(result: TrialResult, worker: str | None, hardware: str | None) -> TrialResult:
    """Fill in where a result came from when the evaluator did not say.

    ``hardware`` is the chip family of the GPUs (or node) the trial ran on. It replaces a missing value and
    "auto" too: the vLLM runner echoes the job's request, and a job for "auto" must be recorded (and its
    recommendation keyed) under the chip that actually ran it.
    """
    fill_worker = result.worker is None and bool(worker)
    fill_hardware = bool(hardware) and hardware != "auto" and (result.hardware or "auto").strip().lower() == "auto"
    if not (fill_worker or fill_hardware):
        return result
    return dataclasses.replace(
        result,
        worker=worker if fill_worker else result.worker,
        hardware=hardware if fill_hardware else result.hardware,
    )


def with_retried(result: TrialResult, lost: Sequence[Failure]) -> TrialResult:
    """The result with the attempts lost before it (and retried) on record, oldest first."""
    if not lost:
        return result
    return dataclasses.replace(result, retried_failures=(*lost, *result.retried_failures))


def resolved(result: TrialResult) -> concurrent.futures.Future[TrialResult]:
    fut: concurrent.futures.Future[TrialResult] = concurrent.futures.Future()
    fut.set_result(result)
    return fut


def engine_of(evaluator: object, default: Engine = Engine.VLLM) -> Engine:
    """The engine label of an evaluator (``engine`` attribute, else by class name), so that a failure
    record made by the executor never loses the "simulated" label."""
    value = getattr(evaluator, "engine", None)
    if value is not None:
        try:
            return Engine(value)
        except ValueError:
            pass
    name = evaluator.__name__ if isinstance(evaluator, type) else type(evaluator).__name__
    if "simulat" in name.lower():
        return Engine.SIMULATED
    return default


def hostname() -> str:
    return socket.gethostname()


def reclaim_on_host(
    directories: Sequence[str | os.PathLike[str]], job_id: str, *, remove_records: bool = False
) -> Reclaimed:
    """``reclaim`` on this host: kill the groups the lease files in ``directories`` record for ``job_id`` and
    nobody holds (in parallel, ``KILL_GRACE_S`` each), report those a live holder has. ``remove_records``:
    the files are trial records (``gpu_lease.trial_record``), removed once nobody holds them."""
    found = left_running(directories, job_id)
    killed: list[int] = []
    if found.orphaned:
        log.warning("job %s: killing process groups %s its gone runner left running", job_id, list(found.orphaned))
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(found.orphaned))) as pool:
            outcomes = pool.map(_kill_quietly, found.orphaned)
            killed = [pgid for pgid, gone in zip(found.orphaned, outcomes, strict=True) if gone]
    if remove_records and len(killed) == len(found.orphaned):  # a group that survived keeps its record
        for path in found.unheld_files:
            path.unlink(missing_ok=True)
    return Reclaimed(killed=tuple(killed), held=found.held)


def _kill_quietly(pgid: int) -> bool:
    try:
        if kill_process_group(pgid, grace_s=KILL_GRACE_S):
            return True
        log.error("process group %s survived SIGKILL", pgid)
    except OSError as exc:  # not ours to signal (another user's pid after all)
        log.error("could not kill process group %s: %r", pgid, exc)
    return False
