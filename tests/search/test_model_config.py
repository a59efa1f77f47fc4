import json

from tuner.search import model_traits, read_model_config

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096}
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "num_nextn_predict_layers": 1,
}


def test_reads_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert read_model_config(str(tmp_path)) == LLAMA


def test_reads_the_hf_cache_snapshot_pointed_to_by_refs_main(tmp_path):
    repo = tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct"
    for rev, vocab in (("aaa", 1), ("bbb", 2)):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text(json.dumps({**LLAMA, "vocab_size": vocab}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa")
    cfg = read_model_config("meta-llama/Llama-3.1-8B-Instruct", hf_cache=tmp_path)
    assert cfg["vocab_size"] == 1
    assert read_model_config("meta-llama/Llama-3.1-8B-Instruct", hf_cache=tmp_path, revision="bbb")["vocab_size"] == 2


def test_falls_back_to_the_supplied_config_and_never_the_network(tmp_path):
    assert read_model_config("org/absent", hf_cache=tmp_path) is None
    assert read_model_config("org/absent", hf_cache=tmp_path, supplied=DSV3) == DSV3


def test_traits_dense_and_moe_with_mtp():
    dense = model_traits(LLAMA, "meta-llama/Llama-3.1-8B-Instruct")
    assert (dense.moe, dense.mtp_layers, dense.vocab_size, dense.family) == (False, 0, 128256, "llama")
    moe = model_traits(DSV3)
    assert moe.moe and moe.num_experts == 256 and moe.experts_per_token == 8
    assert moe.mtp_layers == 1 and moe.family == "deepseek" and moe.architecture == "DeepseekV3ForCausalLM"


def test_traits_read_every_mtp_key_and_nested_text_config():
    assert (
        model_traits(
            {"model_type": "qwen3_5_moe", "mtp_num_hidden_layers": 1, "num_experts": 512, "num_experts_per_tok": 10}
        ).mtp_layers
        == 1
    )
    assert model_traits({"model_type": "minimax_m3", "num_mtp_modules": 3}).mtp_layers == 3
    assert model_traits({"model_type": "inkling", "mtp_config": {"num_nextn_predict_layers": 2}}).mtp_layers == 2
    kimi = model_traits(
        {
            "architectures": ["KimiK3ForConditionalGeneration"],
            "text_config": {
                "model_type": "kimi_k3",
                "num_nextn_predict_layers": 1,
                "vocab_size": 163840,
                "n_routed_experts": 384,
                "num_experts_per_tok": 8,
            },
        }
    )
    assert kimi.mtp_layers == 1 and kimi.moe and kimi.vocab_size == 163840 and kimi.family == "kimi"
