"""The Ray cluster as the driver sees it: alive nodes, their accelerator types and free GPUs, the hardware
families a Ray runner can claim jobs for, and the report it gives as its worker (the GPU nodes, not the
driver's host).

Ray advertises a node's chip as an ``accelerator_type:<name>`` resource and a ``ray.io/accelerator-type``
label; AMD names come from the PCI id (``AMD-Instinct-MI300X-OAM``, ``-HF``), and
:func:`tuner.workers.hardware.family_of_ray_type` maps every name back to the family jobs are keyed by.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tuner.domain import parse_version
from tuner.workers.hardware import canonical_family, family_of_ray_type, host_report

log = logging.getLogger(__name__)

ACCELERATOR_LABEL = "ray.io/accelerator-type"
NODE_ID_LABEL = "ray.io/node-id"
ACCELERATOR_RESOURCE = "accelerator_type:"


@dataclass(frozen=True)
class NodeView:
    node_id: str
    host: str
    accelerator_types: tuple[str, ...]  # from accelerator_type:<name> resources
    label_type: str | None  # the ray.io/accelerator-type label
    gpus_total: float
    gpus_free: float

    @property
    def family(self) -> str | None:
        names = [*self.accelerator_types, *([self.label_type] if self.label_type else [])]
        return family_of_ray_type(names[0]) if names else None

    @property
    def families(self) -> tuple[str, ...]:
        names = {*self.accelerator_types, *([self.label_type] if self.label_type else [])}
        return tuple(sorted({family_of_ray_type(n) for n in names}))


def cluster_nodes() -> list[NodeView]:
    """Alive nodes with their accelerator types and free GPUs (per node, from Ray's resource view)."""
    try:
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node()
    except Exception:  # private API; without it only the cluster total is known
        available = None
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total = node.get("Resources") or {}
        free = (available or {}).get(node["NodeID"], {}) if available is not None else total
        types = tuple(sorted(k[len(ACCELERATOR_RESOURCE) :] for k in total if k.startswith(ACCELERATOR_RESOURCE)))
        out.append(
            NodeView(
                node_id=node["NodeID"],
                host=node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "",
                accelerator_types=types,
                label_type=(node.get("Labels") or {}).get(ACCELERATOR_LABEL),
                gpus_total=float(total.get("GPU", 0)),
                gpus_free=float(free.get("GPU", 0)),
            )
        )
    if available is None and out:
        aggregate = float(ray.available_resources().get("GPU", 0))
        out = [dataclasses.replace(n, gpus_free=min(n.gpus_total, aggregate)) for n in out]
    return out


def connect(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` unless this process already is connected; True if it joined now.

    ``address`` is "auto", a GCS address ("head:6379", which needs the head's raylet sockets on this host:
    run beside the head or share its /tmp/ray) or a Ray Client address ("ray://head:10001")."""
    if ray.is_initialized():
        return False
    ray.init(address=address, log_to_driver=False)
    return True


def cluster_families() -> tuple[str, ...]:
    """The hardware families of the cluster's alive GPU nodes, from the ``accelerator_type:<name>`` resources
    (``ray.cluster_resources()``) and the nodes' accelerator-type labels, named as jobs name hardware."""
    names = {k[len(ACCELERATOR_RESOURCE) :] for k in ray.cluster_resources() if k.startswith(ACCELERATOR_RESOURCE)}
    families = {family_of_ray_type(n) for n in names}
    families.update(f for n in cluster_nodes() if n.gpus_total > 0 for f in n.families)
    return tuple(sorted(families))


def cluster_has(address: str | None, hardware: str) -> bool:
    """Whether the cluster at ``address`` has alive GPU nodes of ``hardware`` (of any known chip for "auto")."""
    connect(address)
    families = cluster_families()
    if hardware == "auto":
        return bool(families)
    return canonical_family(hardware) in families


def _probe_node() -> dict[str, Any]:
    from tuner.workers.options import default_vllm_python
    from tuner.workers.vllm_probe import capabilities_report

    data = host_report().to_dict()
    data["vllm_capabilities"] = capabilities_report(default_vllm_python())
    return data


_remote_probe = ray.remote(num_cpus=0, max_retries=0)(_probe_node)


def cluster_report(
    *, probe: bool = True, timeout_s: float = 60.0, runtime_env: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a Ray runner reports as its worker: the cluster's GPU nodes, not the driver's host.

    Per node: chip family, Ray accelerator types, GPU count, and, when ``probe`` runs a zero-CPU task on the
    node within ``timeout_s``, GPU memory, driver and vLLM version as the node detects them (None where
    unknown). At the top: ``hardware`` (the family when the cluster has one, else None), ``families``,
    ``gpu_count``, and the newest ``vllm_version``, ``driver`` and ``vllm_capabilities`` (the probed
    speculative-decoding surface, ``tuner.workers.vllm_probe``) the nodes report.
    """
    nodes = [n for n in cluster_nodes() if n.gpus_total > 0]
    found = _probe_nodes(nodes, timeout_s, runtime_env) if probe else {}
    entries: list[dict[str, Any]] = []  # JSON, as the worker's report goes to the store
    for node in nodes:
        data = found.get(node.node_id) or {}
        memory = [g.get("memory_mib") for g in data.get("gpus") or () if g.get("memory_mib")]
        entries.append(
            {
                "node_id": node.node_id,
                "host": node.host,
                "hardware": "/".join(node.families) or None,
                "accelerator_types": sorted({*node.accelerator_types, *([node.label_type] if node.label_type else [])}),
                "gpu_count": int(node.gpus_total),
                "memory_mib": max(memory) if memory else None,  # per GPU
                "driver": data.get("driver"),
                "vllm_version": data.get("vllm_version"),
                "vllm_capabilities": data.get("vllm_capabilities"),
            }
        )
    families = sorted({f for n in nodes for f in n.families})
    return {
        "executor": "ray",
        "hostname": socket.gethostname(),
        "hardware": families[0] if len(families) == 1 else None,
        "families": families,
        "gpu_count": sum(e["gpu_count"] for e in entries),
        "vllm_version": _newest(e["vllm_version"] for e in entries),
        "driver": _newest(e["driver"] for e in entries),
        # the newest vLLM's: what a job's space is built for (its compat rules follow that version)
        "vllm_capabilities": max(
            (e["vllm_capabilities"] for e in entries if e["vllm_capabilities"]),
            key=lambda c: parse_version(c.get("version")),
            default=None,
        ),
        "nodes": entries,
    }


class ClusterReports:
    """``cluster_report`` per cluster address, re-read after ``ttl_s`` (nodes join and leave; probing every
    node takes a task on each). The cache is this object's: whoever holds it shares it."""

    def __init__(self, ttl_s: float = 300.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._reports: dict[str | None, tuple[float, dict[str, Any]]] = {}

    def get(self, address: str | None) -> dict[str, Any]:
        with self._lock:
            cached = self._reports.get(address)
        if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
            return cached[1]
        connect(address)
        report = cluster_report()
        with self._lock:
            self._reports[address] = (time.monotonic(), report)
        return report


def _probe_nodes(
    nodes: list[NodeView], timeout_s: float, runtime_env: Mapping[str, Any] | None
) -> dict[str, dict[str, Any]]:
    refs = {}
    for node in nodes:
        options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}
        if runtime_env:
            options["runtime_env"] = dict(runtime_env)
        refs[_remote_probe.options(**options).remote()] = node.node_id
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    out = {}
    for ref in ready:
        try:
            out[refs[ref]] = ray.get(ref)
        except Exception as exc:
            log.warning("hardware probe on node %s failed: %r", refs[ref], exc)
    for ref in pending:
        log.warning("hardware probe on node %s did not answer within %g s", refs[ref], timeout_s)
        ray.cancel(ref, force=True)
    return out


def _newest(values: Any) -> str | None:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:4])

    known = sorted({v for v in values if v}, key=key)
    return known[-1] if known else None


class ClusterHardware(Sequence[str]):
    """The families a Ray runner claims jobs for, re-read from the cluster at most every ``refresh_s``
    (nodes join and leave); the last answer is kept while the cluster cannot be asked."""

    def __init__(self, address: str | None, *, refresh_s: float = 30.0) -> None:
        self.address = address
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._families: tuple[str, ...] = ()
        self._current()

    def _current(self) -> tuple[str, ...]:
        with self._lock:
            if time.monotonic() - self._at >= self.refresh_s:
                try:
                    connect(self.address)
                    self._families = cluster_families()
                except Exception as exc:
                    if self._at == float("-inf"):
                        raise
                    log.warning("could not read the Ray cluster's hardware, keeping %s: %r", self._families, exc)
                self._at = time.monotonic()
            return self._families

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._current()[index]

    def __repr__(self) -> str:
        return f"ClusterHardware({list(self._families)})"


def head_node_id() -> str:
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in (node.get("Resources") or {}):
            return node["NodeID"]
    return ray.get_runtime_context().get_node_id()
