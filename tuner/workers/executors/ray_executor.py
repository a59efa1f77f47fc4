# Over 400 lines on purpose: one state machine, a trial's life on the cluster (placement, retry, deadline, cancel).
"""Trials on a Ray cluster: one Ray task per trial, on GPUs of the requested hardware.

Each trial is a task asking for ``num_gpus = TP`` and one of the Ray accelerator types of the requested
family (a node advertises ``accelerator_type:<name>`` and the ``ray.io/accelerator-type`` label; AMD
names come from the PCI id, so one family may have several: MI300X is ``-OAM`` or ``-HF``). Inside the
task Ray has already set ``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` relative to the node's ROCR
set: the evaluator gets ``gpu_ids=None`` and the vLLM runner ``in_ray=True`` so physical ids are never
applied again.

Faults. Tasks run with ``max_retries=0``: the executor, not Ray, decides. A task whose worker or node
was lost (``WorkerCrashedError``, ``NodeDiedError``, ``ActorDiedError``, lost objects) is recorded as
lost, the process groups it reported are killed by a cleanup task pinned to its node
(``NodeAffinitySchedulingStrategy``), and it is retried once, on another node when one of the hardware
exists (label selector ``ray.io/node-id: !<node>``). The pgids travel through a small registry actor the
task calls from ``ctx.on_process_started``; they belong to the remote node, so they are not forwarded to
the caller's ``ctx.on_process_started`` (a pgid means nothing on the driver's host). A trial still
running at ``deadline_s`` (+ ``hang_grace_s``) after it started is force-cancelled (Ray kills the
worker) and its process groups killed the same way. The lost first attempt stays on the result
(``TrialResult.retried_failures``), so the stored trial shows that an infrastructure failure was retried.

Hardware. A result is stamped with the family of the node it ran on (a job for "auto" is recorded under
the chip that ran it). Trials that ask for "auto" never mix chips: the first one submitted pins the
executor (one per job) to the family with the most free GPUs, and every later "auto" trial follows it.

Reclaim. The registry lives as long as the driver; each node keeps its own record of the trials it runs
(a trial record per task, see :mod:`tuner.workers.executors.ray_tasks`), so ``reclaim(job_id)`` runs a task
on every host that kills what a dead driver's trials of the job left there.

The driver's view of the cluster lives in :mod:`tuner.workers.executors.ray_cluster`; what runs on the
cluster, in :mod:`tuner.workers.executors.ray_tasks`.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tuner.domain import Failure, FailureClass, Reclaimed, TrialContext, TrialResult, TrialSpec, TrialStatus
from tuner.workers.executors._base import (
    AttemptRecord,
    Executor,
    ExecutorClosed,
    HardwareMismatch,
    SubmittedTrial,
    failed_result,
    resolved,
    with_origin,
    with_retried,
)
from tuner.workers.executors.ray_cluster import (
    ACCELERATOR_LABEL,
    ACCELERATOR_RESOURCE,
    NODE_ID_LABEL,
    NodeView,
    cluster_nodes,
    connect,
    head_node_id,
)
from tuner.workers.executors.ray_tasks import Registry, cleanup_on_node, reclaim_on_cluster, remote_trial
from tuner.workers.executors.recipe import EvaluatorRecipe
from tuner.workers.hardware import canonical_family, hardware_matches, ray_accelerator_types

log = logging.getLogger(__name__)

# A worker, its node or an object it held went away: the trial did not fail, its machine did.
LOST = (
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.RayActorError,
    rex.ObjectLostError,
    rex.LocalRayletDiedError,
    rex.RaySystemError,
    rex.OutOfMemoryError,  # Ray's memory monitor killed the worker
)


@dataclass
class _Trial(SubmittedTrial):
    types: tuple[str, ...] = ()  # Ray accelerator types this trial may use; () = any GPU node
    family: str | None = None
    started_on: str | None = None  # node id once the current attempt runs
    lost_nodes: list[str] = field(default_factory=list)
    lost: list[Failure] = field(default_factory=list)  # attempts lost and retried, for the result


class RayExecutor(Executor):
    """Runs trials as Ray tasks on a cluster's GPUs of one hardware family.

    ``address``: "auto", "ray://host:10001" or a GCS address; None joins the cluster this process is
    already connected to (or ``RAY_ADDRESS``, or starts a local one). ``hardware``: a family
    ("mi300x", "h100") or "auto" for any GPU node. ``runtime_env`` is applied to every trial task (the
    workers must run the project's Python; vLLM's own venv is the runner's ``vllm_python``, never Ray's).
    ``ledger_dir``: where on every node trial tasks keep their trial records (one subdirectory per host; the
    same path on every node; default: a per-user directory in the node's temporary directory).
    """

    def __init__(
        self,
        recipe: EvaluatorRecipe,
        *,
        address: str | None = None,
        hardware: str,
        runtime_env: Mapping[str, Any] | None = None,
        num_cpus_per_trial: float = 1.0,
        hang_grace_s: float = 10.0,
        cancel_grace_s: float = 30.0,
        cleanup_timeout_s: float = 60.0,
        poll_s: float = 0.2,
        ledger_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.recipe = recipe
        self.hardware = hardware
        self.family = None if hardware == "auto" else canonical_family(hardware)
        self.accelerator_types = () if self.family is None else ray_accelerator_types(self.family)
        if self.family is not None and not self.accelerator_types:
            raise HardwareMismatch(f"no Ray accelerator type known for hardware {hardware!r}")
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.num_cpus_per_trial = num_cpus_per_trial
        self.hang_grace_s = hang_grace_s
        self.cancel_grace_s = cancel_grace_s
        self.cleanup_timeout_s = cleanup_timeout_s
        self.poll_s = poll_s
        self.ledger_dir = None if ledger_dir is None else os.fspath(ledger_dir)
        self._owns_ray = connect(address)
        # The registry lives on the head node (whose loss ends the cluster anyway), never on a GPU node
        # that may die mid-trial with the pgids it holds. Hard affinity: a soft one let Ray place this
        # zero-CPU actor on other nodes 7 times in 10 (Ray 2.x, local cluster), and CI lost it with a node.
        head = NodeAffinitySchedulingStrategy(head_node_id(), soft=False)
        registry = Registry.options(scheduling_strategy=head)  # type: ignore[attr-defined]  # @ray.remote class
        self._registry = registry.remote()
        self._lock = threading.Lock()
        self._trials: dict[str, _Trial] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._ids = itertools.count()
        self._auto_family: str | None = None  # the family "auto" trials are pinned to, once chosen
        self.history: list[AttemptRecord] = []

    # -- cluster view ------------------------------------------------------------------------------
    @staticmethod
    def _matches(node: NodeView, types: tuple[str, ...]) -> bool:
        if node.gpus_total <= 0:
            return False
        if not types:
            return True
        names = {*node.accelerator_types, *([node.label_type] if node.label_type else [])}
        return bool(names & set(types))

    def matching_nodes(self, types: tuple[str, ...] | None = None) -> list[NodeView]:
        """Alive GPU nodes of this executor's hardware (or of ``types``)."""
        wanted = self.accelerator_types if types is None else types
        return [n for n in cluster_nodes() if self._matches(n, wanted)]

    def free_slots(self, tensor_parallel_size: int = 1) -> int:
        if self._closed:
            return 0
        tp = max(1, int(tensor_parallel_size))
        with self._lock:
            trials = list(self._trials.values())
        mine: dict[str, int] = {}
        pending = 0
        for t in trials:
            if t.started_on is None:
                pending += t.tp
            else:
                mine[t.started_on] = mine.get(t.started_on, 0) + t.tp
        slots = 0
        # An "auto" executor whose trials are pinned to a family counts that family's GPUs only.
        pinned = ray_accelerator_types(self._auto_family) if self.family is None and self._auto_family else None
        for node in self.matching_nodes(pinned):
            # Ray's view lags a started task by up to a heartbeat: trust our own books where they say less.
            free = min(node.gpus_free, node.gpus_total - mine.get(node.node_id, 0))
            slots += int(free // tp)
        return max(0, slots - math.ceil(pending / tp))

    # -- contract ----------------------------------------------------------------------------------
    def submit(self, spec: TrialSpec, ctx: TrialContext) -> concurrent.futures.Future[TrialResult]:
        if self._closed:
            raise ExecutorClosed("executor is closed")
        if self.family is not None and not hardware_matches(spec.hardware, self.family):
            raise HardwareMismatch(f"trial for {spec.hardware!r} submitted to a {self.hardware} executor")
        tp = spec.serving.tensor_parallel_size
        # An "auto" executor routes each trial by its own hardware; "auto" trials follow one pinned family.
        wants_auto = (spec.hardware or "auto").strip().lower() == "auto"
        family = self.family or (self._pin_auto(tp) if wants_auto else canonical_family(spec.hardware))
        types = ray_accelerator_types(family) if family else ()
        if family and not types:
            raise HardwareMismatch(f"no Ray accelerator type known for hardware {spec.hardware!r}")
        if not any(n.gpus_total >= tp for n in self.matching_nodes(types)):
            return resolved(
                failed_result(
                    spec,
                    self.recipe.engine,
                    FailureClass.INFRA,
                    f"no alive Ray node of hardware {self.hardware!r} with {tp} GPUs",
                    hardware=self.family,
                )
            )
        trial = _Trial(
            f"ray-{os.getpid()}-{next(self._ids)}",
            spec,
            ctx,
            tp,
            concurrent.futures.Future(),
            types=types,
            family=family,
        )
        trial.future.set_running_or_notify_cancel()
        with self._lock:
            self._trials[trial.key] = trial
        thread = threading.Thread(target=self._drive, args=(trial,), name=f"trial-{trial.key}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return trial.future

    def _pin_auto(self, tp: int) -> str | None:
        """The family every "auto" trial of this executor runs on: chosen once, at the first such trial, as
        the family with the most free GPU groups of ``tp`` (then the most GPUs). None while the cluster has
        no GPU node of a known family (the trial then goes to any GPU node, and is stamped by it)."""
        with self._lock:
            if self._auto_family is not None:
                return self._auto_family
        free: dict[str, float] = {}
        total: dict[str, float] = {}
        for node in cluster_nodes():
            if node.gpus_total < tp or len(node.families) != 1:
                continue
            (fam,) = node.families
            free[fam] = free.get(fam, 0) + node.gpus_free // tp
            total[fam] = total.get(fam, 0) + node.gpus_total
        if not total:
            return None
        choice = max(sorted(total), key=lambda f: (free[f], total[f]))
        with self._lock:
            if self._auto_family is None:
                self._auto_family = choice
                log.info("'auto' trials pinned to %s (free GPU groups per family: %s)", choice, free)
            return self._auto_family

    def reclaim(self, job_id: str) -> Reclaimed:
        """A reclaim task on every alive host of the cluster (:func:`~.ray_tasks.reclaim_on_cluster`)."""
        return reclaim_on_cluster(
            job_id, ledger=self.ledger_dir, runtime_env=self.runtime_env, timeout_s=self.cleanup_timeout_s
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            trials = list(self._trials.values())
        for trial in trials:
            trial.kill.set()
        for thread in self._threads:
            thread.join(timeout=self.cancel_grace_s + self.cleanup_timeout_s + 30)
        try:
            ray.kill(self._registry)
        except Exception:
            pass
        if self._owns_ray:
            ray.shutdown()

    # -- one trial ---------------------------------------------------------------------------------
    def _drive(self, trial: _Trial) -> None:
        try:
            for attempt in (0, 1):
                outcome, value, info = self._attempt(trial, attempt)
                node = (info or {}).get("node_id")
                pgids = tuple((info or {}).get("pgids", ()))
                if outcome == "lost" or outcome in ("timeout", "cancelled"):
                    self._cleanup(node, pgids)
                self._record(trial, attempt, outcome, node, str(value)[:500] if outcome != "result" else "", pgids)
                if outcome == "lost" and attempt == 0 and not trial.kill.is_set():
                    log.warning("trial %s lost on node %s (%s): retrying once", trial.key, node, value)
                    if node:
                        trial.lost_nodes.append(node)
                    where = f"{info['host']}/{node[:12]}" if info and info.get("host") and node else node
                    reason = f"attempt {attempt + 1} lost on {where or 'an unknown node'}, retried: {value}"
                    trial.lost.append(Failure(FailureClass.INFRA, reason[:1000]))
                    continue
                self._resolve(trial, with_retried(self._result_of(trial, outcome, value, info), trial.lost))
                return
        except BaseException as exc:
            log.exception("trial %s: executor error", trial.key)
            result = failed_result(trial.spec, self.recipe.engine, FailureClass.INTERNAL, repr(exc))
            self._resolve(trial, with_retried(result, trial.lost))

    def _result_of(self, trial: _Trial, outcome: str, value: Any, info: dict[str, Any] | None) -> TrialResult:
        where = f"{info['host']}/{info['node_id'][:12]}" if info and info.get("node_id") else None
        family = self._family_of(info.get("node_id") if info else None, trial.family)
        engine = self.recipe.engine
        if outcome == "result":
            return with_origin(value, where, family)
        if outcome == "timeout":
            return failed_result(
                trial.spec,
                engine,
                FailureClass.TIMEOUT,
                f"trial exceeded its deadline of {trial.spec.deadline_s:g} s and was killed",
                worker=where,
                hardware=family,
            )
        if outcome == "cancelled":
            return failed_result(
                trial.spec,
                engine,
                FailureClass.CANCELLED,
                "cancelled",
                status=TrialStatus.CANCELLED,
                worker=where,
                hardware=family,
            )
        if outcome == "lost":
            return failed_result(
                trial.spec,
                engine,
                FailureClass.INFRA,
                f"Ray worker or node lost (attempts on nodes {trial.lost_nodes or 'unknown'}): {value}",
                worker=where,
                hardware=family,
            )
        return failed_result(
            trial.spec, engine, FailureClass.INTERNAL, f"evaluator raised: {value}", worker=where, hardware=family
        )

    @staticmethod
    def _family_of(node_id: str | None, default: str | None) -> str | None:
        if node_id is None:
            return default
        for node in cluster_nodes():
            if node.node_id == node_id:
                return node.family or default
        return default

    def _placement(self, trial: _Trial) -> dict[str, Any] | None:
        """Task options that put this attempt on a node of the hardware, away from nodes that lost it; None
        when no alive node of the hardware can hold it (never run on another chip instead)."""
        nodes = [n for n in self.matching_nodes(trial.types) if n.gpus_total >= trial.tp]
        if not nodes:
            return None
        fresh = [n for n in nodes if n.node_id not in trial.lost_nodes]
        opts: dict[str, Any] = {}
        label_selector: dict[str, str] = {}
        if fresh and trial.lost_nodes:
            # One excluded node fits a selector value (63 characters); a second loss ends the trial anyway.
            label_selector[NODE_ID_LABEL] = f"!{trial.lost_nodes[-1]}"
            nodes = fresh
        if trial.types and nodes:
            best = max(nodes, key=lambda n: (n.gpus_free, n.gpus_total))
            wanted = [t for t in best.accelerator_types if t in trial.types]
            if wanted:
                opts["resources"] = {f"{ACCELERATOR_RESOURCE}{wanted[0]}": 0.001}
            elif best.label_type:
                label_selector[ACCELERATOR_LABEL] = best.label_type
        if label_selector:
            opts["label_selector"] = label_selector
        return opts

    def _attempt(self, trial: _Trial, attempt: int) -> tuple[str, Any, dict[str, Any] | None]:
        key = f"{trial.key}-a{attempt}"
        trial.started_on = None
        placement = self._placement(trial)
        if placement is None:
            return "lost", f"no alive Ray node of hardware {trial.family or 'any'} with {trial.tp} GPUs", None
        options: dict[str, Any] = {
            "num_gpus": trial.tp,
            "num_cpus": self.num_cpus_per_trial,
            "max_retries": 0,
            "name": f"trial-{trial.spec.job_id}-{trial.spec.number}-a{attempt}",
            **placement,
        }
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        ref = remote_trial.options(**options).remote(
            self.recipe, trial.spec, key, self._registry, trial.ctx.log_dir, self.ledger_dir
        )
        started_at: float | None = None
        cancel_at: float | None = None
        forced: str | None = None
        info: dict[str, Any] | None = None
        deadline_s = trial.spec.deadline_s
        next_info = 0.0
        while True:
            ready, _ = ray.wait([ref], timeout=self.poll_s)
            now = time.monotonic()
            if ready or (started_at is None and now >= next_info) or forced:
                info = self._info(key) or info
                next_info = now + 1.0
                if info and info.get("node_id") and started_at is None:
                    started_at = now
                    trial.started_on = info["node_id"]
            if ready:
                try:
                    out = ray.get(ref)
                    info = {**(info or {}), "node_id": out["node_id"], "host": out["host"]}
                    return "result", out["result"], info
                except rex.TaskCancelledError as exc:
                    return forced or "cancelled", exc, info
                except rex.RayTaskError as exc:  # the evaluator itself raised
                    if forced:
                        return forced, exc, info
                    return "error", exc, info
                except LOST as exc:
                    if forced:
                        return forced, exc, info
                    return "lost", exc, info
                except rex.RayError as exc:
                    return (forced or "lost"), exc, info
            if forced:
                continue  # waiting for Ray to report the cancelled task
            if cancel_at is None and (trial.kill.is_set() or _safe(trial.ctx.is_cancelled)):
                cancel_at = now
                self._registry.cancel.remote(key)
                info = self._info(key) or info
                if started_at is None and info and info.get("node_id"):
                    started_at = now
                    trial.started_on = info["node_id"]
                if started_at is None:  # still queued: withdraw it
                    forced = "cancelled"
                    ray.cancel(ref, force=False)
                    continue
            grace = 0.0 if self._closed else self.cancel_grace_s
            if cancel_at is not None and now - cancel_at >= grace:
                forced = "cancelled"
                ray.cancel(ref, force=True)
                continue
            if started_at is not None and deadline_s and now - started_at >= deadline_s + self.hang_grace_s:
                forced = "timeout"
                ray.cancel(ref, force=True)

    def _info(self, key: str) -> dict[str, Any] | None:
        try:
            return ray.get(self._registry.info.remote(key), timeout=30)
        except Exception as exc:
            log.warning("trial registry unreachable: %r", exc)
            return None

    def _cleanup(self, node_id: str | None, pgids: tuple[int, ...]) -> None:
        """Kill the process groups a lost or killed task left, with a task pinned to its node."""
        if node_id and pgids:
            cleanup_on_node(node_id, pgids, runtime_env=self.runtime_env, timeout_s=self.cleanup_timeout_s)

    def _record(
        self, trial: _Trial, attempt: int, outcome: str, node: str | None, detail: str, pgids: tuple[int, ...]
    ) -> None:
        with self._lock:
            self.history.append(AttemptRecord(trial.key, attempt, outcome, node, detail, pgids))

    def _resolve(self, trial: _Trial, result: TrialResult) -> None:
        with self._lock:
            self._trials.pop(trial.key, None)
        for attempt in (0, 1):
            try:
                self._registry.forget.remote(f"{trial.key}-a{attempt}")
            except Exception:
                pass
        if not trial.future.done():
            trial.future.set_result(result)


def _safe(fn: Any) -> bool:
    try:
        return bool(fn())
    except Exception:
        log.exception("callback failed")
        return False
