"""The real VllmRunner against the protocol-speaking stand-in (fake_vllm.py): the correctness gate end to end,
and vLLM's counters read back into figures with known answers.

The stand-in serves recorded token ids (data/divergent_outputs.json): the no-speculation outputs without a
speculative config, a broken config's early-diverging outputs with one. So the baseline's greedy outputs, the
replay, the metrics and ``compare()`` all run as in a job, and the verdict comes from the outputs alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from runner_support import DATA, assert_group_gone

from tuner.domain import (
    LoadKind,
    LoadLevel,
    ModelRef,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialResult,
    TrialSpec,
    TrialStatus,
)
from tuner.workers.options import RunnerOptions
from tuner.workers.vllm_runner import VllmRunner

FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"
RECORDED = DATA / "divergent_outputs.json"
NGRAM = SpecConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
LEVELS = (
    LoadLevel(LoadKind.CONCURRENCY, 1, num_requests=4, warmup_requests=1),
    LoadLevel(LoadKind.CONCURRENCY, 4, num_requests=8, warmup_requests=2),
)


def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def requests() -> tuple[TrafficRequest, ...]:
    """The recorded prompts, the last one as a chat request so both endpoints are exercised."""
    prompts = recorded()["prompts"]
    out = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=p, output_tokens=16) for p in prompts[:-1]]
    out.append(
        TrafficRequest(TrafficFormat.CHAT, messages=({"role": "user", "content": prompts[-1]},), output_tokens=16)
    )
    return tuple(out)


def fake_runner(log_dir: Path, *, threshold: float = 0.5, **env: str) -> VllmRunner:
    options = RunnerOptions(
        vllm_command=(sys.executable, str(FAKE_VLLM)),
        log_dir=str(log_dir),
        stop_grace_s=1.0,
        metrics_interval_s=0.05,
        correctness_threshold=threshold,
        extra_env={"FAKE_VLLM_MODE": "serve", "FAKE_VLLM_OUTPUTS": str(RECORDED), **env},
    )
    return VllmRunner(options)


def trial(spec: SpecConfig, reference: tuple[tuple[int, ...], ...] | None = None, prompts: int = 4) -> TrialSpec:
    return TrialSpec(
        model=ModelRef("fake"),
        spec=spec,
        levels=LEVELS,
        requests=requests(),
        correctness_prompts=prompts,
        reference_outputs=reference,
    )


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> TrialResult:
    result = fake_runner(tmp_path_factory.mktemp("baseline"))(trial(SpecConfig()))
    assert_group_gone(result.pgid)
    return result


def test_the_baseline_returns_the_recorded_reference(baseline: TrialResult) -> None:
    assert baseline.status is TrialStatus.SUCCEEDED, baseline.failure
    assert baseline.reference_outputs == tuple(tuple(ids) for ids in recorded()["baseline"])
    assert baseline.correctness is None  # the baseline is the reference, not gated against itself


def test_early_divergence_makes_the_trial_diverged_with_figures_kept(baseline: TrialResult, tmp_path: Path) -> None:
    result = fake_runner(tmp_path)(trial(NGRAM, baseline.reference_outputs))
    assert_group_gone(result.pgid)
    assert result.status is TrialStatus.DIVERGED
    assert result.failure is None and not result.recommendable
    report = result.correctness
    assert report is not None and report.gated and not report.passed
    # compare()'s own figures, as the data file's comment predicts
    assert [c.common_prefix for c in report.comparisons] == [2, 1, 3, 14]
    assert [c.identical for c in report.comparisons] == [False] * 4
    assert report.median_prefix_fraction == pytest.approx(0.15625)
    assert report.threshold == 0.5
    # the figures are kept: every level measured, with vLLM-style spec-decode counters
    assert [lr.level.label for lr in result.levels] == ["c1", "c4"]
    for lr in result.levels:
        assert lr.errors == 0 and lr.num_requests == lr.level.num_requests
        assert lr.output_tokens == 16 * lr.num_requests and lr.output_throughput > 0
        sd = lr.spec_decode
        # per request: the prefill token, 7 steps of 1 accepted + bonus, a last step with no room to accept
        assert sd is not None and sd.num_drafts == 8 * lr.num_requests and sd.num_draft_tokens == 3 * sd.num_drafts
        assert sd.acceptance_length == pytest.approx(1 + 7 / 8) and sd.empty_step_fraction == 0.0


def test_a_lossless_speculative_trial_passes_the_same_gate(baseline: TrialResult, tmp_path: Path) -> None:
    result = fake_runner(tmp_path, FAKE_VLLM_SPECULATIVE_SET="baseline")(trial(NGRAM, baseline.reference_outputs))
    assert result.status is TrialStatus.SUCCEEDED, result.failure
    report = result.correctness
    assert report is not None and report.gated and report.passed and report.identical_fraction == 1.0
    assert_group_gone(result.pgid)


def test_the_threshold_is_the_runners(baseline: TrialResult, tmp_path: Path) -> None:
    result = fake_runner(tmp_path, threshold=0.1)(trial(NGRAM, baseline.reference_outputs))
    assert result.status is TrialStatus.SUCCEEDED  # 0.156 >= 0.1: this lenient gate lets it through
    assert result.correctness is not None and result.correctness.threshold == 0.1
    assert_group_gone(result.pgid)


@pytest.mark.parametrize(("reference", "prompts"), [(None, 4), ("baseline", 0)], ids=["no-reference", "no-prompts"])
def test_a_speculative_trial_that_could_not_be_gated_says_so(
    baseline: TrialResult, tmp_path: Path, reference: str | None, prompts: int
) -> None:
    ref = baseline.reference_outputs if reference else None
    result = fake_runner(tmp_path)(trial(NGRAM, ref, prompts=prompts))
    assert_group_gone(result.pgid)
    assert result.status is TrialStatus.SUCCEEDED and len(result.levels) == 2
    report = result.correctness
    assert report is not None, "a speculative trial must say whether it was gated"
    assert not report.gated and report.comparisons == ()
    assert report.not_gated is not None and "not compared" in report.not_gated


def test_steps_that_proposed_nothing_are_counted_as_empty(tmp_path: Path) -> None:
    """Every 2nd decode step proposes nothing (an ngram step without a match): per 16-token request, the
    prefill token, then 10 decode steps of which 5 drafted (2 tokens each, 1 accepted) and 5 were empty."""
    result = fake_runner(tmp_path, FAKE_VLLM_EMPTY_EVERY="2")(trial(NGRAM))
    assert_group_gone(result.pgid)
    assert result.status is TrialStatus.SUCCEEDED, result.failure
    for lr in result.levels:
        sd = lr.spec_decode
        assert sd is not None and sd.num_drafts == 5 * lr.num_requests
        assert sd.decode_steps == 10 * lr.num_requests
        assert sd.empty_step_fraction == pytest.approx(0.5)
        # vLLM's acceptance length averages the drafting steps only: 2.0, where a decode step gained 1.5 tokens
        assert sd.acceptance_length == pytest.approx(2.0)
        assert 1 + sd.num_accepted_tokens / sd.decode_steps == pytest.approx(1.5)


def test_the_runner_reports_its_stages_in_order(baseline: TrialResult, tmp_path: Path) -> None:
    """What `tuner trial` draws: server starting, ready (with its start-up time), each level i of n, the gate."""
    from tuner.domain import TrialContext, TrialProgress, TrialStage

    seen: list[TrialProgress] = []
    result = fake_runner(tmp_path)(trial(NGRAM, baseline.reference_outputs), TrialContext(on_progress=seen.append))
    assert result.status is TrialStatus.DIVERGED  # the recorded outputs diverge; every stage still ran
    stages = [p.stage for p in seen]
    n = len(LEVELS)
    assert stages == [TrialStage.STARTING, TrialStage.READY, *[TrialStage.MEASURING] * n, TrialStage.CHECKING]
    assert seen[1].startup_s == result.startup_s
    assert [(p.level, p.levels, p.label) for p in seen[2:-1]] == [(i + 1, n, lv.label) for i, lv in enumerate(LEVELS)]
