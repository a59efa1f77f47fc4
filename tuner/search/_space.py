"""The search space: which methods, drafts, depths and ngram lookup windows a job may try."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.domain import (
    ADAPTIVE_FIELD,
    DEFAULT_DEPTH_RANGE,
    DRAFT_METHODS,
    LEGACY_SCHEDULE_FIELD,
    METHOD_TRAITS,
    DepthRule,
    DraftNeed,
    Method,
    SpecConfig,
    VllmCapabilities,
    arm_key,
    mtp_depths,
)
from tuner.domain.chips import is_amd
from tuner.search.catalog import DEFAULT_CATALOG, DraftCatalog
from tuner.search.compat import (
    ADAPTIVE,
    ATTENTION_BACKEND,
    BATCH_SCHEDULE,
    DEFAULT_RULES,
    TARGET_BACKEND,
    CompatOverrides,
    CompatRule,
    excluded_reason,
    option_refusal,
    rocm_backends,
)
from tuner.search.model_config import ModelTraits, model_traits

# Methods, their depth rules and default depths come from the domain's method table (METHOD_TRAITS).
NGRAM_LOOKUPS: tuple[tuple[int, int], ...] = ((2, 4), (3, 5))


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
    adaptive: bool = False  # vLLM's adaptive verification (enable_adaptive_verification): its own arm
    drafter_backend: str | None = None  # speculative_config.attention_backend (None: vLLM's choice)
    target_backend: str | None = None  # the target's --attention-backend (None: the job's, else vLLM's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", Method(self.method))
        object.__setattr__(self, "depths", tuple(sorted(set(self.depths))))
        object.__setattr__(self, "lookups", tuple(tuple(x) for x in self.lookups))

    @property
    def key(self) -> str:
        return arm_key(
            self.method, self.draft, adaptive=self.adaptive, backend=self.drafter_backend, target=self.target_backend
        )

    @property
    def fixed_length(self) -> bool:
        """Every step verifies exactly k tokens: false under adaptive verification, which trims per request."""
        return self.method.fixed_length and not self.adaptive

    def spec(self, depth: int, lookup: tuple[int | None, int | None] | None = None) -> SpecConfig:
        if self.method is Method.OFF:
            return SpecConfig()
        lo, hi = lookup if lookup is not None else (None, None)
        return SpecConfig(
            method=self.method,
            num_speculative_tokens=depth,
            model=self.draft,
            prompt_lookup_min=lo,
            prompt_lookup_max=hi,
            extra={
                **({ADAPTIVE_FIELD: True} if self.adaptive else {}),
                **({"attention_backend": self.drafter_backend} if self.drafter_backend else {}),
            },
            target_backend=self.target_backend,
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


@dataclass(frozen=True)
class OptionVerdict:
    """Whether an offered method may use one option (``compat.OPTIONS``) here; ``reason`` says why not."""

    method: Method
    option: str
    reason: str | None = None

    @property
    def allowed(self) -> bool:
        return self.reason is None


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
    capabilities: VllmCapabilities | None = None  # the worker's vLLM as probed; None: not reported
    schedule_field: str | None = LEGACY_SCHEDULE_FIELD  # the name vLLM takes the schedule by (None: it has none)
    schedule_refusal: str | None = None  # why no per-batch-size schedule may be deployed at all
    option_verdicts: tuple[OptionVerdict, ...] = ()

    def __post_init__(self) -> None:
        opts = tuple(o for o in self.options if o.method is not Method.OFF)
        object.__setattr__(self, "options", (OFF_OPTION, *opts))

    def option(self, key: str) -> MethodOptions | None:
        return next((o for o in self.options if o.key == key), None)

    def option_for(self, spec: SpecConfig) -> MethodOptions | None:
        return next((o for o in self.options if o.key == spec.arm), None)

    def option_refusal(self, method: Method, option: str) -> str | None:
        """Why ``method`` may not use ``option`` in this space (None: it may, or nothing was decided)."""
        verdict = next((v for v in self.option_verdicts if v.method is method and v.option == option), None)
        return verdict.reason if verdict is not None else None

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
    capabilities: VllmCapabilities | None = None,
    data_parallel_size: int = 1,
    attention_backends: str | Mapping[Method, str] | None = None,
    target_backend_pinned: bool = False,
) -> SearchSpace:
    """The search space for ``model`` from its config, the request's drafts and the built-in catalog.

    Always offered: ``off``, ``ngram`` (depths x ``prompt_lookup_min/max`` windows) and ``suffix`` where the
    compat table allows it; ``mtp`` when the config declares native MTP layers (depths any K <= n, then
    multiples of n) and for each separate MTP checkpoint supplied or catalogued (Gemma 4 assistants, any
    K); ``eagle``/``eagle3``/``dflash``/``dspark``/``draft_model`` for each checkpoint supplied in ``drafts``
    or found in the catalog (``dspark`` also without one: it uses the target). Chain drafters
    and ngram take depths ``depth_range`` (default 1-8); DFlash/DSpark take block sizes. ``methods``
    restricts the arms (off is always kept). Everything left out is listed in ``excluded`` with a reason.

    ``capabilities`` (the worker's vLLM, probed from its source) decide which method names exist, whether
    suffix decoding's package is there, and the schedule's field; names it accepts that the method table
    does not know are listed in ``notes``, never searched. Options of each offered method (adaptive
    verification, the per-batch-size schedule) get a verdict from the compat table and the capabilities;
    no schedule at all with data parallelism > 1 (vLLM turns it off there).

    ``attention_backends="search"`` on an AMD chip adds, beside each drafter arm on vLLM's default backend,
    one arm per ROCm backend the compat table lists for the chip and the model's attention (MLA or not),
    the drafter on it (``speculative_config.attention_backend``), and beside each speculative arm one per
    backend for the target (``--attention-backend``; not when the job's serving args pin it:
    ``target_backend_pinned``), one backend at a time, not their product. A mapping pins one drafter
    backend per method.
    """
    traits = model_traits(config, model) if config else None
    catalog = DEFAULT_CATALOG if catalog is None else catalog
    drafts = dict(drafts or {})
    wanted = None if methods is None else {Method(m) for m in methods}
    lo, hi = depth_range or DEFAULT_DEPTH_RANGE
    chain = tuple(range(max(1, lo), max(1, hi) + 1))
    lookups = tuple(ngram_lookups or NGRAM_LOOKUPS)  # each made a tuple by MethodOptions
    blocks = {m: t.default_depths for m, t in METHOD_TRAITS.items() if t.depth_rule is DepthRule.BLOCK_SIZE}
    blocks.update({Method(k): tuple(v) for k, v in (block_sizes or {}).items()})
    options: list[MethodOptions] = []
    excluded: list[ExcludedMethod] = []
    notes: list[str] = []

    if capabilities is not None and vllm_version is None:
        vllm_version = capabilities.version

    def allowed(method: Method, draft: str | None = None) -> bool:
        reason = excluded_reason(
            method, hardware=hardware, vllm_version=vllm_version, overrides=compat_overrides, rules=rules
        )
        forced = bool(compat_overrides and compat_overrides.get(method) is True)
        if reason is None and capabilities is not None and not forced:
            reason = capabilities.refusal(method)
        if reason:
            excluded.append(ExcludedMethod(method, reason, draft))
        return reason is None

    def want(method: Method) -> bool:
        return wanted is None or method in wanted

    for method, t in METHOD_TRAITS.items():  # the drafter-free methods
        if method is Method.OFF or t.draft is not DraftNeed.NONE:
            continue
        asked = want(method) if t.searched_by_default else (wanted is not None and method in wanted)
        if asked and allowed(method):
            depths = t.default_depths if t.default_depths and depth_range is None else chain
            options.append(MethodOptions(method, depths, lookups=lookups if t.prompt_lookup else ()))

    def draft_candidates(method: Method) -> list[tuple[str | None, str, bool | None, str | None]]:
        supplied = [(d, "request", None, None) for d in drafts.get(method, ())]
        known = [(e.checkpoint, "catalog", e.verified, e.source) for e in catalog.for_model(model, [method])]
        first: dict[str | None, tuple[str | None, str, bool | None, str | None]] = {}
        for candidate in supplied + known:  # one per checkpoint, the request's before the catalog's
            first.setdefault(candidate[0], candidate)
        return list(first.values())

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
        if method is Method.MTP or not want(method):  # MTP above: its native heads come from config.json
            continue
        candidates = draft_candidates(method)
        if not candidates:
            if method.traits.draft is DraftNeed.OPTIONAL and wanted is not None:  # the target's own (dspark)
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
    schedule_field = LEGACY_SCHEDULE_FIELD if capabilities is None else capabilities.schedule_field
    schedule_refusal = None
    if schedule_field is None:
        schedule_refusal = f"vLLM {vllm_version or ''} has no per-batch-size schedule field".replace("  ", " ")
    elif data_parallel_size > 1:
        schedule_refusal = "data parallelism > 1: vLLM turns the per-batch-size schedule off"
    if capabilities is not None and capabilities.unknown_methods:
        aliases = [m for m in capabilities.unknown_methods if m.endswith("_mtp")]
        others = [m for m in capabilities.unknown_methods if not m.endswith("_mtp")]
        listed = others + ([f"{len(aliases)} model-specific *_mtp aliases ({', '.join(aliases)})"] if aliases else [])
        notes.append(
            f"vLLM {capabilities.version or ''} accepts method names the method table does not know (reported, "
            f"never searched): {'; '.join(listed)}"
        )
    verdicts: list[OptionVerdict] = []
    for method in dict.fromkeys(o.method for o in options):
        for option in (ADAPTIVE, BATCH_SCHEDULE):
            refusal = option_refusal(method, option, hardware=hardware, vllm_version=vllm_version, rules=rules)
            if refusal is None and option == ADAPTIVE and capabilities is not None:
                if not capabilities.adaptive_verification:
                    refusal = f"vLLM {capabilities.version} has no enable_adaptive_verification"
            if refusal is None and option == BATCH_SCHEDULE:
                refusal = schedule_refusal
            verdicts.append(OptionVerdict(method, option, refusal))
    # Adaptive verification where allowed: an arm of its own beside each fixed-K arm of the method, so one
    # study compares fixed K, the per-batch schedule and adaptive, and may deploy any of them.
    adaptive_ok = {v.method for v in verdicts if v.option == ADAPTIVE and v.allowed}
    options += [dataclasses.replace(o, adaptive=True) for o in list(options) if o.method in adaptive_ok]
    if attention_backends is not None:
        options = _with_backends(
            options,
            attention_backends,
            hardware,
            vllm_version,
            traits,
            capabilities,
            rules,
            verdicts,
            notes,
            search_target=not target_backend_pinned,
        )
    return SearchSpace(
        model=model,
        options=tuple(options),
        excluded=tuple(excluded),
        traits=traits,
        hardware=hardware,
        vllm_version=vllm_version,
        notes=tuple(notes),
        capabilities=capabilities,
        schedule_field=schedule_field,
        schedule_refusal=schedule_refusal,
        option_verdicts=tuple(verdicts),
    )


def _with_backends(
    options: list[MethodOptions],
    wanted: str | Mapping[Method, str],
    hardware: str,
    vllm_version: str | None,
    traits: ModelTraits | None,
    capabilities: VllmCapabilities | None,
    rules: Sequence[CompatRule],
    verdicts: list[OptionVerdict],
    notes: list[str],
    search_target: bool = True,
) -> list[MethodOptions]:
    """The arms on the backends asked for (``"search"``: every one the chip's list allows)."""
    if capabilities is not None and not capabilities.drafter_attention_backend:
        notes.append(f"vLLM {capabilities.version} has no speculative_config.attention_backend: not searched")
        return options
    if wanted == "search" and not is_amd(hardware):
        notes.append(f"drafter attention backends are searched on AMD chips only; {hardware} keeps vLLM's choice")
        return options
    available = capabilities.attention_backends if capabilities is not None else ()
    mla = bool(traits and traits.mla)
    allowed: dict[tuple[Method, str], tuple[str, ...]] = {}

    def backends(method: Method, role: str) -> tuple[str, ...]:
        """The backends ``method`` may take in ``role``, asked of the table once; the verdicts recorded then."""
        if (method, role) not in allowed:
            keep, dropped = rocm_backends(
                method, hardware=hardware, vllm_version=vllm_version, mla=mla, available=available, rules=rules,
                role=role,
            )  # fmt: skip
            allowed[(method, role)] = keep
            verdicts.extend(OptionVerdict(method, f"{role}:{b}") for b in keep)
            verdicts.extend(OptionVerdict(method, f"{role}:{b}", why) for b, why in dropped)
        return allowed[(method, role)]

    out: list[MethodOptions] = []
    for o in options:
        targets: list[MethodOptions] = []
        if wanted == "search" and search_target and o.method is not Method.OFF:
            targets = [dataclasses.replace(o, target_backend=b) for b in backends(o.method, TARGET_BACKEND)]
        if o.method.traits.draft is DraftNeed.NONE:
            out += [o, *targets]
            continue
        if isinstance(wanted, Mapping):  # pinned: the job's choice, checked only against what vLLM has
            backend = wanted.get(o.method)
            if backend and available and backend not in available:
                verdicts.append(OptionVerdict(o.method, f"{ATTENTION_BACKEND}:{backend}", f"vLLM has no {backend}"))
                backend = None
            out.append(dataclasses.replace(o, drafter_backend=backend) if backend else o)
            continue
        drafters = [dataclasses.replace(o, drafter_backend=b) for b in backends(o.method, ATTENTION_BACKEND)]
        out += [o, *drafters, *targets]
    return out
