"""What the planner tests share: a small search space on a Llama config, four load levels, and a loop that
runs a planner to its end on an evaluator (``tests/search/fake_engine.py`` or one wrapping it)."""

from __future__ import annotations

from collections.abc import Callable

from tests.search.fake_engine import levels
from tuner.domain import Method, ModelRef, Proposal, TrialResult, TrialSpec
from tuner.search import OptunaPlanner, SearchSpace, build_space

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
LEVELS = levels(1, 8, 32, 128)


def space(methods: tuple[Method, ...] = (Method.EAGLE3, Method.NGRAM)) -> SearchSpace:
    """EAGLE-3 with one draft and ngram with one lookup window (and off) for a Llama on an H100."""
    return build_space(
        "m",
        LLAMA,
        hardware="h100",
        vllm_version="0.34.0",
        methods=list(methods),
        drafts={Method.EAGLE3: ["d/eagle3"]},
        ngram_lookups=[(2, 4)],
    )


def run(
    planner: OptunaPlanner, engine: Callable[[TrialSpec], TrialResult], limit: int = 200
) -> list[tuple[Proposal, TrialResult]]:
    """Ask, evaluate at LEVELS and tell until the planner has nothing left (or ``limit`` trials); the first
    result's outputs are every later trial's correctness reference, as the baseline's are in a job."""
    history = []
    ref = None
    for _ in range(limit):
        p = planner.ask()
        if p is None:
            break
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        planner.tell(p.number, r)
        history.append((p, r))
    return history
