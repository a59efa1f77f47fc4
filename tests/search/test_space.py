from tuner.domain import Method, parse_version
from tuner.search import DEFAULT_CATALOG, DraftCatalog, DraftEntry, build_space, mtp_depths

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
DSV3 = {"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "num_nextn_predict_layers": 1}


def keys(space):
    return [o.key for o in space.options]


def test_defaults_off_ngram_suffix_and_catalogued_drafts():
    space = build_space("meta-llama/Llama-3.1-8B-Instruct", LLAMA, hardware="h100", vllm_version="0.34.0")
    assert keys(space)[:3] == ["off", "ngram", "suffix"]
    eagle3 = [o for o in space.options if o.method is Method.EAGLE3]
    assert eagle3 and all(o.source == "catalog" and o.verified is False and o.source_url for o in eagle3)
    ngram = space.option("ngram")
    assert ngram.depths == tuple(range(1, 9)) and ngram.lookups
    assert space.grid_size == sum(len(o.depths) * max(1, len(o.lookups)) for o in space.options)


def test_every_catalog_entry_has_a_source_and_is_unverified():
    assert len({e.method for e in DEFAULT_CATALOG.entries}) >= 3
    families = {e.family for e in DEFAULT_CATALOG.entries}
    assert {"qwen", "gemma", "kimi", "minimax", "llama", "deepseek"} <= families
    assert all(e.source.startswith("https://") and not e.verified for e in DEFAULT_CATALOG.entries)


def test_request_drafts_come_first_and_catalog_is_extendable():
    cat = DraftCatalog().extended(
        [{"method": "dflash", "checkpoint": "me/dflash", "targets": ["*my-model*"], "source": "https://example.org"}]
    )
    space = build_space(
        "org/my-model",
        LLAMA,
        hardware="h100",
        vllm_version="0.34.0",
        catalog=cat,
        drafts={Method.EAGLE3: ["me/eagle3"]},
    )
    assert "eagle3@me/eagle3" in keys(space) and "dflash@me/dflash" in keys(space)
    assert space.option("dflash@me/dflash").depths == (4, 8, 16)
    assert isinstance(cat.entries[0], DraftEntry)


def test_mtp_from_config_with_depths_the_layers_allow():
    space = build_space("deepseek-ai/DeepSeek-V3", DSV3, hardware="mi300x", vllm_version="0.34.0")
    assert space.option("mtp").depths == tuple(range(1, 9))
    assert mtp_depths(3) == (1, 2, 3, 6)
    assert mtp_depths(2) == (1, 2, 4, 6, 8)
    none = build_space(
        "meta-llama/Llama-3.1-8B-Instruct", LLAMA, hardware="h100", vllm_version="0.34.0", methods=[Method.MTP]
    )
    assert keys(none) == ["off"] and none.excluded[0].method is Method.MTP


GEMMA4 = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {"vocab_size": 262144},
}


def test_gemma4_gets_its_mtp_assistant_from_the_catalog_or_the_request():
    space = build_space("google/gemma-4-31B-it", GEMMA4, hardware="mi355x", vllm_version="0.34.0")
    assistant = space.option("mtp@google/gemma-4-31B-it-assistant")
    assert assistant.source == "catalog" and assistant.verified is False and assistant.depths == tuple(range(1, 9))
    assert assistant.spec(3).to_vllm() == {
        "method": "mtp",
        "model": "google/gemma-4-31B-it-assistant",
        "num_speculative_tokens": 3,
    }
    assert "mtp" not in keys(space)  # no native heads in the target itself
    own = build_space(
        "/models/gemma-4-31b-it-ft",
        GEMMA4,
        hardware="mi300x",
        vllm_version="0.34.0",
        drafts={Method.MTP: ["/models/gemma-4-31b-it-assistant"]},
    )
    assert own.option("mtp@/models/gemma-4-31b-it-assistant").source == "request"
    assert own.option("mtp@google/gemma-4-31B-it-assistant") is None  # the catalog's pattern wants the base id


def test_version_and_hardware_filters_are_overridable():
    medusa = build_space(
        "m",
        LLAMA,
        hardware="h100",
        vllm_version="0.33.0",
        methods=[Method.MEDUSA],
        drafts={Method.MEDUSA: ["x/medusa"]},
    )
    assert "medusa" not in " ".join(keys(medusa)) and "removed in vLLM 0.33" in medusa.excluded[0].reason
    old = build_space(
        "m",
        LLAMA,
        hardware="cpu",
        vllm_version="0.32.0+cpu",
        methods=[Method.MEDUSA],
        drafts={Method.MEDUSA: ["x/medusa"]},
    )
    assert "medusa@x/medusa" in keys(old)
    rocm = build_space("m", LLAMA, hardware="rocm-mi300x", vllm_version="0.33.0")
    assert "suffix" not in keys(rocm) and any(e.method is Method.SUFFIX for e in rocm.excluded)
    forced = build_space(
        "m",
        LLAMA,
        hardware="rocm-mi300x",
        vllm_version="0.33.0",
        compat_overrides={Method.SUFFIX: True, Method.NGRAM: "broken on this cluster"},
    )
    assert "suffix" in keys(forced) and "ngram" not in keys(forced)
    assert parse_version("0.32.0+cpu") == (0, 32, 0)


def test_depth_range_and_method_restriction():
    space = build_space(
        "m",
        LLAMA,
        hardware="h100",
        vllm_version=None,
        methods=[Method.NGRAM],
        depth_range=(2, 4),
        ngram_lookups=[(2, 4)],
    )
    assert keys(space) == ["off", "ngram"] and space.option("ngram").depths == (2, 3, 4)
    assert space.grid_size == 4


def test_server_rules_come_first_and_can_allow_or_exclude(tmp_path):
    import json

    import pytest

    from tuner.search import DEFAULT_RULES, load_rules

    path = tmp_path / "compat.json"
    path.write_text(
        json.dumps(
            [
                {"method": "eagle3", "hardware": "*mi355x*", "below_vllm": "0.35", "reason": "diverges (INC-1)"},
                {"method": "suffix", "hardware": "rocm*", "allow": True, "reason": "arctic-inference for ROCm"},
            ]
        )
    )
    rules = (*load_rules(path), *DEFAULT_RULES)
    space = build_space(
        "meta-llama/Llama-3.1-8B-Instruct", LLAMA, hardware="rocm-mi355x", vllm_version="0.34.0", rules=rules
    )
    assert "suffix" in keys(space)  # the server's allow rule shadows the built-in ROCm exclusion
    assert not any(k.startswith("eagle3") for k in keys(space))
    assert any(e.method is Method.EAGLE3 and e.reason == "diverges (INC-1)" for e in space.excluded)
    newer = build_space(
        "meta-llama/Llama-3.1-8B-Instruct", LLAMA, hardware="rocm-mi355x", vllm_version="0.35.0", rules=rules
    )
    assert any(k.startswith("eagle3") for k in keys(newer))  # the rule's version window has passed

    bad = {
        '{"method": "eagle3"}': "expected a JSON list",
        '[{"method": "warp", "reason": "x"}]': "entry 0: unknown method 'warp'",
        '[{"method": "ngram", "reason": "x", "hw": "*"}]': "entry 0: unknown field(s) hw",
        '[{"method": "ngram", "reason": "x"}, {"method": "ngram"}]': "entry 1: 'reason' must be a non-empty string",
        '[{"method": "ngram", "reason": "x", "allow": "yes"}]': "'allow' must be true or false",
        "[{": "compat rules file",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_rules(path)
