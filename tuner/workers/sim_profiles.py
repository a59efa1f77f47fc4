"""Profiles the simulated engine reads: what a model costs per step and what a workload looks like.

Defaults are fitted to public figures (``docs/published-figures.md``): the target step cost is
SpecDecode-Bench's fitted Llama-3.1-8B/H100 predictor (5.89 ms + 21.0 us per batched token + 0.039 us per KV
token), extended with a compute knee (beyond it the GPU is compute bound and a batched token costs more) so
that dense verification gets expensive at batch 32-64 while a MoE, whose knee sits E/topk times later in
batched tokens, keeps its gains to c200+.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.domain import Method, TrafficRequest
from tuner.domain.model_traits import model_traits
from tuner.domain.prompt_kind import CHARS_PER_TOKEN, prompt_kind, repetitiveness


@dataclass(frozen=True)
class WorkloadProfile:
    """What the traffic looks like to a drafter.

    ``ngram_match`` is P(an n-gram/suffix proposal exists at a decode step) (0.1-0.25 chat, 0.4
    summarisation, 0.8 code edit); ``acceptance_shift`` is added to a_1 of learned drafters (code +0.1,
    writing -0.15), later positions follow from a_1.
    """

    name: str
    prompt_tokens: float
    output_tokens: float
    ngram_match: float
    acceptance_shift: float = 0.0

    @property
    def context_tokens(self) -> float:
        """Mean KV length of a decoding request: the prompt and half the output."""
        return self.prompt_tokens + self.output_tokens / 2.0

    @classmethod
    def from_requests(cls, requests: Sequence[TrafficRequest]) -> WorkloadProfile:
        """Heuristics on a traffic sample: repetitiveness, code-like text, length bands, keywords."""
        if not requests:
            return WORKLOADS["chat"]
        texts = [r.prompt_text() for r in requests]
        prompt = sum(len(t) for t in texts) / len(texts) / CHARS_PER_TOKEN
        output = sum(r.target_output_tokens for r in requests) / len(requests)
        # Classify each request on its own and take the majority: one "summarise" among 64 chat prompts does
        # not make the sample summarisation. Repetition is within a request (what prompt lookup can copy).
        kinds = [prompt_kind(t, r.target_output_tokens) for t, r in zip(texts, requests, strict=True)]
        name = max(set(kinds), key=lambda k: (kinds.count(k), k))
        base = sum(_KIND_BASE[k][0] for k in kinds) / len(kinds)
        shift = _KIND_BASE[name][1]
        rep = sum(repetitiveness(t) for t in texts) / len(texts)
        match = min(0.9, max(0.05, base + 0.6 * rep))
        return cls(name, round(prompt, 1), round(output, 1), round(match, 3), shift)


_KIND_BASE = {  # P(an n-gram match) before repetition, acceptance shift of learned drafters
    "code": (0.45, 0.10),
    "summarisation": (0.40, 0.0),
    "math": (0.25, 0.05),
    "writing": (0.10, -0.15),
    "chat": (0.18, 0.0),
}


WORKLOADS: dict[str, WorkloadProfile] = {
    "chat": WorkloadProfile("chat", 300, 350, 0.18, 0.0),
    "code": WorkloadProfile("code", 900, 400, 0.55, 0.10),
    "code-edit": WorkloadProfile("code-edit", 1500, 600, 0.80, 0.10),
    "summarisation": WorkloadProfile("summarisation", 3000, 250, 0.40, 0.0),
    "math": WorkloadProfile("math", 300, 600, 0.25, 0.05),
    "writing": WorkloadProfile("writing", 200, 800, 0.10, -0.15),
}


@dataclass(frozen=True)
class ModelProfile:
    """Step costs and behaviour of one target model on one GPU setup.

    Target step (ms) = ``target_step_ms`` + ``per_token_us`` x batched tokens + ``over_knee_us`` x tokens
    beyond the compute knee + ``per_kv_token_us`` x KV tokens (+ for a MoE, ``expert_load_ms`` x the extra
    share of experts the batch touches). ``method_draft_cost`` is the draft cost per token as a fraction of a
    bs1 step; ``method_acceptance`` overrides the conditional acceptance per position (chat baseline; the
    workload shift is added to every position).
    """

    name: str
    moe: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    target_step_ms: float = 5.89
    per_token_us: float = 21.0
    per_kv_token_us: float = 0.039
    mtp_layers: int = 0
    method_acceptance: Mapping[Method, tuple[float, ...]] = field(default_factory=dict)
    method_draft_cost: Mapping[Method, float] = field(default_factory=dict)
    unsupported: frozenset[Method] = frozenset()
    crashing: frozenset[Method] = frozenset()
    max_depth_before_oom: Mapping[Method, int] = field(default_factory=dict)
    diverging: frozenset[Method] = frozenset()
    # Beyond the published names: the compute knee, MoE expert loading and vLLM's spec overhead.
    compute_knee_tokens: float = 96.0  # dense batched tokens where the step turns compute bound
    over_knee_us: float = 35.0  # extra cost per batched token beyond the knee
    expert_load_ms: float = 0.0  # MoE: reading every routed expert once (bs1 already pays topk/E of it)
    expert_locality: float = 0.5  # MoE: share of a request's draft tokens routed like its previous token
    spec_overhead: tuple[float, float] = (0.064, 0.001)  # K=0 cost: fraction of a step, + per sequence
    draft_cost_scale: float = 1.0  # < 1 for large targets, where a drafter is a smaller share of a step
    acceptance_scale: Mapping[Method, float] = field(default_factory=dict)  # e.g. a collapsing attention backend
    kv_capacity_tokens: int = 450_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "method_acceptance", {Method(k): tuple(v) for k, v in self.method_acceptance.items()})
        object.__setattr__(self, "method_draft_cost", {Method(k): float(v) for k, v in self.method_draft_cost.items()})
        object.__setattr__(self, "acceptance_scale", {Method(k): float(v) for k, v in self.acceptance_scale.items()})
        object.__setattr__(
            self, "max_depth_before_oom", {Method(k): int(v) for k, v in self.max_depth_before_oom.items()}
        )
        for name in ("unsupported", "crashing", "diverging"):
            object.__setattr__(self, name, frozenset(Method(m) for m in getattr(self, name)))

    @property
    def knee_tokens(self) -> float:
        """Batched tokens at the compute knee: a MoE spreads them over E experts, topk per token."""
        if self.moe and self.num_experts and self.experts_per_token:
            return self.compute_knee_tokens * self.num_experts / self.experts_per_token
        return self.compute_knee_tokens

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, gpus: int | None = None) -> ModelProfile:
        """A profile from a Hugging Face ``config.json``: dense or MoE, size, KV width, native MTP heads.

        Costs scale the 8B/H100 fit by bytes of weights read (memory bound at small batch) and active
        parameters (compute); ``gpus`` (tensor parallel) defaults to the fewest 80 GB GPUs that hold the
        weights with room for the KV cache.
        """
        cfg = dict(config)
        text = cfg.get("text_config")
        if isinstance(text, Mapping):
            cfg = {**cfg, **text}
        hidden = float(cfg.get("hidden_size") or 4096)
        layers = float(cfg.get("num_hidden_layers") or 32)
        inter = float(cfg.get("intermediate_size") or hidden * 3.5)
        vocab = float(cfg.get("vocab_size") or 128_000)
        heads = float(cfg.get("num_attention_heads") or 32)
        kv_heads = float(cfg.get("num_key_value_heads") or heads)
        head_dim = float(cfg.get("head_dim") or hidden / heads)
        traits = model_traits(config)
        experts, topk = traits.num_experts or 0, traits.experts_per_token or 0
        moe = experts > 1 and topk > 0
        attn = layers * hidden * (2 * hidden + 2 * kv_heads * head_dim)
        embed = 2 * vocab * hidden
        if moe:
            expert = 3 * hidden * float(cfg.get("moe_intermediate_size") or inter) * layers
            dense = attn + embed + float(cfg.get("n_shared_experts") or 0) * expert
            active, routed = dense + topk * expert, experts * expert
        else:
            active, routed = attn + embed + 3 * hidden * inter * layers, 0.0
        width = weight_bytes(cfg)
        total = (active if not moe else active - topk * expert + routed) * width
        if gpus is None:
            gpus = 2 ** max(0, math.ceil(math.log2(max(1.0, total / (0.7 * 80e9)))))
        kv_per_token = 2 * layers * kv_heads * head_dim * 2
        if cfg.get("kv_lora_rank"):  # MLA caches one compressed latent per layer
            kv_per_token = layers * (float(cfg["kv_lora_rank"]) + float(cfg.get("qk_rope_head_dim") or 64)) * 2
        read_ms = 4.8 / 16e9 / gpus  # H100: 16 GB of bf16 8B weights read in ~4.8 ms
        return cls(
            name=str(cfg.get("_name_or_path") or cfg.get("model_type") or "hf-model"),
            moe=moe,
            num_experts=experts if moe else 0,
            experts_per_token=topk if moe else 0,
            target_step_ms=round(1.09 + active * width * read_ms + 0.03 * layers * math.log2(gpus), 3),
            per_token_us=round(21.0 * active / 8.0e9 / gpus, 3),
            per_kv_token_us=round(0.039 * kv_per_token / 131_072 / gpus, 5),
            mtp_layers=traits.mtp_layers,
            compute_knee_tokens=round(96.0 * 2.0 / width, 1),
            over_knee_us=round(35.0 * active / 8.0e9 / gpus, 3),
            expert_load_ms=round((routed - topk * expert) * width * read_ms, 3) if moe else 0.0,
            draft_cost_scale=round(min(1.0, max(0.3, math.sqrt(8.0e9 / active))), 3),
            kv_capacity_tokens=int(max(10_000, (0.9 * 80e9 * gpus - total) / kv_per_token)),
        )


def weight_bytes(config: Mapping[str, Any]) -> float:
    """Bytes per weight from ``quantization_config`` (bf16 when absent)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return 2.0
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if bits:
        return float(bits) / 8.0
    if any(m in method for m in ("mxfp4", "nvfp4", "awq", "gptq", "fp4", "int4")):
        return 0.5
    if any(m in method for m in ("fp8", "int8", "compressed")):
        return 1.0
    return 2.0


PRESETS: dict[str, ModelProfile] = {
    # SpecDecode-Bench's fitted H100 predictor, as is.
    "llama-3.1-8b": ModelProfile("llama-3.1-8b"),
    "llama-3.1-70b": ModelProfile(
        "llama-3.1-70b",
        target_step_ms=14.0,
        per_token_us=46.0,
        per_kv_token_us=0.04,
        draft_cost_scale=0.4,
        kv_capacity_tokens=900_000,
    ),
    # 30B-A3B: 128 experts, 8 per token; ~60 GB of experts in bf16 on one H100.
    "qwen3-moe-30b": ModelProfile(
        "qwen3-moe-30b",
        moe=True,
        num_experts=128,
        experts_per_token=8,
        target_step_ms=4.6,
        per_token_us=8.0,
        per_kv_token_us=0.029,
        expert_load_ms=9.0,
        draft_cost_scale=0.9,
        kv_capacity_tokens=250_000,
    ),
    # 671B-A37B on 8 GPUs with one native MTP layer, fitted to ROCm-MTP (8xMI300X, SGLang): MLA KV.
    "deepseek-v3-mtp": ModelProfile(
        "deepseek-v3-mtp",
        moe=True,
        num_experts=256,
        experts_per_token=8,
        target_step_ms=10.0,
        per_token_us=90.0,
        per_kv_token_us=0.012,
        mtp_layers=1,
        expert_load_ms=8.0,
        draft_cost_scale=0.5,
        kv_capacity_tokens=1_200_000,
    ),
    # 21B-A3.6B, MXFP4 experts: 32 experts, 4 per token.
    "gpt-oss-20b": ModelProfile(
        "gpt-oss-20b",
        moe=True,
        num_experts=32,
        experts_per_token=4,
        target_step_ms=3.6,
        per_token_us=9.0,
        per_kv_token_us=0.02,
        expert_load_ms=3.0,
        compute_knee_tokens=96.0,
        kv_capacity_tokens=600_000,
    ),
    "gpt-oss-120b": ModelProfile(
        "gpt-oss-120b",
        moe=True,
        num_experts=128,
        experts_per_token=4,
        target_step_ms=6.0,
        per_token_us=13.0,
        per_kv_token_us=0.025,
        expert_load_ms=12.0,
        draft_cost_scale=0.7,
        kv_capacity_tokens=500_000,
    ),
}
