"""Use spec-tuner's search as a library, on the simulated engine (runs in about a second, no GPU).

    .venv/bin/python examples/library_tune.py

Swap ``SimulatedEngine`` for any callable that takes a ``TrialSpec`` and returns a ``TrialResult`` (the
real vLLM runner, or your own harness) and ``storage=None`` for ``"sqlite:///tune.db"`` to make the job
resumable.
"""

from __future__ import annotations

import optuna

from tuner.domain import Budget, Method, ModelRef, TrafficRequest
from tuner.search import build_space, default_levels, model_traits, tune
from tuner.workers.simulated import PRESETS, WORKLOADS, SimulatedEngine

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The target's config.json (normally read_model_config(model) finds it locally or in the HF cache).
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
model = "meta-llama/Llama-3.1-8B-Instruct"
print("traits:", model_traits(config, model))

space = build_space(
    model,
    config,
    hardware="h100",
    vllm_version="0.34.0",
    methods=[Method.NGRAM, Method.SUFFIX, Method.EAGLE3],
    ngram_lookups=[(2, 4)],
)
print(f"search space: {[o.key for o in space.options]}, grid of {space.grid_size} configurations")

requests = [
    TrafficRequest(format="completions", prompt=f"def f{i}(x):\n    return x * {i}\n" * 8, output_tokens=256)
    for i in range(200)
]
levels = default_levels(requests)  # c1, c8, c32, c128
engine = SimulatedEngine(PRESETS["llama-3.1-8b"], WORKLOADS["code"], noise=0.03, seed=0)

report = tune(
    space,
    engine,
    model=ModelRef(model),
    requests=requests,
    levels=levels,
    budget=Budget(max_trials=12),
    storage=None,
    seed=0,
    confirm_runs=3,
)

out = report.outcome
print(
    f"\n{report.search_trials} search trials (+{report.trials_run - report.search_trials} confirmation runs) "
    f"instead of a {space.grid_size}-trial grid"
)
print("best static config:", out.best.label())
print("deploy:", out.deployed.to_vllm(), "(a per-batch-size schedule)" if out.schedule else "")
if out.speedup:  # always the deployed config's, from its confirmation runs
    print(f"speedup {out.speedup.mean:.2f}x ({out.speedup.low:.2f}-{out.speedup.high:.2f}, {out.speedup.runs} runs)")
for w in out.per_level_winners:
    print(f"  {w.level}: {w.spec.label()} ({w.speedup:.2f}x)")
for note in out.notes:
    print("  note:", note)
print(f"{len(out.skipped)} configurations skipped, e.g. {out.skipped[0].spec.label()}: {out.skipped[0].reason}")
