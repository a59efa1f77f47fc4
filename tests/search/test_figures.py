"""A told trial's figures as optuna-dashboard shows them: flat, small, finite, labelled."""

from __future__ import annotations

import json

import pytest

from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    LatencyStats,
    LevelResult,
    LoadLevel,
    Method,
    Objective,
    SpecConfig,
    SpecDecodeStats,
    TrialResult,
    TrialStatus,
)
from tuner.search._figures import MAX_REASON_CHARS, trial_figures

NGRAM = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4)


def _level(c: int, tok_s: float, **kw: object) -> LevelResult:
    return LevelResult(
        level=LoadLevel(value=c),
        output_throughput=tok_s,
        tpot_ms=LatencyStats(mean=5.0, p50=4.987654, p99=9.0),
        ttft_ms=LatencyStats(mean=20.0, p50=18.0, p99=float("nan")),
        **kw,  # type: ignore[arg-type]
    )


def test_measured_levels_become_rounded_figures_with_speedup_over_the_baseline() -> None:
    result = TrialResult(
        status=TrialStatus.SUCCEEDED,
        engine=Engine.VLLM,
        spec=NGRAM,
        hardware="mi300x",
        levels=(
            _level(1, 150.0, spec_decode=SpecDecodeStats(num_drafts=10, num_draft_tokens=40, num_accepted_tokens=15)),
            _level(8, 900.0, client_bound=True),
        ),
    )
    attrs = trial_figures(result, ["c1", "c8"], Objective.THROUGHPUT, {"c1": 100.0, "c8": 1000.0})
    assert attrs["config"] == "ngram k=4" and attrs["engine"] == "vllm" and attrs["simulated"] is False
    assert attrs["c1.speedup"] == 1.5 and attrs["c8.speedup"] == 0.9
    assert attrs["c1.acceptance_length"] == 2.5 and "c8.acceptance_length" not in attrs  # no drafts counted
    assert attrs["c1.tpot_p50_ms"] == 4.99
    assert "c1.ttft_p99_ms" not in attrs  # NaN has no place in the study's JSON
    assert attrs["c8.client_bound"] is True and "c1.client_bound" not in attrs
    json.dumps(attrs, allow_nan=False)


def test_a_failed_trial_shows_why_and_no_figures() -> None:
    result = TrialResult(
        status=TrialStatus.FAILED,
        engine=Engine.SIMULATED,
        spec=NGRAM,
        failure=Failure(FailureClass.OOM, "x" * 1000),
    )
    attrs = trial_figures(result, ["c1"], Objective.THROUGHPUT, {})
    assert attrs["simulated"] is True and attrs["status"] == "failed"
    assert attrs["failure"].startswith("oom: x") and len(attrs["failure"]) == MAX_REASON_CHARS
    assert not [k for k in attrs if k.startswith("c1.")]


def test_no_speedup_before_the_baseline_is_in() -> None:
    result = TrialResult(status=TrialStatus.SUCCEEDED, engine=Engine.VLLM, spec=NGRAM, levels=(_level(1, 150.0),))
    attrs = trial_figures(result, ["c1"], Objective.THROUGHPUT, {})
    assert attrs["c1.output_tok_s"] == 150.0 and "c1.speedup" not in attrs


def test_a_planner_on_a_database_writes_a_result_and_its_figures_in_one_call(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.search.fake_engine import FakeEngine
    from tests.search.support import LEVELS, space
    from tuner.domain import ModelRef, TrialSpec
    from tuner.search import OptunaPlanner
    from tuner.search.storage import RetryingRDBStorage

    def one_by_one(*args: object, **kwargs: object) -> None:
        raise AssertionError("a told trial's attrs are written one commit each")

    planner = OptunaPlanner(space(), LEVELS, storage=db_url, study_name="figures")
    baseline = planner.ask()
    assert baseline is not None
    result = FakeEngine()(TrialSpec(model=ModelRef("m"), spec=baseline.spec, levels=LEVELS, requests=()))
    monkeypatch.setattr(RetryingRDBStorage, "set_trial_user_attr", one_by_one)
    planner.tell(baseline.number, result)
    attrs = planner.study.trials[baseline.number].user_attrs
    assert "result" in attrs and attrs["config"] == "off" and attrs["c8.speedup"] == 1.0
