"""The executors a worker can run its trials on, by :class:`~tuner.domain.ExecutorKind`: for each, how to build
one for a job, what the worker reports as its hardware and which chips it claims jobs for.

The composition root (:mod:`tuner.wiring`) reads its settings into a :class:`Placement`, takes
``EXECUTORS[settings.executor]`` and never branches on the kind itself. Ray is imported only by the Ray
backend's methods (it is an optional dependency).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.domain import Engine, ExecutorKind
from tuner.workers.executors._base import Executor
from tuner.workers.executors.local import LocalExecutor
from tuner.workers.executors.recipe import EvaluatorRecipe, build_evaluator

if TYPE_CHECKING:
    from tuner.workers.executors.ray_cluster import ClusterReports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where a worker's trials may run, as its settings say: what a backend needs besides the recipe."""

    lease_dir: Path  # this host's GPU lease (local trials, and simulated ones a Ray cluster cannot place)
    gpus: tuple[int, ...] | None = None  # local: the GPU ids to use; None detects them, () is a CPU host
    max_parallel: int | None = None  # local: most trials at once (1 on SQLite)
    vllm_python: str | None = None  # the environment vLLM is installed in, for the reported vLLM version
    ray_address: str | None = None
    num_cpus_per_trial: float = 1.0  # Ray: CPUs a vLLM trial reserves (the runner, the server, the clients)


class ExecutorBackend(Protocol):
    """One kind of executor, as the composition root sees it."""

    kind: ExecutorKind
    # A trial reserves its CPUs before it starts (Ray): the client processes it may use must be a fixed number.
    reserves_trial_cpus: bool

    def executor(self, recipe: EvaluatorRecipe, *, hardware: str, placement: Placement) -> Executor:
        """The executor one job's trials run on (``hardware``: the job's; ``recipe.engine`` says whether the
        trials are simulated)."""
        ...

    def report(self, placement: Placement) -> dict[str, Any]:
        """What the worker reports of its hardware (chip, count, memory, driver, vLLM version; ``hardware``)."""
        ...

    def claimable_hardware(self, placement: Placement, report: dict[str, Any] | None) -> Sequence[str] | None:
        """The chips the worker claims jobs for besides "auto" and simulated ones (None: any)."""
        ...


class LocalBackend:
    """This host's GPUs (:class:`LocalExecutor`); simulated trials take the host's CPU slot."""

    kind = ExecutorKind.LOCAL
    reserves_trial_cpus = False

    def executor(self, recipe: EvaluatorRecipe, *, hardware: str, placement: Placement) -> Executor:
        if recipe.engine is Engine.SIMULATED:
            return simulated_on_cpu(recipe, hardware=hardware, placement=placement)
        return LocalExecutor(
            build_evaluator(recipe),
            gpus=placement.gpus,
            lease_dir=placement.lease_dir,
            hardware=hardware,
            engine=recipe.engine,
            max_parallel=placement.max_parallel,
        )

    def report(self, placement: Placement) -> dict[str, Any]:
        """This host's GPUs, probed once per process (``hardware.worker_host_report``)."""
        from tuner.workers.hardware import worker_host_report

        return worker_host_report(placement.vllm_python)

    def claimable_hardware(self, placement: Placement, report: dict[str, Any] | None) -> Sequence[str] | None:
        """The family of this host's GPUs (each family on a mixed host); None without a report: anything."""
        if report is None:
            return None
        families = sorted({g["family"] for g in report.get("gpus") or () if g.get("family")})
        family = report.get("hardware")
        return families or ([family] if family else [])


class RayBackend:
    """A Ray cluster's GPU nodes (:class:`~tuner.workers.executors.RayExecutor`). A simulated job for a chip
    the cluster lacks runs on this host's CPU instead, as it would locally (the simulated engine stands in
    for any chip). Holds the cache of cluster reports."""

    kind = ExecutorKind.RAY
    reserves_trial_cpus = True

    def __init__(self) -> None:
        self._reports: ClusterReports | None = None

    def executor(self, recipe: EvaluatorRecipe, *, hardware: str, placement: Placement) -> Executor:
        from tuner.workers.executors.ray_cluster import cluster_has
        from tuner.workers.executors.ray_executor import RayExecutor

        if recipe.engine is Engine.SIMULATED:
            if not cluster_has(placement.ray_address, hardware):
                log.warning("the Ray cluster has no %s GPUs: the simulated job runs on this host's CPU", hardware)
                return simulated_on_cpu(recipe, hardware=hardware, placement=placement)
            return RayExecutor(recipe, address=placement.ray_address, hardware=hardware)  # no client processes
        return RayExecutor(
            recipe, address=placement.ray_address, hardware=hardware, num_cpus_per_trial=placement.num_cpus_per_trial
        )

    def report(self, placement: Placement) -> dict[str, Any]:
        """The cluster's GPU nodes, not the driver's host (``ray_cluster.cluster_report``), re-read every few
        minutes."""
        from tuner.workers.executors.ray_cluster import ClusterReports

        if self._reports is None:
            self._reports = ClusterReports()
        return self._reports.get(placement.ray_address)

    def claimable_hardware(self, placement: Placement, report: dict[str, Any] | None) -> Sequence[str] | None:
        """The families of the cluster's GPU nodes, re-read as nodes join and leave."""
        from tuner.workers.executors.ray_cluster import ClusterHardware

        return ClusterHardware(placement.ray_address)


def simulated_on_cpu(recipe: EvaluatorRecipe, *, hardware: str, placement: Placement) -> Executor:
    """A simulated job on this host's CPU slot, standing in for the requested chip whatever the host has."""
    return LocalExecutor(
        build_evaluator(recipe),
        gpus=[],
        lease_dir=placement.lease_dir,
        hardware=hardware,
        family=None if hardware == "auto" else hardware,
        engine=Engine.SIMULATED,
    )


EXECUTORS: Mapping[ExecutorKind, ExecutorBackend] = {
    ExecutorKind.LOCAL: LocalBackend(),
    ExecutorKind.RAY: RayBackend(),
}
