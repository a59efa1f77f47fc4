"""Adaptive verification in one study with fixed K: on the simulated engine (its adaptive model is an
assumption calibrated to vLLM #52362's DSpark figures), fixed K wins at low concurrency and adaptive at
high, and the per-level answers say so."""

from __future__ import annotations

import pytest

from tuner.domain import Budget, LoadLevel, Method, ModelRef, TrafficRequest
from tuner.search import build_space, tune
from tuner.workers import sim_model
from tuner.workers.simulated import PRESETS, WORKLOADS, SimulatedEngine

DSV = {"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "num_nextn_predict_layers": 1}
PROFILE, WORKLOAD = PRESETS["deepseek-v3-mtp"], WORKLOADS["chat"]


@pytest.mark.parametrize("seed", [0, 3])
def test_fixed_k_at_low_concurrency_adaptive_at_high(seed: int) -> None:
    space = build_space("org/dsv4", DSV, hardware="mi350x", vllm_version="0.34.0", methods=[Method.DSPARK])
    assert [o.key for o in space.options] == ["off", "dspark", "dspark+adaptive"]
    levels = [LoadLevel(value=c, num_requests=4 * c) for c in (4, 64, 256)]
    requests = [TrafficRequest(format="chat", messages=({"role": "user", "content": "hello " * 50},))] * 64
    engine = SimulatedEngine(PROFILE, WORKLOAD, seed=seed)
    report = tune(
        space, engine, model=ModelRef("org/dsv4"), requests=requests, levels=levels, budget=Budget(12), seed=seed
    )

    def truth(spec, level: LoadLevel) -> float:
        off = sim_model.closed_loop(PROFILE, WORKLOAD, space.grid()[0], level.value).request_rate
        return sim_model.closed_loop(PROFILE, WORKLOAD, spec, level.value).request_rate / off

    winners = {w.level: w.spec for w in report.outcome.per_level_winners}
    for level in levels:
        best = max(truth(s, level) for s in space.grid())
        assert truth(winners[level.label], level) >= 0.98 * best, (level.label, winners[level.label].label())
    assert not winners["c4"].adaptive and winners["c256"].adaptive
    assert winners["c256"].to_vllm()["enable_adaptive_verification"] is True
