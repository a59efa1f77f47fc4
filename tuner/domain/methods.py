"""Speculative-decoding methods and what each one is: one table every reader consults.

The search space, the predictor, the API's schemas and the simulated engine read a method's traits from
:data:`METHOD_TRAITS`; which vLLM versions and chips run it lives in the compatibility table
(``tuner.search.compat``). Adding a method is a row here, plus catalog entries and compat rules. The facts
come from vLLM's ``vllm/config/speculative.py`` (docs/vllm-facts.md, "Methods").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class Method(StrEnum):
    """A speculative-decoding method as vLLM names it (``off`` = no speculative config at all)."""

    OFF = "off"
    NGRAM = "ngram"
    NGRAM_GPU = "ngram_gpu"
    SUFFIX = "suffix"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    DFLASH = "dflash"
    DSPARK = "dspark"
    MEDUSA = "medusa"

    @property
    def traits(self) -> MethodTraits:
        """What this method is, from :data:`METHOD_TRAITS`."""
        return METHOD_TRAITS[self]

    @property
    def needs_draft_checkpoint(self) -> bool:
        """True when vLLM needs a separate ``model`` for the drafter (mtp/dspark can use the target's)."""
        return self.traits.draft is DraftNeed.REQUIRED

    @property
    def takes_draft_checkpoint(self) -> bool:
        """True when a separate drafter checkpoint may be given at all."""
        return self.traits.draft is not DraftNeed.NONE

    @property
    def is_chain_drafter(self) -> bool:
        """One drafter pass per drafted token, k tokens every step."""
        return self.traits.proposer is Proposer.CHAIN

    @property
    def is_variable_length(self) -> bool:
        """Proposers that may propose fewer than k tokens, or none (vLLM then counts no draft)."""
        return self.traits.proposer is Proposer.LOOKUP

    @property
    def fixed_length(self) -> bool:
        """Every step drafts exactly k tokens, so vLLM's per-position acceptance is unbiased."""
        return self.traits.proposer in (Proposer.CHAIN, Proposer.BLOCK)

    @property
    def supports_batch_schedule(self) -> bool:
        """vLLM's V1 runner honours ``num_speculative_tokens_per_batch_size`` for this method."""
        return self.traits.batch_schedule


class Proposer(StrEnum):
    """How a method proposes its k tokens, which fixes both its cost and what its acceptance counters mean."""

    NONE = "none"  # off: nothing is proposed
    CHAIN = "chain"  # one drafter pass per drafted token (draft model, EAGLE, MTP)
    BLOCK = "block"  # all k tokens in one drafter pass (DFlash and DSpark blocks, Medusa's parallel heads)
    LOOKUP = "lookup"  # matches the context: may propose fewer than k, or nothing (ngram, suffix)


class DraftNeed(StrEnum):
    NONE = "none"  # no drafter model: a checkpoint is refused
    OPTIONAL = "optional"  # the target's own layers when none is given (mtp, dspark)
    REQUIRED = "required"  # vLLM refuses to start without ``model``


class DepthRule(StrEnum):
    """Which ``num_speculative_tokens`` the search offers."""

    NONE = "none"  # off
    RANGE = "range"  # the job's depth range; ``default_depths`` when the job sets none
    BLOCK_SIZE = "block_size"  # the drafter's block sizes: ``default_depths``, or the job's ``block_sizes``
    MTP_LAYERS = "mtp_layers"  # the target's own heads: :func:`mtp_depths`; a separate checkpoint: RANGE


@dataclass(frozen=True)
class MethodTraits:
    proposer: Proposer
    draft: DraftNeed
    depth_rule: DepthRule
    batch_schedule: bool  # vLLM's V1 runner honours num_speculative_tokens_per_batch_size
    default_depths: tuple[int, ...] = ()  # () = the job's depth range (DEFAULT_DEPTH_RANGE)
    prompt_lookup: bool = False  # takes prompt_lookup_min / prompt_lookup_max windows
    searched_by_default: bool = True  # offered when the job does not name its methods


DEFAULT_DEPTH_RANGE: tuple[int, int] = (1, 8)

_NONE, _OPT, _REQ = DraftNeed.NONE, DraftNeed.OPTIONAL, DraftNeed.REQUIRED
_RANGE = DepthRule.RANGE

# The order is the order the search offers arms in (drafter-free methods first, then the drafters).
METHOD_TRAITS: Mapping[Method, MethodTraits] = MappingProxyType(
    {
        Method.OFF: MethodTraits(Proposer.NONE, _NONE, DepthRule.NONE, batch_schedule=False),
        Method.NGRAM: MethodTraits(Proposer.LOOKUP, _NONE, _RANGE, batch_schedule=True, prompt_lookup=True),
        # ngram on the GPU: searched only when asked for (the CPU ngram is the default lookup arm)
        Method.NGRAM_GPU: MethodTraits(
            Proposer.LOOKUP, _NONE, _RANGE, batch_schedule=False, prompt_lookup=True, searched_by_default=False
        ),
        Method.SUFFIX: MethodTraits(Proposer.LOOKUP, _NONE, _RANGE, batch_schedule=False, default_depths=(4, 8, 16)),
        Method.EAGLE3: MethodTraits(Proposer.CHAIN, _REQ, _RANGE, batch_schedule=True),
        Method.EAGLE: MethodTraits(Proposer.CHAIN, _REQ, _RANGE, batch_schedule=True),
        Method.MTP: MethodTraits(Proposer.CHAIN, _OPT, DepthRule.MTP_LAYERS, batch_schedule=True),
        Method.DSPARK: MethodTraits(
            Proposer.BLOCK, _OPT, DepthRule.BLOCK_SIZE, batch_schedule=False, default_depths=(4, 7, 10)
        ),
        Method.DFLASH: MethodTraits(
            Proposer.BLOCK, _REQ, DepthRule.BLOCK_SIZE, batch_schedule=True, default_depths=(4, 8, 16)
        ),
        Method.DRAFT_MODEL: MethodTraits(Proposer.CHAIN, _REQ, _RANGE, batch_schedule=True),
        Method.MEDUSA: MethodTraits(Proposer.BLOCK, _REQ, _RANGE, batch_schedule=False),
    }
)

# Methods that take a drafter checkpoint, in search order.
DRAFT_METHODS: tuple[Method, ...] = tuple(m for m, t in METHOD_TRAITS.items() if t.draft is not DraftNeed.NONE)


def mtp_depths(layers: int, max_depth: int = DEFAULT_DEPTH_RANGE[1]) -> tuple[int, ...]:
    """Depths vLLM accepts for a target's own MTP heads: any K <= n_predict, above that multiples of it."""
    n = max(1, layers)
    upper = max(max_depth, n)
    return tuple(sorted({k for k in range(1, n + 1)} | {k for k in range(2 * n, upper + 1, n)}))


def mtp_depth_allowed(k: int, layers: int) -> bool:
    """Whether vLLM starts the target's own ``layers`` MTP heads at depth ``k`` (the rule of mtp_depths)."""
    return layers > 0 and 0 < k and (k <= layers or k % layers == 0)
