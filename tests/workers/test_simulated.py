"""The simulated engine: behaviour of the model and calibration against published figures.

Calibration targets come from docs/published-figures.md; each test states its source and tolerance.
Speedup here is output throughput over no speculation at the same level (noise free, ``expected``).
"""

from __future__ import annotations

import statistics

import pytest

from tuner.domain import (
    SLO,
    Engine,
    Evaluator,
    FailureClass,
    LoadKind,
    LoadLevel,
    Method,
    ModelRef,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialContext,
    TrialSpec,
    TrialStatus,
)
from tuner.workers.correctness import compare
from tuner.workers.simulated import PRESETS, WORKLOADS, ModelProfile, SimulatedEngine, WorkloadProfile

DENSE = PRESETS["llama-3.1-8b"]
CHAT = WORKLOADS["chat"]
EAGLE3_K3 = SpecConfig(Method.EAGLE3, 3)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def level(c: float, n: int | None = None, kind: LoadKind = LoadKind.CONCURRENCY) -> LoadLevel:
    return LoadLevel(kind, c, n if n is not None else max(64, 2 * int(c)))


def requests(
    n: int = 8, text: str = "Tell me about the history of Rome. ", out: int = 256
) -> tuple[TrafficRequest, ...]:
    return tuple(
        TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"{i}: " + text * 20, output_tokens=out) for i in range(n)
    )


def trial(spec: SpecConfig, *levels: LoadLevel, **kw: object) -> TrialSpec:
    return TrialSpec(ModelRef("m"), spec, levels or (level(4),), kw.pop("reqs", requests()), **kw)  # type: ignore[arg-type]


def speedup(engine: SimulatedEngine, spec: SpecConfig, c: float) -> float:
    return engine.speedup(spec, level(c))


def tau(acc: tuple[float, ...]) -> float:
    total, surv = 1.0, 1.0
    for a in acc:
        surv *= a
        total += surv
    return total


def first_below_one(engine: SimulatedEngine, spec: SpecConfig) -> int | None:
    return next((b for b in BATCHES if speedup(engine, spec, b) < 1.0), None)


# --------------------------------------------------------------------------------------------------
# Contract, labelling, determinism, noise
# --------------------------------------------------------------------------------------------------
def test_is_an_evaluator_and_every_result_is_labelled_simulated() -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    assert isinstance(engine, Evaluator)
    bad = SimulatedEngine(ModelProfile("x", unsupported=frozenset({Method.EAGLE3})), CHAT)
    for result in (engine(trial(SpecConfig())), engine(trial(EAGLE3_K3)), bad(trial(EAGLE3_K3))):
        assert result.engine is Engine.SIMULATED and result.simulated
        assert result.vllm_version == "simulated" and result.hardware == "simulated"


def test_one_level_result_per_level_with_plausible_figures() -> None:
    levels = (level(1), level(16), LoadLevel(LoadKind.RATE, 2.0, 64))
    result = SimulatedEngine(DENSE, CHAT)(trial(EAGLE3_K3, *levels, slo=SLO(p99_tpot_ms=50)))
    assert result.status is TrialStatus.SUCCEEDED
    assert [lr.level for lr in result.levels] == list(levels)
    for lr in result.levels:
        assert lr.output_throughput > 0 and lr.request_throughput > 0 and 0 < lr.goodput <= lr.request_throughput
        for stats in (lr.ttft_ms, lr.tpot_ms, lr.itl_ms, lr.e2e_ms):
            assert 0 < stats.p50 <= stats.p90 <= stats.p99
        assert lr.e2e_ms.mean > lr.ttft_ms.mean
        assert lr.itl_ms.mean > lr.tpot_ms.mean  # one SSE chunk per step carries several tokens
        assert lr.spec_decode is not None and lr.spec_decode.decode_steps
    assert result.levels[0].achieved_concurrency == 1 and result.levels[1].achieved_concurrency == 16


def test_same_seed_same_results_repeats_differ() -> None:
    spec = trial(EAGLE3_K3, level(8))
    a, b = SimulatedEngine(DENSE, CHAT, seed=7), SimulatedEngine(DENSE, CHAT, seed=7)
    first_a, first_b = a(spec), b(spec)
    assert first_a == first_b
    assert a(spec).levels[0].output_throughput != first_a.levels[0].output_throughput  # a repeat differs
    other = SimulatedEngine(DENSE, CHAT, seed=8)(spec)
    assert other.levels[0].output_throughput != first_a.levels[0].output_throughput


def test_results_do_not_depend_on_other_trials_in_between() -> None:
    spec, noise = trial(EAGLE3_K3, level(8)), trial(SpecConfig(Method.NGRAM, 3), level(8))
    quiet, busy = SimulatedEngine(DENSE, CHAT), SimulatedEngine(DENSE, CHAT)
    busy(noise)
    busy(noise)
    assert quiet(spec) == busy(spec)


@pytest.mark.parametrize("noise", [0.03, 0.10])
def test_noise_spread_matches_the_requested_noise(noise: float) -> None:
    engine = SimulatedEngine(DENSE, CHAT, noise=noise, seed=1)
    spec = trial(EAGLE3_K3, level(8, 32), reqs=())  # no traffic: the lengths expected() assumes
    xs = [engine(spec).levels[0].output_throughput for _ in range(300)]
    cv = statistics.stdev(xs) / statistics.fmean(xs)
    assert noise * 0.8 < cv < noise * 1.2
    truth = engine.expected(EAGLE3_K3, level(8, 32)).output_throughput
    assert abs(statistics.fmean(xs) / truth - 1) < 0.02


def test_zero_noise_reproduces_the_expectation() -> None:
    engine = SimulatedEngine(DENSE, CHAT, noise=0.0)
    lv = level(8, 64)
    measured = engine(trial(EAGLE3_K3, lv, reqs=())).levels[0]
    assert measured.output_throughput == pytest.approx(engine.expected(EAGLE3_K3, lv).output_throughput, rel=1e-9)
    traffic = requests(8, out=500)
    on_traffic = engine(trial(EAGLE3_K3, lv, reqs=traffic)).levels[0]
    truth = engine.expected(EAGLE3_K3, lv, requests=traffic)
    assert on_traffic.output_throughput == pytest.approx(truth.output_throughput, rel=1e-9)
    assert truth.output_tokens == 64 * 500


# --------------------------------------------------------------------------------------------------
# The shape of the model
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [EAGLE3_K3, SpecConfig(Method.NGRAM, 3), SpecConfig(Method.DRAFT_MODEL, 4)])
def test_dense_speedup_falls_with_batch(spec: SpecConfig) -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    curve = [speedup(engine, spec, b) for b in BATCHES]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(curve, curve[1:], strict=False))
    assert curve[0] > 1.0 > curve[-1]


@pytest.mark.parametrize("moe", ["qwen3-moe-30b", "gpt-oss-120b", "deepseek-v3-mtp"])
def test_moe_crossover_is_much_later_than_dense(moe: str) -> None:
    spec = SpecConfig(Method.MTP, 2) if moe == "deepseek-v3-mtp" else EAGLE3_K3
    dense_cross = first_below_one(SimulatedEngine(DENSE, CHAT), EAGLE3_K3)
    moe_engine = SimulatedEngine(PRESETS[moe], CHAT)
    assert dense_cross is not None and dense_cross <= 128
    assert speedup(moe_engine, spec, 200) > 1.0  # gains persist to c200+ (RH, figures' crossover table)
    assert (first_below_one(moe_engine, spec) or 10_000) > dense_cross


def test_best_depth_falls_with_batch() -> None:
    engine = SimulatedEngine(DENSE, CHAT)

    def best_k(b: int) -> int:
        return max(range(1, 9), key=lambda k: speedup(engine, SpecConfig(Method.EAGLE3, k), b))

    assert 4 <= best_k(1) <= 7  # figures: best k 4-7 at bs1 ...
    assert 1 <= best_k(32) <= 3 and 1 <= best_k(64) <= 3  # ... 1-3 at bs32-64 (AUTO, DSD)


def test_zero_depth_schedule_is_slower_than_off_and_the_cost_grows_with_batch() -> None:
    # vllm #49548: K=0 still costs +6.6% TPOT at c2, +21.6% at c189 (Gemma-4-31B, H100); tolerance 3 points.
    engine = SimulatedEngine(DENSE, CHAT)
    k0 = SpecConfig(Method.EAGLE3, 3, schedule=((1, 1024, 0),))
    overhead = {}
    for c in (2, 189):
        off = engine.expected(SpecConfig(), level(c)).tpot_ms.mean
        overhead[c] = engine.expected(k0, level(c)).tpot_ms.mean / off - 1
    assert overhead[2] == pytest.approx(0.066, abs=0.03)
    assert overhead[189] == pytest.approx(0.216, abs=0.03)
    stats = engine(trial(k0, level(4))).levels[0].spec_decode
    assert stats is not None and stats.num_drafts == 0 and stats.decode_steps


def test_schedule_depth_is_used_per_batch() -> None:
    spec = SpecConfig(Method.EAGLE3, 5, schedule=((1, 16, 5), (17, 64, 2), (65, 1024, 1)))
    result = SimulatedEngine(DENSE, CHAT)(trial(spec, level(4), level(32), level(128)))
    proposed = [lr.spec_decode.mean_proposed_per_draft for lr in result.levels if lr.spec_decode]
    assert proposed == [5.0, 2.0, 1.0]
    assert (
        result.levels[2].spec_decode is not None and result.levels[2].spec_decode.accepted_per_position[1:] == (0,) * 4
    )


def test_reported_acceptance_matches_the_acceptance_model() -> None:
    for profile, spec in (
        (DENSE, SpecConfig(Method.EAGLE3, 4)),
        (PRESETS["deepseek-v3-mtp"], SpecConfig(Method.MTP, 3)),
    ):
        engine = SimulatedEngine(profile, CHAT)
        stats = engine(trial(spec, level(8, 256))).levels[0].spec_decode
        acc = engine.acceptance(spec)
        assert stats is not None and len(acc) == spec.num_speculative_tokens
        assert stats.acceptance_length == pytest.approx(tau(acc), rel=0.02)
        for measured, model in zip(stats.conditional_per_position, acc, strict=True):
            assert measured == pytest.approx(model, abs=0.03)
        assert stats.empty_step_fraction == 0.0  # chain drafters propose every step


def test_ngram_reports_empty_steps_and_overstates_its_speedup() -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    spec = SpecConfig(Method.NGRAM, 4)
    result = engine(trial(spec, level(1, 128)))
    stats = result.levels[0].spec_decode
    assert stats is not None and stats.empty_step_fraction is not None
    assert stats.empty_step_fraction == pytest.approx(1 - engine.proposal_rate(spec), abs=0.03)
    assert 0.6 < stats.empty_step_fraction < 0.95  # chat: a proposal on 10-25% of steps
    assert stats.acceptance_length == pytest.approx(tau(engine.acceptance(spec)), rel=0.03)
    # vLLM counts drafts only on proposing steps, so tau overstates the real speedup
    assert stats.acceptance_length > speedup(engine, spec, 1) + 0.3


def test_ngram_lookup_window_matters_mildly() -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    narrow = engine.proposal_rate(SpecConfig(Method.NGRAM, 4, prompt_lookup_min=5, prompt_lookup_max=5))
    wide = engine.proposal_rate(SpecConfig(Method.NGRAM, 4, prompt_lookup_min=2, prompt_lookup_max=5))
    assert narrow < wide < 1.5 * narrow


def test_code_edit_makes_ngram_worth_it_and_chat_does_not_at_high_batch() -> None:
    spec = SpecConfig(Method.NGRAM, 5)
    assert speedup(SimulatedEngine(DENSE, WORKLOADS["code-edit"]), spec, 1) > 2.0
    assert speedup(SimulatedEngine(DENSE, CHAT), spec, 64) < 1.0


def test_rate_levels_follow_littles_law_and_saturate() -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    light = engine.expected(EAGLE3_K3, LoadLevel(LoadKind.RATE, 2.0, 200))
    assert light.request_throughput == pytest.approx(2.0, rel=1e-6)
    assert light.achieved_concurrency == pytest.approx(2.0 * light.e2e_ms.mean / 1e3, rel=0.15)
    flood = engine.expected(EAGLE3_K3, LoadLevel(LoadKind.RATE, 1000.0, 500))
    assert flood.request_throughput < 1000 and flood.max_waiting and flood.ttft_ms.mean > 10 * light.ttft_ms.mean


def test_goodput_counts_requests_meeting_the_slo() -> None:
    engine = SimulatedEngine(DENSE, CHAT)
    lv = level(16)
    free = engine.expected(EAGLE3_K3, lv)
    assert free.goodput == pytest.approx(free.request_throughput)
    tight = engine.expected(EAGLE3_K3, lv, slo=SLO(p99_tpot_ms=free.tpot_ms.p50))
    assert 0.2 * free.goodput < tight.goodput < 0.8 * free.goodput


# --------------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------------
def test_unsupported_configurations_fail_at_start_with_a_vllm_like_message() -> None:
    profile = ModelProfile("x", unsupported=frozenset({Method.DFLASH}))
    cases = [
        (profile, SpecConfig(Method.DFLASH, 8)),
        (DENSE, SpecConfig(Method.MTP, 2)),  # no MTP layers
        (ModelProfile("y", mtp_layers=2), SpecConfig(Method.MTP, 3)),  # K not a multiple of the layers
        (DENSE, SpecConfig(Method.EAGLE3, 0)),
        (DENSE, SpecConfig(Method.SUFFIX, 8, schedule=((1, 8, 8),))),  # no per-batch schedule on suffix
    ]
    for model, spec in cases:
        result = SimulatedEngine(model, CHAT)(trial(spec))
        assert result.status is TrialStatus.FAILED and result.failure is not None, spec
        assert result.failure.cls is FailureClass.UNSUPPORTED and result.failure.reason.split(":")[0].endswith("Error")
        assert not result.levels


def test_an_mtp_assistant_checkpoint_needs_no_native_heads_and_decays_like_a_chain() -> None:
    # Gemma 4's assistants: method mtp with a separate draft, any K (vLLM reads it as n_predict=1).
    spec = SpecConfig(Method.MTP, 5, model="google/gemma-4-31B-it-assistant")
    engine = SimulatedEngine(DENSE, CHAT)
    result = engine(trial(spec))
    assert result.status is TrialStatus.SUCCEEDED, result.failure
    acc = engine.acceptance(spec)
    assert len(acc) == 5 and all(later < earlier for earlier, later in zip(acc, acc[1:], strict=False))
    assert engine(trial(SpecConfig(Method.MTP, 5))).status is TrialStatus.FAILED  # no heads, no assistant


def test_oom_above_a_depth_and_crash_mid_run() -> None:
    profile = ModelProfile("x", max_depth_before_oom={Method.EAGLE3: 4}, crashing=frozenset({Method.NGRAM}))
    engine = SimulatedEngine(profile, CHAT)
    assert engine(trial(SpecConfig(Method.EAGLE3, 4))).status is TrialStatus.SUCCEEDED
    oom = engine(trial(SpecConfig(Method.EAGLE3, 5)))
    assert oom.failure is not None and oom.failure.cls is FailureClass.OOM and "out of memory" in oom.failure.reason
    crash = engine(trial(SpecConfig(Method.NGRAM, 3), level(1), level(8), level(32)))
    assert crash.status is TrialStatus.FAILED and crash.failure is not None
    assert crash.failure.cls is FailureClass.CRASH and "EngineDeadError" in crash.failure.log_tail
    assert 0 < len(crash.levels) < 3


def test_diverging_method_is_measured_but_fails_the_correctness_gate() -> None:
    profile = ModelProfile("x", diverging=frozenset({Method.EAGLE3}))
    engine = SimulatedEngine(profile, CHAT)
    baseline = engine(trial(SpecConfig()))
    assert baseline.reference_outputs and baseline.correctness is None
    good = engine(trial(SpecConfig(Method.EAGLE, 3), reference_outputs=baseline.reference_outputs))
    assert good.status is TrialStatus.SUCCEEDED and good.correctness is not None and good.correctness.passed
    bad = engine(trial(EAGLE3_K3, reference_outputs=baseline.reference_outputs))
    assert bad.status is TrialStatus.DIVERGED and bad.levels and bad.correctness is not None
    assert not bad.correctness.passed and not bad.recommendable


def test_the_simulated_gate_is_the_runners_compare_with_its_threshold() -> None:
    profile = ModelProfile("x", diverging=frozenset({Method.EAGLE3}))
    baseline = SimulatedEngine(profile, CHAT)(trial(SpecConfig()))
    reference = baseline.reference_outputs
    assert reference
    bad = SimulatedEngine(profile, CHAT)(trial(EAGLE3_K3, reference_outputs=reference))
    assert bad.correctness is not None and bad.reference_outputs is not None
    assert bad.correctness == compare(bad.reference_outputs, reference, 0.5)  # the same function, same figures
    assert bad.correctness.median_prefix_fraction == pytest.approx(3 / 16)  # diverges after 3 tokens
    lenient = SimulatedEngine(profile, CHAT, correctness_threshold=0.1)(trial(EAGLE3_K3, reference_outputs=reference))
    assert lenient.status is TrialStatus.SUCCEEDED and lenient.correctness is not None
    assert lenient.correctness.threshold == 0.1 and lenient.correctness.passed


def test_a_simulated_trial_without_a_reference_says_it_was_not_gated() -> None:
    result = SimulatedEngine(DENSE, CHAT)(trial(EAGLE3_K3))
    assert result.status is TrialStatus.SUCCEEDED and result.correctness is not None
    assert not result.correctness.gated and result.correctness.comparisons == ()
    assert result.correctness.not_gated is not None and "reference" in result.correctness.not_gated


def test_cancellation_stops_before_the_next_level() -> None:
    calls = iter([False, True])
    ctx = TrialContext(is_cancelled=lambda: next(calls))
    result = SimulatedEngine(DENSE, CHAT)(trial(EAGLE3_K3, level(1), level(8)), ctx)
    assert result.status is TrialStatus.CANCELLED and len(result.levels) == 1
    assert result.failure is not None and result.failure.cls is FailureClass.CANCELLED


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------
def test_workload_from_requests() -> None:
    code = "def area(r):\n    return 3.14 * r * r\n\nclass Shape:\n    def size(self):\n        return [1, 2]\n"
    code_wl = WorkloadProfile.from_requests(requests(4, code + "Rename area to circle_area.\n"))
    chat_wl = WorkloadProfile.from_requests(
        [
            TrafficRequest(
                TrafficFormat.CHAT, messages=({"role": "user", "content": "Why is the sky blue?"},), max_tokens=300
            )
        ]
    )
    assert code_wl.name == "code" and code_wl.acceptance_shift > 0 and code_wl.ngram_match > 0.4
    assert chat_wl.name == "chat" and chat_wl.ngram_match < 0.3 and chat_wl.output_tokens == 300
    assert WorkloadProfile.from_requests(()) == CHAT
    # the engine derives the workload from the trial's traffic when none is given
    engine = SimulatedEngine(DENSE)
    on_code = engine(trial(SpecConfig(Method.NGRAM, 5), reqs=requests(4, code))).levels[0].spec_decode
    on_chat = engine(trial(SpecConfig(Method.NGRAM, 5))).levels[0].spec_decode
    assert on_code and on_chat and on_code.empty_step_fraction < on_chat.empty_step_fraction  # type: ignore[operator]


def test_model_profile_from_hf_config() -> None:
    llama = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
             "num_attention_heads": 32, "num_key_value_heads": 8}  # fmt: skip
    dense = ModelProfile.from_hf_config(llama)
    assert not dense.moe and dense.mtp_layers == 0
    assert dense.target_step_ms == pytest.approx(DENSE.target_step_ms, rel=0.1)
    assert dense.per_token_us == pytest.approx(DENSE.per_token_us, rel=0.1)
    dsv3 = {"hidden_size": 7168, "num_hidden_layers": 61, "moe_intermediate_size": 2048, "n_routed_experts": 256,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "kv_lora_rank": 512, "num_nextn_predict_layers": 1,
            "quantization_config": {"quant_method": "fp8"}}  # fmt: skip
    moe = ModelProfile.from_hf_config(dsv3)
    assert moe.moe and moe.num_experts == 256 and moe.experts_per_token == 8 and moe.mtp_layers == 1
    assert moe.expert_load_ms > 0 and moe.knee_tokens > 10 * dense.knee_tokens
    qwen = ModelProfile.from_hf_config({"text_config": {"num_local_experts": 64, "num_experts_per_tok": 4,
                                        "mtp_num_hidden_layers": 2}})  # fmt: skip
    assert qwen.moe and qwen.mtp_layers == 2
    assert ModelProfile.from_hf_config({"num_mtp_modules": 3}).mtp_layers == 3


def test_presets_and_workloads_run() -> None:
    assert {"llama-3.1-8b", "qwen3-moe-30b", "deepseek-v3-mtp", "gpt-oss-20b"} <= PRESETS.keys()
    assert {"code", "chat", "summarisation", "math", "writing"} <= WORKLOADS.keys()
    for profile in PRESETS.values():
        engine = SimulatedEngine(profile, CHAT)
        assert engine.speedup(EAGLE3_K3, level(1)) > 1.2, profile.name


# --------------------------------------------------------------------------------------------------
# Calibration against published figures (spec-decode-figures.md)
# --------------------------------------------------------------------------------------------------
def test_calibration_eagle3_llama_8b_crossover() -> None:
    # E3 (arXiv 2503.01840), Llama-3.1-8B k=3 SGLang H100: bs2 1.81, bs16 1.48, bs32 1.32; vLLM A100 k=2 bs56 1.01.
    engine = SimulatedEngine(DENSE, CHAT)
    assert speedup(engine, EAGLE3_K3, 2) == pytest.approx(1.8, abs=0.25)
    assert speedup(engine, EAGLE3_K3, 16) == pytest.approx(1.48, abs=0.2)
    assert speedup(engine, EAGLE3_K3, 32) == pytest.approx(1.34, abs=0.2)
    assert 0.8 <= speedup(engine, EAGLE3_K3, 64) <= 1.2
    assert speedup(engine, SpecConfig(Method.EAGLE3, 2), 56) == pytest.approx(1.01, abs=0.2)


def test_calibration_eagle1_and_draft_model_cross_earlier() -> None:
    # E3: EAGLE-1 bs2 1.30-1.40, below 1 by bs24-32; figures: draft model crossover bs8-32.  Tolerance: one band.
    engine = SimulatedEngine(DENSE, CHAT)
    assert speedup(engine, SpecConfig(Method.EAGLE, 3), 2) == pytest.approx(1.4, abs=0.2)
    assert 16 < (first_below_one(engine, SpecConfig(Method.EAGLE, 3)) or 0) <= 64
    assert 8 <= (first_below_one(engine, SpecConfig(Method.DRAFT_MODEL, 4)) or 0) <= 64


def test_calibration_ngram_chat() -> None:
    # figures: ngram chat ~1.1-1.4x at bs1, crossover bs32-64 (SDB-sim derived ShareGPT tau 1.40).
    engine = SimulatedEngine(DENSE, CHAT)
    ngram = SpecConfig(Method.NGRAM, 3)
    assert 1.1 <= speedup(engine, ngram, 1) <= 1.4
    assert speedup(engine, ngram, 64) < 1.0


def test_calibration_acceptance_figures() -> None:
    # DSpark Kimi K3 k=7: coding 4.73 vs creative 2.61 (K3), tolerance 0.6
    dspark = SpecConfig(Method.DSPARK, 7)
    assert tau(SimulatedEngine(DENSE, WORKLOADS["code"]).acceptance(dspark)) == pytest.approx(4.73, abs=0.6)
    assert tau(SimulatedEngine(DENSE, WORKLOADS["writing"]).acceptance(dspark)) == pytest.approx(2.61, abs=0.6)
    # GLM-4.5-Air one MTP head reused, k=3: 0.92 -> 0.68 -> 0.38 by position (SDB), tolerance 0.1
    mtp = SimulatedEngine(ModelProfile("glm", moe=True, num_experts=128, experts_per_token=8, mtp_layers=1), CHAT)
    per_pos, surv = [], 1.0
    for a in mtp.acceptance(SpecConfig(Method.MTP, 3)):
        surv *= a
        per_pos.append(surv)
    assert per_pos == pytest.approx([0.92, 0.68, 0.38], abs=0.1)
    # suffix MT-bench k=1: 1.62 (V24852); EAGLE-3 gpt-oss-20B MT k=3: 2.70 (PE), tolerance 0.35
    assert tau(SimulatedEngine(DENSE, CHAT).acceptance(SpecConfig(Method.SUFFIX, 1))) == pytest.approx(1.62, abs=0.15)
    assert tau(SimulatedEngine(PRESETS["gpt-oss-20b"], CHAT).acceptance(EAGLE3_K3)) == pytest.approx(2.70, abs=0.35)


def test_calibration_deepseek_mtp() -> None:
    # ROCm-MTP: DeepSeek-V3 MTP k=2 on 8xMI300X, c1..64: 2.11 .. 1.25; tolerance 0.25 at c1, 0.2 at c64.
    engine = SimulatedEngine(PRESETS["deepseek-v3-mtp"], CHAT)
    spec = SpecConfig(Method.MTP, 2)
    assert speedup(engine, spec, 1) == pytest.approx(2.11, abs=0.25)
    assert speedup(engine, spec, 64) == pytest.approx(1.25, abs=0.2)
