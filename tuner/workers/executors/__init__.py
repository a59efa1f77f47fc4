"""Executors: where trials run. One contract (:class:`Executor`, the base implementing
:class:`~tuner.domain.TrialExecutor`), two implementations, chosen by :class:`~tuner.domain.ExecutorKind`
through :data:`EXECUTORS` (:mod:`.registry`).

- :class:`LocalExecutor`: this host's GPUs, in threads, one disjoint GPU group per trial from a lease
  shared by every worker process on the host.
- :class:`RayExecutor`: a Ray cluster, one task per trial asking for ``num_gpus = TP`` and the
  accelerator type of the requested hardware (imported lazily: Ray is an optional dependency).

:mod:`.testing` holds the evaluators and helpers of the contract's test suite (``tests/workers/executors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.workers.executors._base import AttemptRecord, Executor, ExecutorClosed, HardwareMismatch
from tuner.workers.executors.local import LocalExecutor
from tuner.workers.executors.recipe import EvaluatorRecipe, PacedEvaluator, build_evaluator
from tuner.workers.executors.registry import EXECUTORS, ExecutorBackend, Placement

if TYPE_CHECKING:
    from tuner.workers.executors.ray_executor import RayExecutor

__all__ = [
    "EXECUTORS",
    "AttemptRecord",
    "EvaluatorRecipe",
    "Executor",
    "ExecutorBackend",
    "ExecutorClosed",
    "HardwareMismatch",
    "LocalExecutor",
    "PacedEvaluator",
    "Placement",
    "RayExecutor",
    "build_evaluator",
]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from tuner.workers.executors.ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(name)
