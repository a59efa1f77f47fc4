"""Search benchmark scenarios whose optimum is known: simulated-engine ones and ones frozen from papers.

Each scenario gives a search space, load levels, a noisy evaluator per seed and a noise-free truth. The grid
is every configuration of the space: every method's full depth range plus off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks import search_physics as phys
from benchmarks import search_published as pub
from tuner.domain import (
    Evaluator,
    LoadLevel,
    Method,
    ModelRef,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialSpec,
    TrialStatus,
)
from tuner.search import DraftCatalog, SearchSpace, build_space
from tuner.workers.simulated import PRESETS, WORKLOADS, ModelProfile, SimulatedEngine, WorkloadProfile

NOISE = 0.03
_NO_CATALOG = DraftCatalog()
REQUESTS = tuple(
    TrafficRequest(format=TrafficFormat.COMPLETIONS, prompt=f"request {i}: " + "lorem ipsum " * 40, output_tokens=256)
    for i in range(16)
)


def _space(model: str, config: dict | None, methods: Sequence[Method], drafts: dict) -> SearchSpace:
    """Every scenario's space: H100 on vLLM 0.34, the given drafts only, one ngram lookup window."""
    return build_space(
        model,
        config,
        hardware="h100",
        vllm_version="0.34.0",
        methods=methods,
        drafts=drafts,
        catalog=_NO_CATALOG,
        ngram_lookups=((2, 4),),
    )


def levels_for(concurrencies: Sequence[int]) -> tuple[LoadLevel, ...]:
    return tuple(LoadLevel(value=float(c), num_requests=max(16, 2 * c), warmup_requests=2) for c in concurrencies)


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "simulated" | "published" | "physics"
    description: str
    space: SearchSpace
    levels: tuple[LoadLevel, ...]
    engine: Callable[[int], Evaluator]  # seed -> noisy evaluator
    truth: Callable[[SpecConfig], dict[str, float] | None]  # noise-free per-level speedups, None = cannot run
    family: str = ""  # physics families (benchmarks/search_physics.py)
    held_out: bool = False  # run last, reported apart


def _sim_truth(model: ModelProfile, workload: WorkloadProfile, levels: tuple[LoadLevel, ...]):
    engine = SimulatedEngine(model, workload, noise=0.0, seed=0)
    base_spec = TrialSpec(model=ModelRef(model.name), spec=SpecConfig(), levels=levels, requests=REQUESTS)
    base = engine(base_spec)
    cache: dict[str, dict[str, float] | None] = {}

    def truth(spec: SpecConfig) -> dict[str, float] | None:
        key = spec.key()
        if key not in cache:
            r = engine(dataclasses.replace(base_spec, spec=spec, reference_outputs=base.reference_outputs))
            if r.status is not TrialStatus.SUCCEEDED:
                cache[key] = None
            else:
                cache[key] = {
                    lr.level.label: lr.output_throughput / base.level(lr.level.label).output_throughput
                    for lr in r.levels
                }
        return cache[key]

    return truth


def _sim(
    name: str,
    description: str,
    model: ModelProfile,
    workload: WorkloadProfile,
    methods: Sequence[Method],
    concurrencies: Sequence[int] = (1, 8, 32, 128),
    drafts: dict[Method, list[str]] | None = None,
    config: dict | None = None,
) -> Scenario:
    levels = levels_for(concurrencies)
    drafts = drafts if drafts is not None else {m: [f"draft/{m.value}"] for m in methods if m.needs_draft_checkpoint}
    space = _space(model.name, config, methods, drafts)
    return Scenario(
        name,
        "simulated",
        description,
        space,
        levels,
        engine=lambda seed: SimulatedEngine(model, workload, noise=NOISE, seed=seed),
        truth=_sim_truth(model, workload, levels),
    )


def _published(
    name: str,
    description: str,
    arms: Sequence[pub.PublishedArm],
    concurrencies: Sequence[int],
    config: dict | None = None,
) -> Scenario:
    levels = levels_for(concurrencies)
    methods = sorted({a.method for a in arms}, key=lambda m: m.value)
    drafts = {a.method: [a.draft] for a in arms if a.draft}
    space = _space(name, config, methods, drafts)
    truth_engine = pub.PublishedEngine(arms, noise=0.0)

    def truth(spec: SpecConfig) -> dict[str, float] | None:
        if not spec.is_off and truth_engine.arm(spec) is None:
            return None
        return {lv.label: truth_engine.expected_speedup(spec, lv) for lv in levels}

    return Scenario(
        name,
        "published",
        description,
        space,
        levels,
        engine=lambda seed: pub.PublishedEngine(arms, noise=NOISE, seed=seed),
        truth=truth,
    )


def _physics(family: phys.Family, member: tuple) -> Scenario:
    name, description, physics, concurrencies, noise, outliers = member
    levels = levels_for(concurrencies)
    methods = sorted({d.method for d in physics.drafters}, key=lambda m: m.value)
    drafts = {d.method: [d.draft] for d in physics.drafters if d.draft}
    config = DSV3_CONFIG if Method.MTP in methods else None
    space = _space(name, config, methods, drafts)

    def truth(spec: SpecConfig) -> dict[str, float] | None:
        if physics.runs(spec) is not None:
            return None
        return {lv.label: physics.speedup(spec, lv) for lv in levels}

    return Scenario(
        name,
        "physics",
        description,
        space,
        levels,
        engine=lambda seed: phys.PhysicsEngine(physics, noise=noise, outliers=outliers, seed=seed),
        truth=truth,
        family=family.name,
        held_out=family.held_out,
    )


def physics_scenarios() -> list[Scenario]:
    """The families whose physics is not the simulated engine's; the held-out family last."""
    fams = sorted(phys.families(), key=lambda f: f.held_out)
    return [_physics(f, m) for f in fams for m in f.members]


def _profile(name: str, **changes) -> ModelProfile:
    return dataclasses.replace(PRESETS[name], **changes)


DSV3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "num_nextn_predict_layers": 1,
}


def scenarios() -> list[Scenario]:
    E, E3, NG, SUF, MTP, DM, DF = (
        Method.EAGLE,
        Method.EAGLE3,
        Method.NGRAM,
        Method.SUFFIX,
        Method.MTP,
        Method.DRAFT_MODEL,
        Method.DFLASH,
    )
    return [
        _sim(
            "code-eagle3-c1-vs-off-c256",
            "code traffic on Llama-3.1-8B: deep EAGLE-3 at c1, off at c256",
            PRESETS["llama-3.1-8b"],
            WORKLOADS["code"],
            [E3],
            concurrencies=(1, 8, 64, 256),
        ),
        _sim(
            "summarisation-ngram",
            "summarisation on Llama-3.1-8B: prompt lookup copies the source",
            PRESETS["llama-3.1-8b"],
            WORKLOADS["summarisation"],
            [NG, SUF, E3],
        ),
        _sim(
            "deepseek-v3-native-mtp",
            "DeepSeek-V3 with one native MTP layer (read from config.json)",
            PRESETS["deepseek-v3-mtp"],
            WORKLOADS["chat"],
            [MTP, NG],
            config=DSV3_CONFIG,
        ),
        _sim(
            "eagle-crashes-at-start",
            "EAGLE-1 crashes at start; EAGLE-3 and ngram run",
            _profile("llama-3.1-8b", crashing=frozenset({E})),
            WORKLOADS["chat"],
            [E, E3, NG],
        ),
        _sim(
            "moe-eagle3-unsupported",
            "Qwen3-30B-A3B where eagle3 is refused at start (unsupported_config)",
            _profile("qwen3-moe-30b", unsupported=frozenset({E3})),
            WORKLOADS["chat"],
            [E3, NG, DM],
        ),
        _sim(
            "70b-eagle3-oom-above-4",
            "Llama-3.1-70B where EAGLE-3 runs out of memory above depth 4",
            _profile("llama-3.1-70b", max_depth_before_oom={E3: 4}),
            WORKLOADS["code"],
            [E3, NG],
        ),
        _sim(
            "writing-high-load",
            "creative writing at c32-c256: speculation barely pays",
            PRESETS["llama-3.1-8b"],
            WORKLOADS["writing"],
            [E3, NG],
            concurrencies=(32, 64, 128, 256),
        ),
        _sim(
            "gpt-oss-120b-moe-chat",
            "gpt-oss-120B (MoE): EAGLE-3 gains persist at high concurrency",
            PRESETS["gpt-oss-120b"],
            WORKLOADS["chat"],
            [E3, NG],
        ),
        _sim(
            "draft-model-diverges",
            "a draft model whose outputs diverge must never be recommended",
            _profile("llama-3.1-8b", diverging=frozenset({DM})),
            WORKLOADS["math"],
            [DM, E3],
        ),
        _sim(
            "moe-dflash-blocks",
            "Qwen3-30B-A3B with DFlash block sizes against EAGLE-3 and ngram",
            PRESETS["qwen3-moe-30b"],
            WORKLOADS["chat"],
            [DF, E3, NG],
        ),
        _sim(
            "70b-code-edit-suffix",
            "code editing on Llama-3.1-70B: ngram, suffix and EAGLE-3",
            PRESETS["llama-3.1-70b"],
            WORKLOADS["code-edit"],
            [NG, SUF, E3],
        ),
        _published(
            "published-e3-sglang-h100",
            "EAGLE-1 vs EAGLE-3, Llama-3.1-8B, SGLang H100 (E3), bs 2-64",
            pub.E3_SGLANG_H100,
            (2, 8, 16, 24, 32, 64),
        ),
        _published(
            "published-e3-vllm-a100",
            "EAGLE-1 vs EAGLE-3, Llama-3.1-8B, vLLM A100 (E3), bs 2-56",
            pub.E3_VLLM_A100,
            (2, 16, 32, 56),
        ),
        _published(
            "published-ngram-scout-b200",
            "n-gram, Llama-4-Scout, B200 (TRT-NG), bs 1/4/32",
            pub.NGRAM_SCOUT_B200,
            (1, 4, 32),
        ),
        _published(
            "published-mtp-dsv3-mi300x",
            "MTP, DeepSeek-V3, 8xMI300X (ROCm-MTP), c1-64",
            pub.MTP_DSV3_MI300X,
            (1, 2, 4, 8, 16, 32, 64),
            config=DSV3_CONFIG,
        ),
        _published(
            "published-e31-kimi-gb200", "EAGLE-3.1, Kimi-K2.6, GB200 TP4 (E31), c1/4/16", pub.E31_KIMI_GB200, (1, 4, 16)
        ),
        _published(
            "published-dspark-adaptive-mi350x",
            "DSpark fixed K vs adaptive verification, DeepSeek-V4-Flash, MI350X (V52362), c4/64/256",
            pub.DSPARK_DSV4_MI350X,
            (4, 64, 256),
        ),
    ]
