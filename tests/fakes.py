"""Test doubles for the edges the service tests do not exercise: a fixed-list planner and a thread executor,
and the job those tests run (``submit``) on a job runner built of the doubles (``runner``).

The real planner (tuner.search) and executors (tuner.workers.executors) have their own tests; these let the
service's job loop, claim, heartbeat, cancel and recovery be tested on their own.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tuner import tuning
from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    JobSpec,
    LevelResult,
    LevelWinner,
    LoadLevel,
    Method,
    ModelRef,
    Proposal,
    Reclaimed,
    SpecConfig,
    Speedup,
    TrafficFormat,
    TrafficRequest,
    TrialContext,
    TrialProgress,
    TrialResult,
    TrialSpec,
    TrialStage,
    TrialStatus,
    TuneOutcome,
)
from tuner.job_runner import JobRunner
from tuner.store.db import transaction


class ListPlanner:
    """Proposes the baseline, then each given config once; the best is the highest mean throughput ratio."""

    def __init__(self, specs: Sequence[SpecConfig]) -> None:
        self.queue = [SpecConfig(), *specs]
        self.asked: dict[int, SpecConfig] = {}
        self.told: dict[int, TrialResult] = {}
        self.tell_calls: list[int] = []
        self.abandoned: list[int] = []
        self._next = 0
        self._lock = threading.Lock()

    def ask(self) -> Proposal | None:
        with self._lock:
            while self._next < len(self.queue):
                number = self._next
                self._next += 1
                if number in self.told:
                    continue
                self.asked[number] = self.queue[number]
                return Proposal(number, self.queue[number], "baseline" if number == 0 else "search")
            return None

    def tell(self, number: int, result: TrialResult) -> None:
        with self._lock:
            self.tell_calls.append(number)
            self.told.setdefault(number, result)

    def abandon(self, number: int, reason: str) -> None:
        with self._lock:
            # As Optuna: the abandoned trial stays failed; its configuration comes back under a new number.
            self.abandoned.append(number)
            self.queue.append(self.asked.pop(number, self.queue[number]))

    def resume(self, asked: Mapping[int, SpecConfig]) -> None:
        """As after a runner died: ``asked`` were handed out (and never told); numbering goes on after them."""
        with self._lock:
            self.asked.update(asked)
            self._next = max(self._next, max(asked) + 1)

    def pending(self) -> list[Proposal]:
        with self._lock:
            return [Proposal(n, s) for n, s in sorted(self.asked.items()) if n not in self.told]

    def outcome(self) -> TuneOutcome:
        base = self.told.get(0)
        if base is None or not base.levels:
            return TuneOutcome(SpecConfig(), None, (), None, None, None)

        def ratio(r: TrialResult) -> float:
            return statistics.fmean(
                lr.output_throughput / b.output_throughput for lr, b in zip(r.levels, base.levels, strict=True)
            )

        good = {n: r for n, r in self.told.items() if r.status is TrialStatus.SUCCEEDED}
        best_n = max(good, key=lambda n: ratio(good[n]))
        best = good[best_n]
        winners = tuple(
            LevelWinner(lr.level.label, best.spec, lr.output_throughput / b.output_throughput, best_n)
            for lr, b in zip(best.levels, base.levels, strict=True)
        )
        r = ratio(best)
        return TuneOutcome(best.spec, None, winners, Speedup(r, r, r, 1), 0, best_n, engine=best.engine)


class FakeEvaluator:
    """Throughput grows with k; optional per-trial delay that honours cancellation; optional failures."""

    def __init__(self, delay_s: float = 0.0, fail: set[Method] | None = None) -> None:
        self.delay_s = delay_s
        self.fail = fail or set()
        self.calls: list[tuple[int | None, str]] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        with self._lock:
            self.calls.append((spec.number, spec.spec.label()))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            return self._run(spec, ctx)
        finally:
            with self._lock:
                self.active -= 1

    def _run(self, spec: TrialSpec, ctx: TrialContext | None) -> TrialResult:
        if ctx is not None and spec.levels:  # as the runner does: the first level begins
            ctx.on_progress(TrialProgress(TrialStage.MEASURING, len(spec.levels), level=1, label=spec.levels[0].label))
        deadline = time.monotonic() + self.delay_s
        while time.monotonic() < deadline:
            if ctx is not None and ctx.is_cancelled():
                return TrialResult(
                    TrialStatus.CANCELLED,
                    Engine.SIMULATED,
                    spec=spec.spec,
                    failure=Failure(FailureClass.CANCELLED, "cancelled"),
                )
            time.sleep(0.02)
        if spec.spec.method in self.fail:
            return TrialResult(
                TrialStatus.FAILED,
                Engine.SIMULATED,
                spec=spec.spec,
                failure=Failure(FailureClass.UNSUPPORTED, f"{spec.spec.method} is not supported", "log tail"),
            )
        k = spec.spec.num_speculative_tokens
        levels = tuple(
            LevelResult(level=lvl, num_requests=lvl.num_requests, output_throughput=100.0 * (1 + 0.1 * k) / lvl.value)
            for lvl in spec.levels
        )
        return TrialResult(
            TrialStatus.SUCCEEDED,
            Engine.SIMULATED,
            spec=spec.spec,
            levels=levels,
            vllm_version="0.0-fake",
            hardware="cpu",
            reference_outputs=((1, 2, 3),) if spec.spec.is_off else None,
        )


class ThreadExecutor:
    """Runs trials on threads. ``reclaims`` gets ``(job_id, trials run so far)`` per reclaim: the real
    reclaim (killing a dead runner's servers) is the executors' contract suite's, on real process groups."""

    def __init__(self, evaluator: FakeEvaluator, slots: int = 1, reclaims: list[tuple[str, int]] | None = None) -> None:
        self.evaluator = evaluator
        self.slots = slots
        self.reclaims = [] if reclaims is None else reclaims
        self.pool = ThreadPoolExecutor(slots)
        self.active = 0
        self._lock = threading.Lock()

    def free_slots(self, tensor_parallel_size: int = 1) -> int:
        with self._lock:
            return self.slots - self.active

    def submit(self, spec: TrialSpec, ctx: TrialContext) -> Future[TrialResult]:
        with self._lock:
            self.active += 1

        def run() -> TrialResult:
            try:
                return self.evaluator(spec, ctx)
            finally:
                with self._lock:
                    self.active -= 1

        return self.pool.submit(run)

    def reclaim(self, job_id: str) -> Reclaimed:
        self.reclaims.append((job_id, len(self.evaluator.calls)))
        return Reclaimed()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


LEVELS = (LoadLevel(value=1, num_requests=4), LoadLevel(value=8, num_requests=8))
GHOST = f"ghost@{socket.gethostname()}"  # a dead runner on this host
SPECS = [SpecConfig(Method.NGRAM, 2), SpecConfig(Method.NGRAM, 4), SpecConfig(Method.EAGLE3, 3, model="d")]
REQUESTS = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"p{i}", output_tokens=8) for i in range(4)]


def submit(factory: sessionmaker[Session], **spec: Any) -> str:
    """A job on a new sample of REQUESTS: ``org/m`` on the simulated engine at LEVELS unless ``spec`` says else."""
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        fields: dict[str, Any] = {"model": ModelRef("org/m"), "engine": Engine.SIMULATED, "levels": LEVELS, **spec}
        job, _ = tuning.submit_job(s, JobSpec(traffic_id=traffic.id, **fields))
        return job.id


def runner(
    factory: sessionmaker[Session],
    planner: ListPlanner,
    evaluator: FakeEvaluator,
    *,
    slots: int = 2,
    reclaims: list[tuple[str, int]] | None = None,
    stale_after_s: float = 1.0,
    **kw: Any,
) -> JobRunner:
    """A job runner on the doubles: every job gets ``planner``, trials run ``evaluator`` on ``slots`` threads."""
    return JobRunner(
        factory,
        planner_factory=lambda job_id, spec, reqs: planner,
        executor_factory=lambda spec: ThreadExecutor(evaluator, slots=slots, reclaims=reclaims),
        heartbeat_s=0.1,
        stale_after_s=stale_after_s,
        poll_s=0.05,
        **kw,
    )
