import runpy
from pathlib import Path

from tuner.domain import Budget, Method, ModelRef, TrafficRequest
from tuner.search import build_space, default_levels, tune
from tuner.workers.simulated import PRESETS, WORKLOADS, SimulatedEngine

ROOT = Path(__file__).resolve().parents[2]


def test_tune_on_the_simulated_engine_with_history_and_native_mtp():
    config = {
        "model_type": "deepseek_v3",
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "num_nextn_predict_layers": 1,
    }
    space = build_space(
        "deepseek-ai/DeepSeek-V3",
        config,
        hardware="h100",
        vllm_version="0.34.0",
        methods=[Method.MTP, Method.NGRAM],
        ngram_lookups=[(2, 4)],
    )
    requests = [TrafficRequest(format="chat", messages=({"role": "user", "content": "hello " * 50},))] * 64
    engine = SimulatedEngine(PRESETS["deepseek-v3-mtp"], WORKLOADS["chat"], seed=3)
    report = tune(
        space,
        engine,
        model=ModelRef("deepseek-ai/DeepSeek-V3"),
        requests=requests,
        levels=default_levels(requests),
        budget=Budget(max_trials=10),
    )
    assert report.outcome.best.method is Method.MTP
    assert report.history[0][0].purpose == "baseline"
    assert report.search_trials <= 8 and report.trials_run >= report.search_trials
    assert report.outcome.speedup.runs >= 1 and report.outcome.speedup.mean > 1.2


def test_a_raising_evaluator_is_recorded_not_fatal():
    space = build_space(
        "m",
        None,
        hardware="h100",
        vllm_version="0.34.0",
        methods=[Method.NGRAM],
        ngram_lookups=[(2, 4)],
        depth_range=(1, 2),
    )
    engine = SimulatedEngine(PRESETS["llama-3.1-8b"], WORKLOADS["code"])

    def flaky(spec):
        if spec.spec.num_speculative_tokens == 2:
            raise RuntimeError("boom")
        return engine(spec)

    report = tune(
        space,
        flaky,
        model=ModelRef("m"),
        requests=[TrafficRequest(format="completions", prompt="x")],
        levels=default_levels([]),
        confirm_runs=0,
    )
    failed = [r for _, r in report.history if r.failure is not None]
    assert failed and failed[0].failure.cls.value == "internal"


def test_the_library_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "library_tune.py"), run_name="__main__")
    assert "best static config" in capsys.readouterr().out


def test_a_deployed_catalog_draft_says_where_it_comes_from_and_that_simulation_is_no_evidence():
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
    model = "meta-llama/Llama-3.1-8B-Instruct"
    space = build_space(model, config, hardware="h100", vllm_version="0.34.0", methods=[Method.EAGLE3])
    catalog = {o.draft: o for o in space.options if o.source == "catalog"}
    assert catalog and all(o.source_url and o.verified is False for o in catalog.values())
    requests = [TrafficRequest(format="completions", prompt="def f(x):\n" * 20, output_tokens=128)] * 64
    engine = SimulatedEngine(PRESETS["llama-3.1-8b"], WORKLOADS["code"], seed=0)
    out = tune(space, engine, model=ModelRef(model), requests=requests, levels=default_levels(requests)[:2]).outcome
    assert out.deployed.model in catalog
    (note,) = [n for n in out.notes if n.startswith("draft ")]
    assert catalog[out.deployed.model].source_url in note and "verified: False" in note and "simulated" in note
