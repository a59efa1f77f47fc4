"""The search space: which methods, drafts, depths and ngram lookup windows a job may try."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.domain import Method, SpecConfig
from tuner.search.catalog import DEFAULT_CATALOG, DraftCatalog
from tuner.search.compat import DEFAULT_RULES, CompatOverrides, CompatRule, excluded_reason
from tuner.search.model_config import ModelTraits, model_traits

CHAIN_DEPTHS: tuple[int, ...] = tuple(range(1, 9))
BLOCK_SIZES: Mapping[Method, tuple[int, ...]] = {Method.DFLASH: (4, 8, 16), Method.DSPARK: (4, 7, 10)}
SUFFIX_DEPTHS: tuple[int, ...] = (4, 8, 16)
NGRAM_LOOKUPS: tuple[tuple[int, int], ...] = ((2, 4), (3, 5))
DRAFT_METHODS: tuple[Method, ...] = (
    Method.EAGLE3,
    Method.EAGLE,
    Method.MTP,
    Method.DSPARK,
    Method.DFLASH,
    Method.DRAFT_MODEL,
    Method.MEDUSA,
)


def fixed_length(method: Method) -> bool:
    """Every step drafts exactly k tokens, so vLLM's per-position acceptance is unbiased."""
    return method.is_chain_drafter or method in {Method.DFLASH, Method.DSPARK}


def mtp_depths(layers: int, max_depth: int = 8) -> tuple[int, ...]:
    """Depths vLLM accepts for MTP: any K <= n_predict, above that multiples of n_predict."""
    n = max(1, layers)
    upper = max(max_depth, n)
    return tuple(sorted({k for k in range(1, n + 1)} | {k for k in range(2 * n, upper + 1, n)}))


@dataclass(frozen=True)
class MethodOptions:
    """One arm of the search: a method with one draft checkpoint, and the depths (and lookups) it may take."""

    method: Method
    depths: tuple[int, ...]
    draft: str | None = None
    lookups: tuple[tuple[int, int], ...] = ()
    source: str = "builtin"  # builtin | request | catalog | target
    verified: bool | None = None  # catalog drafts: confirmed by a real run
    source_url: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", Method(self.method))
        object.__setattr__(self, "depths", tuple(sorted(set(self.depths))))
        object.__setattr__(self, "lookups", tuple(tuple(x) for x in self.lookups))

    @property
    def key(self) -> str:
        return self.method.value if self.draft is None else f"{self.method.value}@{self.draft}"

    @property
    def fixed_length(self) -> bool:
        return fixed_length(self.method)

    def spec(self, depth: int, lookup: tuple[int, int] | None = None) -> SpecConfig:
        if self.method is Method.OFF:
            return SpecConfig()
        lo, hi = lookup if lookup is not None else (None, None)
        return SpecConfig(
            method=self.method,
            num_speculative_tokens=depth,
            model=self.draft,
            prompt_lookup_min=lo,
            prompt_lookup_max=hi,
        )

    def specs(self) -> Iterator[SpecConfig]:
        for depth in self.depths:
            for lookup in self.lookups or (None,):
                yield self.spec(depth, lookup)


@dataclass(frozen=True)
class ExcludedMethod:
    method: Method
    reason: str
    draft: str | None = None


OFF_OPTION = MethodOptions(Method.OFF, depths=(0,))


@dataclass(frozen=True)
class SearchSpace:
    """Arms to search (``off`` always first) plus the methods left out and why."""

    model: str
    options: tuple[MethodOptions, ...]
    excluded: tuple[ExcludedMethod, ...] = ()
    traits: ModelTraits | None = None
    hardware: str = "auto"
    vllm_version: str | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        opts = tuple(o for o in self.options if o.method is not Method.OFF)
        object.__setattr__(self, "options", (OFF_OPTION, *opts))

    def option(self, key: str) -> MethodOptions | None:
        return next((o for o in self.options if o.key == key), None)

    def option_for(self, spec: SpecConfig) -> MethodOptions | None:
        return next((o for o in self.options if o.method is spec.method and o.draft == spec.model), None)

    def grid(self) -> list[SpecConfig]:
        """Every configuration in the space: what a grid search would run (off included)."""
        return [s for o in self.options for s in o.specs()]

    @property
    def grid_size(self) -> int:
        return len(self.grid())


def build_space(
    model: str,
    config: Mapping[str, Any] | None,
    *,
    hardware: str,
    vllm_version: str | None,
    methods: Sequence[Method] | None = None,
    depth_range: tuple[int, int] | None = None,
    drafts: Mapping[Method, Sequence[str]] | None = None,
    compat_overrides: CompatOverrides | None = None,
    catalog: DraftCatalog | None = None,
    ngram_lookups: Sequence[tuple[int, int]] | None = None,
    block_sizes: Mapping[Method, Sequence[int]] | None = None,
    rules: Sequence[CompatRule] = DEFAULT_RULES,
) -> SearchSpace:
    """The search space for ``model`` from its config, the request's drafts and the built-in catalog.

    Always offered: ``off``, ``ngram`` (depths x ``prompt_lookup_min/max`` windows) and ``suffix`` where the
    compat table allows it; ``mtp`` when the config declares native MTP layers (depths any K <= n, then
    multiples of n) and for each separate MTP checkpoint supplied or catalogued (Gemma 4 assistants, any
    K); ``eagle``/``eagle3``/``dflash``/``dspark``/``draft_model`` for each checkpoint supplied in ``drafts``
    or found in the catalog (``dspark`` also without one: it uses the target). Chain drafters
    and ngram take depths ``depth_range`` (default 1-8); DFlash/DSpark take block sizes. ``methods``
    restricts the arms (off is always kept). Everything left out is listed in ``excluded`` with a reason.
    """
    traits = model_traits(config, model) if config else None
    catalog = DEFAULT_CATALOG if catalog is None else catalog
    drafts = dict(drafts or {})
    wanted = None if methods is None else {Method(m) for m in methods}
    lo, hi = depth_range or (CHAIN_DEPTHS[0], CHAIN_DEPTHS[-1])
    chain = tuple(range(max(1, lo), max(1, hi) + 1))
    lookups = tuple(tuple(x) for x in (ngram_lookups or NGRAM_LOOKUPS))
    blocks = {**BLOCK_SIZES, **{Method(k): tuple(v) for k, v in (block_sizes or {}).items()}}
    options: list[MethodOptions] = []
    excluded: list[ExcludedMethod] = []
    notes: list[str] = []

    def allowed(method: Method, draft: str | None = None) -> bool:
        reason = excluded_reason(
            method, hardware=hardware, vllm_version=vllm_version, overrides=compat_overrides, rules=rules
        )
        if reason:
            excluded.append(ExcludedMethod(method, reason, draft))
        return reason is None

    def want(method: Method) -> bool:
        return wanted is None or method in wanted

    if want(Method.NGRAM) and allowed(Method.NGRAM):
        options.append(MethodOptions(Method.NGRAM, chain, lookups=lookups))
    if wanted is not None and Method.NGRAM_GPU in wanted and allowed(Method.NGRAM_GPU):
        options.append(MethodOptions(Method.NGRAM_GPU, chain, lookups=lookups))
    if want(Method.SUFFIX) and allowed(Method.SUFFIX):
        depths = SUFFIX_DEPTHS if depth_range is None else chain
        options.append(MethodOptions(Method.SUFFIX, depths))

    def draft_candidates(method: Method) -> list[tuple[str | None, str, bool | None, str | None]]:
        supplied = [(d, "request", None, None) for d in drafts.get(method, ())]
        known = [(e.checkpoint, "catalog", e.verified, e.source) for e in catalog.for_model(model, [method])]
        seen: set[str | None] = set()
        return [c for c in supplied + known if not (c[0] in seen or seen.add(c[0]))]

    mtp_layers = traits.mtp_layers if traits else 0
    if want(Method.MTP):
        # Native heads in the target, and/or separate MTP checkpoints (Gemma 4's assistants: vLLM reads their
        # gemma4_assistant config as one head, n_predict=1, run once per drafted token).
        assistants = draft_candidates(Method.MTP)
        if mtp_layers > 0 or assistants:
            if allowed(Method.MTP):
                if mtp_layers > 0:
                    options.append(MethodOptions(Method.MTP, mtp_depths(mtp_layers, hi), source="target"))
                for draft, source, verified, url in assistants:
                    options.append(
                        MethodOptions(Method.MTP, chain, draft, source=source, verified=verified, source_url=url)
                    )
        elif wanted is not None:
            reason = "no native MTP layers in config.json" if config else "no config.json to read MTP layers from"
            excluded.append(ExcludedMethod(Method.MTP, reason))

    for method in DRAFT_METHODS:
        if method is Method.MTP or not want(method):
            continue
        candidates = draft_candidates(method)
        if not candidates:
            if method is Method.DSPARK and wanted is not None:
                candidates = [(None, "target", None, None)]
            elif wanted is not None and method in wanted:
                excluded.append(ExcludedMethod(method, "no draft checkpoint supplied or in the catalog"))
                continue
            else:
                continue
        if not allowed(method):
            continue
        depths = blocks.get(method, chain)
        for draft, source, verified, url in candidates:
            options.append(MethodOptions(method, depths, draft, source=source, verified=verified, source_url=url))
        if method is Method.DRAFT_MODEL:
            notes.append("draft_model needs the draft's vocab to match the target's; not checked before launch")
    return SearchSpace(
        model=model,
        options=tuple(options),
        excluded=tuple(excluded),
        traits=traits,
        hardware=hardware,
        vllm_version=vllm_version,
        notes=tuple(notes),
    )
