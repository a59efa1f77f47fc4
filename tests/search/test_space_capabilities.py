"""The space built for a worker's probed vLLM: which names exist, which options each method may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.domain import Method
from tuner.search import build_space
from tuner.search.compat import ADAPTIVE, BATCH_SCHEDULE, CompatRule, load_rules, option_refusal
from tuner.workers.vllm_probe import probe_source

SOURCES = Path(__file__).parents[1] / "workers" / "fixtures" / "vllm_source"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
ALL = [Method.NGRAM, Method.SUFFIX, Method.DSPARK, Method.DFLASH, Method.MEDUSA, Method.EAGLE3]
DRAFTS = {Method.DFLASH: ["org/dflash"], Method.MEDUSA: ["org/medusa"], Method.EAGLE3: ["org/eagle3"]}


def caps(version: str, **kw):
    return probe_source(SOURCES / version / "vllm", **kw)


def space_for(version: str, hardware: str = "mi300x", **kw):
    c = caps(version, arctic_inference=False)
    return build_space(
        "m", LLAMA, hardware=hardware, vllm_version=None, methods=ALL, drafts=DRAFTS, capabilities=c, **kw
    )


def excluded(space) -> dict[Method, str]:
    return {e.method: e.reason for e in space.excluded}


def test_names_the_vllm_lacks_are_left_out_with_its_version():
    old = space_for("0.11.0")
    gone = excluded(old)
    assert {Method.SUFFIX, Method.DSPARK, Method.DFLASH} <= set(gone)
    assert "vLLM 0.11.0 does not accept method 'dflash'" in gone[Method.DFLASH]
    assert old.vllm_version == "0.11.0"  # taken from the capabilities when the caller has none
    assert old.schedule_field is None and "no per-batch-size schedule field" in old.schedule_refusal
    new = space_for("0.34.0")
    assert Method.MEDUSA in excluded(new) and Method.DFLASH not in excluded(new)


def test_suffix_without_its_package_is_left_out_but_a_job_may_insist():
    assert "arctic-inference" in excluded(space_for("0.33.0", hardware="h100"))[Method.SUFFIX]
    forced = space_for("0.33.0", hardware="h100", compat_overrides={Method.SUFFIX: True})
    assert forced.option("suffix") is not None


def test_unknown_names_are_reported_never_searched():
    space = space_for("0.34.0")
    note = next(n for n in space.notes if "does not know" in n)
    assert "extract_hidden_states" in note and "*_mtp aliases" in note and "deepseek_mtp" in note
    assert {o.method.value for o in space.options} <= {m.value for m in Method}


def test_adaptive_verification_follows_the_table_per_version_and_chip():
    on = {(v.method, v.option): v.reason for v in space_for("0.34.0").option_verdicts}
    assert on[(Method.DSPARK, ADAPTIVE)] is None
    assert "no compat rule" in on[(Method.EAGLE3, ADAPTIVE)] and "no compat rule" in on[(Method.NGRAM, ADAPTIVE)]
    cpu = {(v.method, v.option): v.reason for v in space_for("0.34.0", hardware="cpu").option_verdicts}
    assert "CUDA graphs" in cpu[(Method.DSPARK, ADAPTIVE)]
    # after 0.34 vLLM's docs add EAGLE, MTP, DFlash, draft models and suffix (not ngram)
    assert option_refusal(Method.EAGLE3, ADAPTIVE, hardware="mi355x", vllm_version="0.35.0") is None
    assert option_refusal(Method.NGRAM, ADAPTIVE, hardware="mi355x", vllm_version="0.35.0") is not None
    # a vLLM whose config has no such field cannot be asked, whatever the table says
    old = {(v.method, v.option): v.reason for v in space_for("0.11.0").option_verdicts}
    assert old[(Method.NGRAM, ADAPTIVE)] is not None


def test_schedule_is_refused_with_data_parallelism_and_for_methods_the_runner_ignores_it_for():
    dp = space_for("0.34.0", data_parallel_size=2)
    assert "data parallelism" in dp.schedule_refusal
    assert dp.option_refusal(Method.NGRAM, BATCH_SCHEDULE) == dp.schedule_refusal
    single = space_for("0.34.0")
    assert single.schedule_refusal is None and single.option_refusal(Method.NGRAM, BATCH_SCHEDULE) is None
    assert "per-batch-size" in single.option_refusal(Method.DSPARK, BATCH_SCHEDULE)
    rule = CompatRule(Method.NGRAM, "our runner ignores dynamic K here", "mi355x", option=BATCH_SCHEDULE)
    assert option_refusal(Method.NGRAM, BATCH_SCHEDULE, hardware="mi355x", vllm_version="0.34", rules=[rule])


def test_option_rules_load_from_a_file_and_bad_options_are_named(tmp_path):
    good = tmp_path / "rules.json"
    good.write_text('[{"method": "eagle3", "option": "adaptive_verification", "allow": true, "reason": "ours"}]')
    (rule,) = load_rules(good)
    assert option_refusal(Method.EAGLE3, ADAPTIVE, hardware="h100", vllm_version="0.34", rules=[rule]) is None
    bad = tmp_path / "bad.json"
    bad.write_text('[{"method": "eagle3", "option": "warp_speed", "reason": "x"}]')
    with pytest.raises(ValueError, match="entry 0: 'option' must be one of"):
        load_rules(bad)
