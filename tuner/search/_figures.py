"""A told trial's figures as flat Optuna user attrs, for a person reading the study in optuna-dashboard.

The planner reads nothing here back: its decisions come from the ``result`` attr (the whole ``TrialResult``).
That blob is JSON the dashboard cuts at 1024 characters, so the figures a person compares trials by are
also stored one per attr: the dashboard lists every attr of a trial, and makes a numeric attr a sortable
column of its trial table. Keys are ``<level>.<figure>`` (``c8.output_tok_s``); values are rounded, finite
numbers, short strings and booleans, so each attr stays small and JSON-serialisable. How the dashboard shows
attrs: docs/optuna-dashboard.md, "The JSON API the pages render".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.domain import LevelResult, Objective, TrialResult
from tuner.search.objective import level_metric

# Failure reasons can carry a log line; the dashboard shows the start, the trial row keeps all of it.
MAX_REASON_CHARS = 200


def trial_figures(
    result: TrialResult,
    labels: Sequence[str],
    objective: Objective,
    baseline_metric: Mapping[str, float],
) -> dict[str, Any]:
    """The user attrs of one told trial: what ran and where, then each measured level's figures.

    ``baseline_metric`` is the objective's per-level metric of the no-speculation baseline as the search
    sees it when the trial is told (empty before the baseline is in): ``<level>.speedup`` is the trial's
    metric over it, the per-level speedup the search decides by (output tok/s for the throughput objective).
    """
    attrs: dict[str, Any] = {
        "config": result.spec.label(),
        "status": result.status.value,
        "engine": result.engine.value,
        # every record of a simulated trial says so; the dashboard shows it beside the figures
        "simulated": result.simulated,
    }
    if result.hardware:
        attrs["hardware"] = result.hardware
    if result.failure is not None:
        attrs["failure"] = f"{result.failure.cls.value}: {result.failure.reason}"[:MAX_REASON_CHARS]
    if not result.status.has_figures():
        return attrs
    for label in labels:
        lr = result.level(label)
        if lr is None:
            continue
        for name, value in _level_figures(lr, objective, baseline_metric.get(label)).items():
            attrs[f"{label}.{name}"] = value
    return attrs


def _level_figures(lr: LevelResult, objective: Objective, baseline: float | None) -> dict[str, Any]:
    figures: dict[str, float | None] = {
        "output_tok_s": lr.output_throughput,
        "tpot_p50_ms": lr.tpot_ms.p50,
        "tpot_p99_ms": lr.tpot_ms.p99,
        "ttft_p50_ms": lr.ttft_ms.p50,
        "ttft_p99_ms": lr.ttft_ms.p99,
        "acceptance_length": lr.spec_decode.acceptance_length if lr.spec_decode and lr.spec_decode.num_drafts else None,
        "speedup": level_metric(lr, objective) / baseline if baseline else None,
    }
    out: dict[str, Any] = {
        name: round(v, 4 if name in ("acceptance_length", "speedup") else 2)
        for name, v in figures.items()
        if v is not None and math.isfinite(v)  # the study's JSON has no NaN or infinity
    }
    if lr.client_bound:  # measured the client, not the server: such a level decides nothing
        out["client_bound"] = True
    return out
