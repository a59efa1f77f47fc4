"""The traits of a target model read off its Hugging Face ``config.json`` dict: architecture, dense or MoE,
vocabulary, native MTP layers, family. One reader for the search space and the simulated engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Keys vLLM reads for native MTP layers (vllm/config/speculative.py, see docs/vllm-facts.md).
MTP_KEYS: tuple[str, ...] = (
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "num_mtp_modules",
    "num_mtp_layers",
)
_EXPERT_KEYS: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS: tuple[str, ...] = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k_experts")
# Family tags the draft catalog is keyed on, matched against model_type / architecture / name.
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("deepseek", ("deepseek",)),
    ("kimi", ("kimi", "moonshot")),
    ("minimax", ("minimax",)),
    ("qwen", ("qwen",)),
    ("gemma", ("gemma",)),
    ("llama", ("llama",)),
    ("glm", ("glm", "chatglm")),
    ("gpt-oss", ("gpt_oss", "gpt-oss", "gptoss")),
    ("mistral", ("mistral", "mixtral")),
)


@dataclass(frozen=True)
class ModelTraits:
    """What the search space needs to know about the target model."""

    architecture: str | None
    model_type: str | None
    moe: bool
    vocab_size: int | None
    mtp_layers: int
    family: str | None
    num_experts: int | None = None
    experts_per_token: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    mla: bool = False  # multi-head latent attention (DeepSeek, Kimi): MLA attention backends


def model_traits(config: Mapping[str, Any], model: str | None = None) -> ModelTraits:
    """Architecture, dense or MoE, vocab size and native MTP layers from a ``config.json`` dict.

    Multimodal wrappers keep the language model under ``text_config`` (Kimi K3, Gemma, Qwen-VL): its keys
    are read when the top level lacks them.
    """
    nested = config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}

    def get(key: str) -> Any:
        value = config.get(key)
        return text.get(key) if value is None else value

    archs = config.get("architectures") or text.get("architectures") or []
    architecture = archs[0] if archs else None
    model_type = get("model_type")
    experts = next((int(get(k)) for k in _EXPERT_KEYS if isinstance(get(k), int) and get(k) > 0), None)
    topk = next((int(get(k)) for k in _TOPK_KEYS if isinstance(get(k), int) and get(k) > 0), None)
    mtp = _mtp_layers(config) or _mtp_layers(text)
    vocab = get("vocab_size")
    return ModelTraits(
        architecture=architecture,
        model_type=model_type,
        moe=bool(experts and experts > 1),
        vocab_size=int(vocab) if isinstance(vocab, int) else None,
        mtp_layers=mtp,
        family=_family(architecture, model_type, model or config.get("_name_or_path")),
        num_experts=experts,
        experts_per_token=topk,
        hidden_size=get("hidden_size"),
        num_layers=get("num_hidden_layers"),
        # vLLM 0.32's is_deepseek_mla: a DeepSeek-style model_type with a latent KV rank (most carry one)
        mla=isinstance(get("kv_lora_rank"), int) and get("kv_lora_rank") > 0,
    )


def _mtp_layers(config: Mapping[str, Any]) -> int:
    for key in MTP_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    nested = config.get("mtp_config")
    if isinstance(nested, Mapping):
        value = nested.get("num_nextn_predict_layers")
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _family(*names: Any) -> str | None:
    hay = " ".join(str(n).lower() for n in names if n)
    for family, needles in _FAMILIES:
        if any(n in hay for n in needles):
            return family
    return None
