"""Trials on this host's GPUs, in threads, each on a disjoint GPU group leased from the shared lease."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.domain import (
    Engine,
    Evaluator,
    FailureClass,
    Reclaimed,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
)
from tuner.workers.executors._base import (
    AttemptRecord,
    Executor,
    ExecutorClosed,
    HardwareMismatch,
    SubmittedTrial,
    engine_of,
    failed_result,
    hostname,
    reclaim_on_host,
    resolved,
    with_origin,
)
from tuner.workers.gpu_lease import GpuLease, LeasedGroup
from tuner.workers.hardware import GpuInfo, canonical_family, detect_gpus, hardware_matches
from tuner.workers.process_group import KILL_GRACE_S, kill_process_group

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

log = logging.getLogger(__name__)


@dataclass
class _Trial(SubmittedTrial):
    pgids: list[int] = field(default_factory=list)  # the process groups it started, for close


class LocalExecutor(Executor):
    """Runs trials in threads on this host, never two on one GPU, across every process sharing ``lease_dir``.

    ``evaluator`` is an Evaluator or a zero-argument factory of one (called once per trial, so
    evaluators need not be thread-safe). ``gpus``: physical ids to use; None detects them
    (amd-smi / rocm-smi / nvidia-smi); ``[]`` is a CPU-only host with one slot, itself leased so that two
    worker processes on one CPU host do not run two servers at once. ``hardware`` is the family this
    executor serves ("auto": whatever the host has); ``family`` names the GPUs when ``gpus`` is given
    explicitly (else they are detected). The executor uses the GPUs of one family only: the requested one,
    or for "auto" the host's most numerous one, so a job never mixes chips even on a mixed host; results
    are stamped with that family. ``max_parallel`` caps the trials running at once (1 on an SQLite store,
    which serialises writers), on top of the GPU bound.
    """

    def __init__(
        self,
        evaluator: Evaluator | Callable[[], Evaluator],
        *,
        gpus: Sequence[int] | None = None,
        lease_dir: Path,
        hardware: str = "auto",
        family: str | None = None,
        engine: Engine | None = None,
        max_parallel: int | None = None,
        hang_grace_s: float = 10.0,
        cancel_grace_s: float = 30.0,
        poll_s: float = 0.1,
        detect: Callable[[], Sequence[GpuInfo]] = detect_gpus,
    ) -> None:
        self._factory = _as_factory(evaluator)
        if gpus is None:
            gpus, family = _one_family(detect(), family or hardware)
        elif gpus and family is None:  # explicit ids (TUNER_GPUS): name them by detection when it knows them
            named = {g.index: g for g in detect()}
            if all(int(i) in named for i in gpus):
                gpus, family = _one_family([named[int(i)] for i in gpus], hardware)
        self.gpus: tuple[int, ...] = tuple(sorted(set(int(g) for g in gpus)))
        self.cpu_only = not self.gpus
        if self.cpu_only:
            family = family or "cpu"  # a caller may name the chip a CPU-only evaluator stands in for (simulated)
        elif family is None and hardware != "auto":
            family = canonical_family(hardware)
        self.family = family
        self.hardware = hardware
        if not hardware_matches(hardware, family):
            raise HardwareMismatch(f"executor for {hardware!r} on a host with {family or 'mixed/unknown'} GPUs")
        self._engine_given = engine is not None
        self.engine = engine or engine_of(evaluator)  # refined from the first evaluator built
        self._lease = GpuLease(Path(lease_dir) / "cpu") if self.cpu_only else GpuLease(lease_dir)
        self._lease_dirs = (Path(lease_dir), Path(lease_dir) / "cpu")  # every lease on this host, for reclaim
        self._among: tuple[int, ...] = (0,) if self.cpu_only else self.gpus
        self.max_parallel = max_parallel
        self._slots = threading.BoundedSemaphore(max_parallel) if max_parallel else None
        self._active = 0  # submitted trials whose thread has not ended (a hung one: until its evaluator returns)
        self.hang_grace_s = hang_grace_s
        self.cancel_grace_s = cancel_grace_s
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: dict[str, _Trial] = {}  # submitted, no GPUs yet
        self._running: dict[str, _Trial] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._ids = itertools.count()
        self.history: list[AttemptRecord] = []

    # -- contract ----------------------------------------------------------------------------------
    def free_slots(self, tensor_parallel_size: int = 1) -> int:
        if self._closed:
            return 0
        need = 1 if self.cpu_only else max(1, int(tensor_parallel_size))
        if need > len(self._among):
            return 0
        with self._lock:
            waiting = sum(1 if self.cpu_only else t.tp for t in self._pending.values())
            capped = None if self.max_parallel is None else self.max_parallel - self._active
        free = max(0, (len(self._lease.free(self._among)) - waiting) // need)
        return max(0, free if capped is None else min(free, capped))

    def submit(self, spec: TrialSpec, ctx: TrialContext) -> concurrent.futures.Future[TrialResult]:
        if self._closed:
            raise ExecutorClosed("executor is closed")
        if not hardware_matches(spec.hardware, self.family):
            raise HardwareMismatch(f"trial for {spec.hardware!r} submitted to a {self.family} executor")
        tp = spec.serving.tensor_parallel_size
        if not self.cpu_only and tp > len(self.gpus):
            return resolved(
                failed_result(
                    spec,
                    self.engine,
                    FailureClass.UNSUPPORTED,
                    f"tensor_parallel_size={tp} needs {tp} GPUs; this executor has {len(self.gpus)}",
                    worker=hostname(),
                    hardware=self.family,
                )
            )
        trial = _Trial(f"local-{next(self._ids)}", spec, ctx, tp, concurrent.futures.Future())
        trial.future.set_running_or_notify_cancel()
        with self._lock:
            self._pending[trial.key] = trial
            self._active += 1
        thread = threading.Thread(target=self._run, args=(trial,), name=f"trial-{trial.key}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return trial.future

    def reclaim(self, job_id: str) -> Reclaimed:
        """Kill what trials of ``job_id`` left in this host's GPU leases (the CPU slot's too) and nobody holds."""
        return reclaim_on_host(self._lease_dirs, job_id)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            trials = [*self._pending.values(), *self._running.values()]
        for trial in trials:
            trial.kill.set()
        for thread in self._threads:
            thread.join(timeout=self.cancel_grace_s + self.hang_grace_s + 30)

    # -- one trial ---------------------------------------------------------------------------------
    def _run(self, trial: _Trial) -> None:
        slot = {"held": False, "counted": True}

        def let_go() -> None:  # before resolving where possible, so free_slots agrees with the result
            if slot["held"] and self._slots is not None:
                self._slots.release()
            slot["held"] = False
            with self._lock:
                if slot["counted"]:
                    self._active -= 1
                slot["counted"] = False

        try:
            slot["held"] = self._wait_for_slot(trial)
            group = self._wait_for_group(trial) if slot["held"] else None
            if group is None:
                let_go()
                self._finish(trial, self._cancelled(trial, "cancelled before it started"), None, "cancelled")
                return
            with group:
                finished = self._execute(trial, group)
            let_go()
            if finished is not None:  # resolved once the GPUs are free again, so free_slots agrees
                self._finish(trial, *finished)
        except BaseException as exc:  # never leave a future unresolved
            log.exception("trial %s: executor error", trial.key)
            let_go()
            if not trial.future.done():
                result = failed_result(trial.spec, self.engine, FailureClass.INTERNAL, f"executor: {exc!r}")
                self._finish(trial, result, None, "error")
        finally:
            let_go()

    def _stop_waiting(self, trial: _Trial) -> bool:
        if trial.kill.is_set() or _safe(trial.ctx.is_cancelled):
            with self._lock:
                self._pending.pop(trial.key, None)
            return True
        return False

    def _wait_for_slot(self, trial: _Trial) -> bool:
        """One of ``max_parallel`` slots (always True without a cap); False if cancelled while waiting."""
        if self._slots is None:
            return True
        while not self._slots.acquire(timeout=0.5):
            if self._stop_waiting(trial):
                return False
        return True

    def _wait_for_group(self, trial: _Trial) -> LeasedGroup | None:
        n = 1 if self.cpu_only else trial.tp
        label = f"job={trial.spec.job_id} trial={trial.spec.number}"
        while True:
            if self._stop_waiting(trial):
                return None
            group = self._lease.acquire(n, self._among, timeout=0.5, label=label)
            if group is not None:
                with self._lock:
                    self._pending.pop(trial.key, None)
                    self._running[trial.key] = trial
                return group

    def _execute(self, trial: _Trial, group: LeasedGroup) -> tuple[TrialResult, str, str] | None:
        """Run the evaluator; return (result, where, outcome) to resolve, or None if resolved already."""
        spec = trial.spec if self.cpu_only else dataclasses.replace(trial.spec, gpu_ids=group.gpus)
        done = threading.Event()
        box: dict[str, object] = {}

        def on_started(pgid: int) -> None:
            trial.pgids.append(pgid)
            try:  # if this worker dies, the server's group keeps the GPUs busy for the others
                group.record_pgid(pgid)
            except OSError:
                log.exception("trial %s: could not record pgid %s in the GPU lease", trial.key, pgid)
            _safe(lambda: trial.ctx.on_process_started(pgid))

        ctx = TrialContext(
            is_cancelled=lambda: trial.kill.is_set() or _safe(trial.ctx.is_cancelled),
            on_process_started=on_started,
            log_dir=trial.ctx.log_dir,
            on_progress=lambda progress: trial.ctx.on_progress(progress),  # the runner's own never raises
        )

        def call() -> None:
            try:
                evaluator = self._factory()
                if not self._engine_given:
                    self.engine = engine_of(evaluator, self.engine)
                box["result"] = evaluator(spec, ctx)
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        t0 = time.monotonic()
        runner = threading.Thread(target=call, name=f"eval-{trial.key}", daemon=True)
        runner.start()
        limit = t0 + trial.spec.deadline_s + self.hang_grace_s if trial.spec.deadline_s else float("inf")
        cancel_seen: float | None = None
        forced: str | None = None
        while not done.wait(self.poll_s):
            now = time.monotonic()
            if now >= limit:
                forced = "timeout"
                break
            if cancel_seen is None and ctx.is_cancelled():
                cancel_seen = now
            if cancel_seen is not None and now - cancel_seen >= self.cancel_grace_s:
                forced = "cancelled"
                break
        wall = time.monotonic() - t0
        where = hostname()
        if forced is None:
            if "error" in box:
                exc = box["error"]
                result = failed_result(
                    trial.spec, self.engine, FailureClass.INTERNAL, f"evaluator raised {exc!r}", wall_s=wall
                )
                return with_origin(result, where, self.family), where, "error"
            returned = box["result"]
            if isinstance(returned, TrialResult):
                result = returned
            else:
                result = failed_result(
                    trial.spec, self.engine, FailureClass.INTERNAL, f"evaluator returned {type(returned).__name__}"
                )
            return with_origin(result, where, self.family), where, "result"
        # Hung or ignoring cancellation: kill what it started, resolve now, keep the GPUs until it returns.
        for pgid in trial.pgids:
            kill_process_group(pgid, grace_s=KILL_GRACE_S)
        if forced == "timeout":
            result = failed_result(
                trial.spec,
                self.engine,
                FailureClass.TIMEOUT,
                f"trial exceeded its deadline of {trial.spec.deadline_s:g} s and was killed",
                worker=where,
                hardware=self.family,
                pgid=trial.pgids[-1] if trial.pgids else None,
                wall_s=wall,
            )
        else:
            result = self._cancelled(trial, "cancelled and killed after the grace period")
        self._finish(trial, result, where, forced)
        if not done.wait(self.hang_grace_s + 30):
            log.warning("trial %s: evaluator still running after its processes were killed", trial.key)
        done.wait()
        return None

    def _cancelled(self, trial: _Trial, reason: str) -> TrialResult:
        return failed_result(
            trial.spec,
            self.engine,
            FailureClass.CANCELLED,
            reason,
            status=TrialStatus.CANCELLED,
            worker=hostname(),
            hardware=self.family,
        )

    def _finish(self, trial: _Trial, result: TrialResult, where: str | None, outcome: str) -> None:
        with self._lock:
            self._running.pop(trial.key, None)
            self._pending.pop(trial.key, None)
            self.history.append(AttemptRecord(trial.key, 0, outcome, where, pgids=tuple(trial.pgids)))
        if not trial.future.done():
            trial.future.set_result(result)


def _one_family(detected: Sequence[GpuInfo], wanted: str) -> tuple[list[int], str | None]:
    """The GPUs of one family among ``detected``: the ``wanted`` one, or for "auto" the most numerous."""
    by_family: dict[str, list[int]] = {}
    for gpu in detected:
        by_family.setdefault(gpu.family, []).append(gpu.index)
    if not by_family:
        return [], None
    if wanted and wanted.strip().lower() != "auto":
        family = canonical_family(wanted)
        if family not in by_family:
            raise HardwareMismatch(f"no {wanted!r} GPUs on this host (it has {', '.join(sorted(by_family))})")
        return by_family[family], family
    family = max(sorted(by_family), key=lambda f: len(by_family[f]))
    if len(by_family) > 1:
        log.warning("mixed GPUs on this host %s: an 'auto' job uses the %s GPUs only", sorted(by_family), family)
    return by_family[family], family


def _as_factory(evaluator: Evaluator | Callable[[], Evaluator]) -> Callable[[], Evaluator]:
    if _is_evaluator(evaluator):
        return lambda: evaluator
    return evaluator


def _is_evaluator(fn: Evaluator | Callable[[], Evaluator]) -> TypeIs[Evaluator]:
    """An Evaluator takes (spec, ctx); a factory takes nothing. Tell them apart by their signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in sig.parameters.values()
    )


def _safe(fn: Callable[[], object]) -> bool:
    try:
        return bool(fn())
    except Exception:
        log.exception("callback failed")
        return False
