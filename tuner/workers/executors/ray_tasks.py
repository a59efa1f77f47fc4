"""What a :class:`~tuner.workers.executors.RayExecutor` runs on the cluster: the trial task, the registry
actor it reports to, and the cleanup and reclaim tasks pinned to a node (with the driver-side calls that pin
them).

The registry (on the head node) lives as long as the executor's driver. What must outlive the driver is kept
on the node: each trial task holds a trial record (``gpu_lease.trial_record``, a lease file without a GPU)
under ``<ledger_dir>/<hostname>/`` for as long as it runs, labelled ``job=<id> trial=<n>``, and writes every
process group its evaluator starts into it before the group runs anything (``ctx.on_process_started`` is
called by ``process_group.start_gated`` before the gate opens). A driver that dies takes its tasks' Ray
workers with it, which releases their records' locks; the servers, in their own sessions, stay. The reclaim
task then finds them in the records nobody holds, as a local executor does in its GPU lease.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tuner.domain import Reclaimed, TrialContext, TrialSpec, throttled
from tuner.workers.executors._base import reclaim_on_host
from tuner.workers.executors.ray_cluster import NodeView, cluster_nodes
from tuner.workers.executors.recipe import EvaluatorRecipe, build_evaluator
from tuner.workers.gpu_lease import LeasedGroup, trial_record
from tuner.workers.process_group import KILL_GRACE_S, kill_process_group

log = logging.getLogger(__name__)


def ledger_dir(root: str | None) -> Path:
    """This host's directory of trial records under ``root`` (default: a per-user one in the node's temporary
    directory). Per host name: a directory shared between hosts never mixes their process ids."""
    base = Path(root) if root else Path(tempfile.gettempdir()) / f"spec-tuner-{os.getuid()}" / "ray-trials"
    return base / socket.gethostname()


@ray.remote(num_cpus=0, max_restarts=0)
class Registry:
    """Where tasks report that they started, on which node, and the process groups they left."""

    def __init__(self) -> None:
        self._info: dict[str, dict[str, Any]] = {}
        self._cancel: set[str] = set()

    def started(self, key: str, node_id: str, host: str, pid: int) -> None:
        self._info.setdefault(key, {"pgids": []}).update(node_id=node_id, host=host, pid=pid, t=time.time())

    def add_pgid(self, key: str, pgid: int) -> None:
        self._info.setdefault(key, {"pgids": []})["pgids"].append(int(pgid))

    def info(self, key: str) -> dict[str, Any] | None:
        return self._info.get(key)

    def cancel(self, key: str) -> None:
        self._cancel.add(key)

    def is_cancelled(self, key: str) -> bool:
        return key in self._cancel

    def forget(self, key: str) -> None:
        self._info.pop(key, None)
        self._cancel.discard(key)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _open_record(root: str | None, key: str, spec: TrialSpec, node_id: str) -> LeasedGroup | None:
    label = f"node={node_id[:12]} job={spec.job_id} trial={spec.number}"
    try:  # unique per attempt, also across drivers that happen to share a pid
        return trial_record(ledger_dir(root), f"{key}-{uuid.uuid4().hex[:8]}", label)
    except OSError:
        log.exception("trial %s: could not write its trial record; a reclaim will not find its processes", key)
        return None


def trial_task(
    recipe: EvaluatorRecipe, spec: TrialSpec, key: str, registry: Any, log_dir: str | None, ledger: str | None
) -> dict[str, Any]:
    node_id = ray.get_runtime_context().get_node_id()
    record = _open_record(ledger, key, spec, node_id)
    try:
        try:
            ray.get(registry.started.remote(key, node_id, socket.gethostname(), os.getpid()), timeout=60)
        except Exception:
            log.exception("trial %s: registry unreachable", key)

        def on_started(pgid: int) -> None:
            # Synchronous, on the node first: the pgid must be on record before the worker can be lost.
            if record is not None:
                try:
                    record.record_pgid(pgid)
                except OSError:
                    log.exception("trial %s: could not record pgid %s in its trial record", key, pgid)
            try:
                ray.get(registry.add_pgid.remote(key, pgid), timeout=60)
            except Exception:
                log.exception("trial %s: could not record pgid %s", key, pgid)

        def cancelled() -> bool:
            try:
                return bool(ray.get(registry.is_cancelled.remote(key), timeout=30))
            except Exception:
                return False

        ctx = TrialContext(is_cancelled=throttled(cancelled, 1.0), on_process_started=on_started, log_dir=log_dir)
        evaluator = build_evaluator(recipe, in_ray=True)
        result = evaluator(dataclasses.replace(spec, gpu_ids=None), ctx)
        # Where it ran travels with the result, so the origin never depends on the registry being reachable.
        return {"result": result, "node_id": node_id, "host": socket.gethostname()}
    finally:
        if record is not None:
            record.close()


def cleanup_task(pgids: list[int]) -> dict[int, bool]:
    return {pgid: kill_process_group(pgid, grace_s=KILL_GRACE_S) for pgid in pgids if pgid > 1}


def reclaim_task(ledger: str | None, job_id: str) -> dict[str, Any]:
    """On one node: kill the groups of ``job_id`` that trial records nobody holds name, report held ones."""
    found = reclaim_on_host([ledger_dir(ledger)], job_id, remove_records=True)
    return {"killed": list(found.killed), "held": list(found.held), "host": socket.gethostname()}


remote_trial = ray.remote(max_retries=0)(trial_task)
remote_cleanup = ray.remote(num_cpus=0, max_retries=0)(cleanup_task)
remote_reclaim = ray.remote(num_cpus=0, max_retries=0)(reclaim_task)


def _pinned(node_id: str, runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    if runtime_env:
        options["runtime_env"] = dict(runtime_env)
    return options


def cleanup_on_node(
    node_id: str, pgids: Sequence[int], *, runtime_env: Mapping[str, Any] | None, timeout_s: float
) -> None:
    """Kill process groups a lost or killed task left, with a task pinned to its node (if still alive)."""
    if not any(n.node_id == node_id for n in cluster_nodes()):
        log.warning("node %s is gone; its process groups %s went with it", node_id, list(pgids))
        return
    ref = remote_cleanup.options(**_pinned(node_id, runtime_env)).remote(list(pgids))
    try:
        killed = ray.get(ref, timeout=timeout_s)
        if not all(killed.values()):
            log.warning("process groups still alive on node %s: %s", node_id, killed)
    except Exception as exc:
        log.warning("cleanup on node %s failed: %r", node_id, exc)


def reclaim_on_cluster(
    job_id: str, *, ledger: str | None, runtime_env: Mapping[str, Any] | None, timeout_s: float
) -> Reclaimed:
    """``reclaim(job_id)`` on the cluster: a reclaim task pinned to one alive node of every host (the nodes
    of a host share its processes and its trial records), run at once; a node that fails or does not answer
    within ``timeout_s`` is ``unreachable`` (``host/node-id``)."""
    try:
        nodes = {n.host or n.node_id: n for n in sorted(cluster_nodes(), key=lambda n: n.node_id)}
    except Exception as exc:
        log.warning("reclaim of job %s: the Ray cluster cannot be asked: %r", job_id, exc)
        return Reclaimed(unreachable=("ray cluster",))
    refs: dict[Any, NodeView] = {
        remote_reclaim.options(**_pinned(n.node_id, runtime_env)).remote(ledger, job_id): n for n in nodes.values()
    }
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    killed: list[int] = []
    held: list[int] = []
    unreachable: list[str] = []
    for ref in ready:
        node = refs[ref]
        try:
            out = ray.get(ref)
        except Exception as exc:
            log.warning("reclaim of job %s on node %s failed: %r", job_id, node.node_id, exc)
            unreachable.append(f"{node.host}/{node.node_id[:12]}")
            continue
        killed.extend(out["killed"])
        held.extend(out["held"])
    for ref in pending:
        node = refs[ref]
        log.warning("reclaim of job %s: node %s did not answer within %g s", job_id, node.node_id, timeout_s)
        unreachable.append(f"{node.host}/{node.node_id[:12]}")
        ray.cancel(ref, force=True)
    return Reclaimed(tuple(killed), tuple(held), tuple(unreachable))
