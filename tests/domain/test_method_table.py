"""Every method walked through every reader of the method table: the search space, the API's schema, the
simulated engine's cost and refusals. A new row in METHOD_TRAITS that a reader mishandles fails here."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tuner.api.schemas import SearchIn
from tuner.domain import (
    DEFAULT_DEPTH_RANGE,
    DRAFT_METHODS,
    METHOD_TRAITS,
    DepthRule,
    DraftNeed,
    FailureClass,
    LoadLevel,
    Method,
    ModelRef,
    Proposer,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialSpec,
    TrialStatus,
)
from tuner.search import build_space
from tuner.search.compat import excluded_reason
from tuner.workers import sim_model
from tuner.workers.simulated import PRESETS, SimulatedEngine

SPECULATIVE = [m for m in Method if m is not Method.OFF]
# A config with two native MTP heads, so mtp has the target's own arm as well as a separate checkpoint.
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_nextn_predict_layers": 2}


def _version(method: Method) -> str:
    """A vLLM the compat table lets the method run on (medusa left vLLM in 0.33)."""
    return "0.32.0" if method is Method.MEDUSA else "0.34.0"


def test_the_table_has_a_row_for_every_method_and_only_consistent_rows() -> None:
    assert set(METHOD_TRAITS) == set(Method)
    for method, t in METHOD_TRAITS.items():
        assert (t.proposer is Proposer.NONE) == (method is Method.OFF)
        assert (t.depth_rule is DepthRule.BLOCK_SIZE) <= (t.proposer is Proposer.BLOCK)
        assert (t.depth_rule is DepthRule.BLOCK_SIZE) <= bool(t.default_depths)
        assert t.prompt_lookup <= (t.proposer is Proposer.LOOKUP)
    assert DRAFT_METHODS == tuple(m for m in METHOD_TRAITS if METHOD_TRAITS[m].draft is not DraftNeed.NONE)


@pytest.mark.parametrize("method", SPECULATIVE, ids=str)
def test_the_search_space_offers_each_method_as_its_row_says(method: Method) -> None:
    t = method.traits
    drafts = {method: ["org/draft"]} if method.takes_draft_checkpoint else None
    space = build_space(
        "org/model", CONFIG, hardware="h100", vllm_version=_version(method), methods=[method], drafts=drafts
    )
    assert excluded_reason(method, hardware="h100", vllm_version=_version(method)) is None
    arms = [o for o in space.options if o.method is method]
    assert arms, f"{method} not offered: {space.excluded}"
    for arm in arms:
        # an adaptive-verification arm trims the verified tokens per request: not fixed length
        assert arm.fixed_length == (t.proposer in (Proposer.CHAIN, Proposer.BLOCK) and not arm.adaptive)
        assert bool(arm.lookups) == t.prompt_lookup
        assert (arm.draft is not None) <= method.takes_draft_checkpoint
        if t.depth_rule is DepthRule.BLOCK_SIZE or (t.default_depths and arm.draft is None):
            assert arm.depths == t.default_depths
        elif t.depth_rule is DepthRule.MTP_LAYERS and arm.source == "target":
            assert arm.depths == (1, 2, 4, 6, 8)
        else:
            assert arm.depths == tuple(range(DEFAULT_DEPTH_RANGE[0], DEFAULT_DEPTH_RANGE[1] + 1))
    if t.draft is DraftNeed.REQUIRED:
        bare = build_space("org/model", CONFIG, hardware="h100", vllm_version=_version(method), methods=[method])
        assert not [o for o in bare.options if o.method is method]
        assert any(e.method is method for e in bare.excluded)


def test_methods_searched_by_default_are_the_rows_that_say_so() -> None:
    drafts = {m: ["org/draft"] for m in DRAFT_METHODS}
    space = build_space("org/model", CONFIG, hardware="h100", vllm_version="0.32.0", drafts=drafts)
    offered = {o.method for o in space.options}
    excluded = {e.method for e in space.excluded}
    for method in SPECULATIVE:
        if method.traits.searched_by_default:
            assert method in offered | excluded
        else:
            assert method not in offered


@pytest.mark.parametrize("method", SPECULATIVE, ids=str)
def test_the_api_takes_a_draft_checkpoint_exactly_where_the_row_allows_one(method: Method) -> None:
    if method.takes_draft_checkpoint:
        assert SearchIn(drafts={method: ["org/draft"]}).drafts == {method: ["org/draft"]}
    else:
        with pytest.raises(ValidationError, match="takes no draft checkpoint"):
            SearchIn(drafts={method: ["org/draft"]})


@pytest.mark.parametrize("method", SPECULATIVE, ids=str)
def test_the_simulated_drafter_costs_what_its_proposer_kind_costs(method: Method) -> None:
    model = PRESETS["llama-3.1-8b"]
    cost = {k: sim_model.draft_ms(model, SpecConfig(method, k), k, 8.0, 512.0, 10.0, False) for k in (2, 4)}
    if method.traits.proposer is Proposer.CHAIN:
        assert cost[4] == pytest.approx(2 * cost[2])  # one pass per drafted token
    else:
        assert cost[4] == pytest.approx(cost[2])  # one pass (block) or a lookup, whatever k


@pytest.mark.parametrize("method", SPECULATIVE, ids=str)
def test_the_simulated_engine_refuses_a_schedule_where_the_row_says_vllm_ignores_it(method: Method) -> None:
    engine = SimulatedEngine(PRESETS["deepseek-v3-mtp"], vllm_version=_version(method))
    spec = SpecConfig(method, 2, model="org/draft" if method.needs_draft_checkpoint else None, schedule=((1, 8, 2),))
    request = TrafficRequest(TrafficFormat.COMPLETIONS, prompt="hello there", output_tokens=16)
    result = engine(TrialSpec(ModelRef("m"), spec, (LoadLevel(value=2, num_requests=4),), (request,) * 4))
    refused = result.failure is not None and result.failure.cls is FailureClass.UNSUPPORTED
    assert refused == (not method.supports_batch_schedule), result.failure
    if not refused:
        assert result.status in (TrialStatus.SUCCEEDED, TrialStatus.DIVERGED)
