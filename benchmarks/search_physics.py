"""Step-cost physics that is not the simulated engine's: scenario families for the search benchmark.

The planner's cost model (``tuner/search/cost_model.py``) and the simulated engine (``tuner/workers``) share
assumptions; a search judged only on them grades itself. Every family here builds its step time from terms
neither of them has, with its own acceptance tables (ranges from docs/published-figures.md):

- ``knee``: a roofline. The target's step is flat until the batch's tokens cross the knee (memory-bound: the
  weights are read once however many tokens ride along), then grows with the tokens (compute-bound):
  ``T(n) = t0 (1 + (n / knee)^4)^(1/4)``, knees from 48 to 1024 tokens.
- ``moe``: experts touched. An MoE step reads the experts its tokens route to; n tokens over E experts of
  which each token picks top-k touch ``E (1 - (1 - k/E)^n)`` of them, so verifying extra tokens is dear at
  low concurrency and nearly free at high (every expert is read anyway): the inverse of the dense picture.
- ``kv-sched``: long contexts and a busy scheduler. Each request in flight reads its KV cache every step
  (``kv_ms`` per 1000 context tokens, the same with or without drafts), the scheduler and sampler pay per
  request and per verified token, and the drafter's cost grows with the batch (its attention over the
  context).
- ``hostile`` (held out, run last and reported apart): the same terms mixed, 4% noise with one run in
  twelve 10-20% slow, methods refused at start or crashing, out-of-memory above a depth.

Every configuration pays a spec-decode bookkeeping term of its own (a share of the step plus a cost per
request), unlike the planner's prior. The request's life is a prefill (stretched by the batch) then
``(out - 1) / tau`` steps; throughput is Little's law over the closed loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.bench_trials import counters, level_result, level_rng, succeeded
from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    LoadLevel,
    Method,
    Proposer,
    SpecConfig,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
)

OUT_TOKENS = 256


@dataclass(frozen=True)
class Target:
    """The verifying model's step time, in ms, for ``n`` batched tokens from ``c`` requests."""

    t0_ms: float = 7.0  # flat part: the weights read once
    knee: float = 256.0  # tokens per step where compute overtakes memory
    experts: int = 0  # MoE experts per layer (0: dense)
    topk: int = 0
    expert_ms: float = 0.0  # ms per expert read
    kv_ms: float = 0.0  # ms per request per 1000 context tokens
    context: float = 1000.0  # mean context length in tokens
    sched_req_ms: float = 0.02  # scheduler + sampler per request per step
    sched_tok_ms: float = 0.0  # rejection sampling per verified draft token
    prefill_ms: float = 20.0  # one request's prefill alone
    bookkeeping: float = 0.04  # spec-decode share of the step paid at any K
    bookkeeping_req_ms: float = 0.01  # and per request

    def step(self, n: float, c: float, *, draft_tokens: float = 0.0) -> float:
        roof = self.t0_ms * (1.0 + (n / self.knee) ** 4) ** 0.25
        moe = self.expert_ms * self.experts * (1.0 - (1.0 - self.topk / self.experts) ** n) if self.experts else 0.0
        kv = self.kv_ms * c * self.context / 1000.0
        return roof + moe + kv + self.sched_req_ms * c + self.sched_tok_ms * draft_tokens


@dataclass(frozen=True)
class Drafter:
    """A method's proposer: acceptance per position and what drafting costs per step."""

    method: Method
    acceptance: tuple[float, ...]  # conditional acceptance per position, given a proposal
    draft: str | None = None
    proposal_rate: float = 1.0  # P(a request-step proposes): below 1 for lookup proposers
    d0_ms: float = 0.4  # per draft pass (chain: per token; block: once)
    d_req_ms: float = 0.005  # per request per pass, times context / 1000 for chain drafters
    d_tok_ms: float = 0.0  # block drafters: per drafted token in the batch

    def tau(self, k: int) -> float:
        surv, total = 1.0, 0.0
        for i in range(k):
            surv *= self.acceptance[min(i, len(self.acceptance) - 1)]
            total += surv
        return 1.0 + self.proposal_rate * total

    def cost(self, k: int, c: float, context: float) -> float:
        if k <= 0:
            return 0.0
        kind = self.method.traits.proposer
        if kind is Proposer.LOOKUP:
            return self.d0_ms * 0.1 + self.d_req_ms * c * self.proposal_rate
        if kind is Proposer.BLOCK:
            return self.d0_ms + self.d_tok_ms * c * k + self.d_req_ms * c * context / 1000.0
        return k * (self.d0_ms + self.d_req_ms * c * context / 1000.0)


@dataclass(frozen=True)
class Physics:
    target: Target
    drafters: tuple[Drafter, ...]
    refused: frozenset[Method] = frozenset()  # unsupported_config at start
    crashing: frozenset[Method] = frozenset()
    oom_above: Mapping[Method, int] = field(default_factory=dict)

    def drafter(self, spec: SpecConfig) -> Drafter | None:
        return next((d for d in self.drafters if d.method is spec.method and d.draft == spec.model), None)

    def request_ms(self, spec: SpecConfig, c: int) -> tuple[float, float, float]:
        """(TTFT, TPOT, tokens per request-step) at ``c`` requests in flight, noise free."""
        t = self.target
        if spec.is_off:
            k, tau, drafter = 0, 1.0, None
        else:
            drafter = self.drafter(spec)
            assert drafter is not None
            k = spec.k_at(c)
            tau = drafter.tau(k)
        verified = 0.0 if drafter is None or k == 0 else drafter.proposal_rate * k
        n = c * (1.0 + verified)
        step = t.step(n, c, draft_tokens=c * verified)
        if drafter is not None:
            step += t.bookkeeping * step + t.bookkeeping_req_ms * c + drafter.cost(k, c, t.context)
        # a new request's prefill rides in the running batch's steps and stretches them for the others
        prefill = t.prefill_ms * (1.0 + c / 16.0)
        stretch = 1.0 + (t.prefill_ms / (OUT_TOKENS / tau * step)) * (c - 1) / max(1.0, c)
        tpot = step * stretch / tau
        return prefill + step, tpot, tau

    def throughput(self, spec: SpecConfig, c: int) -> float:
        ttft, tpot, _ = self.request_ms(spec, c)
        return c * OUT_TOKENS * 1000.0 / (ttft + (OUT_TOKENS - 1) * tpot)

    def runs(self, spec: SpecConfig) -> Failure | None:
        if spec.is_off:
            return None
        if self.drafter(spec) is None or spec.method in self.refused:
            return Failure(FailureClass.UNSUPPORTED, f"{spec.method.value} is not supported for this model")
        if spec.method in self.crashing:
            return Failure(FailureClass.CRASH, "EngineCore failed to start (RuntimeError in the drafter)")
        cap = self.oom_above.get(spec.method)
        if cap is not None and spec.num_speculative_tokens > cap:
            return Failure(FailureClass.OOM, "CUDA out of memory while allocating the draft KV cache")
        return None

    def speedup(self, spec: SpecConfig, level: LoadLevel) -> float:
        c = int(level.value)
        return self.throughput(spec, c) / self.throughput(SpecConfig(), c)


@dataclass
class PhysicsEngine:
    """An Evaluator on ``Physics``: one speed factor per level and call, ``1 + noise x N(0, 1)``, and with
    probability ``outliers`` a slow run (10-20% slower: a noisy neighbour, a thermal throttle)."""

    physics: Physics
    noise: float = 0.03
    outliers: float = 0.0
    seed: int = 0
    _calls: itertools.count = field(default_factory=itertools.count)

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        call = next(self._calls)
        cfg = spec.spec
        failure = self.physics.runs(cfg)
        if failure is not None:
            return TrialResult(TrialStatus.FAILED, Engine.SIMULATED, spec=cfg, failure=failure)
        levels = []
        for level in spec.levels:
            rng = level_rng(self.seed, cfg, level, call)
            speed = max(0.5, 1.0 + self.noise * rng.gauss(0.0, 1.0))
            if rng.random() < self.outliers:
                speed *= rng.uniform(0.8, 0.9)
            c = int(level.value)
            ttft, tpot, tau = self.physics.request_ms(cfg, c)
            sd = counters(cfg, c, level.num_requests * OUT_TOKENS, rng, self.physics.drafter(cfg), jitter=0.01)
            ttft, tpot = ttft / speed, tpot / speed
            levels.append(level_result(level, ttft=ttft, tpot=tpot, tau=tau, out_tokens=OUT_TOKENS, spec_decode=sd))
        return succeeded(cfg, levels, "physics")


# Acceptance per position (ranges from docs/published-figures.md), not the simulated engine's decay laws.
E3_HIGH = (0.82, 0.78, 0.75, 0.72, 0.70, 0.68, 0.66, 0.64)
E3_LOW = (0.70, 0.62, 0.57, 0.53, 0.50, 0.47, 0.45, 0.43)
DRAFT_MODEL = (0.75, 0.70, 0.66, 0.63, 0.60, 0.58, 0.56, 0.54)
MTP_HEAD = tuple(0.9 * 0.82**i for i in range(8))
NGRAM_CODE = (0.72, 0.64, 0.58, 0.54, 0.51, 0.48, 0.46, 0.44)
DFLASH = (0.85, 0.78, 0.72, 0.66, 0.60, 0.55, 0.50, 0.46, 0.42, 0.38, 0.35, 0.32, 0.30, 0.28, 0.26, 0.24)


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    held_out: bool
    members: Sequence[tuple[str, str, Physics, Sequence[int], float, float]]  # name, text, physics, cs, noise, out


def _e3(acc: tuple[float, ...] = E3_HIGH, **kw: float) -> Drafter:
    return Drafter(Method.EAGLE3, acc, draft="draft/eagle3", **kw)


def _ngram(rate: float, **kw: float) -> Drafter:
    return Drafter(Method.NGRAM, NGRAM_CODE, proposal_rate=rate, d0_ms=0.2, d_req_ms=0.01, **kw)


def _dm(**kw: float) -> Drafter:
    return Drafter(Method.DRAFT_MODEL, DRAFT_MODEL, draft="draft/draft_model", d0_ms=1.1, d_req_ms=0.01, **kw)


def families() -> list[Family]:
    dense = Target(t0_ms=7.0, prefill_ms=18.0)
    knee = Family(
        "knee",
        "dense target with a roofline knee at 48-1024 tokens per step",
        False,
        [
            (
                "knee-48-e3-ngram",
                "knee at 48 tokens: a compute-bound chip",
                Physics(Target(t0_ms=6.0, knee=48.0), (_e3(), _ngram(0.45))),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "knee-192-e3-dm",
                "knee at 192 tokens, EAGLE-3 against a draft model",
                Physics(Target(t0_ms=7.0, knee=192.0), (_e3(E3_LOW), _dm())),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "knee-1024-e3-ngram",
                "knee at 1024 tokens: flat to high batch",
                Physics(Target(t0_ms=9.0, knee=1024.0), (_e3(), _ngram(0.3))),
                (1, 16, 64, 256),
                0.01,
                0.0,
            ),
            (
                "knee-96-ngram-dm",
                "knee at 96, ngram on code against a draft model",
                Physics(Target(t0_ms=6.5, knee=96.0), (_ngram(0.7), _dm())),
                (1, 4, 16, 64),
                0.03,
                0.0,
            ),
        ],
    )
    moe = Family(
        "moe",
        "MoE target whose step grows with the experts its tokens touch",
        False,
        [
            (
                "moe-128x8-mtp-e3",
                "128 experts, top-8: verification dear at c1",
                Physics(
                    Target(t0_ms=4.0, knee=512.0, experts=128, topk=8, expert_ms=0.06),
                    (Drafter(Method.MTP, MTP_HEAD, d0_ms=0.6), _e3()),
                ),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "moe-64x6-e3-ngram",
                "64 experts, top-6, with ngram",
                Physics(Target(t0_ms=3.5, knee=384.0, experts=64, topk=6, expert_ms=0.08), (_e3(), _ngram(0.5))),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "moe-256x8-dflash",
                "256 experts, top-8, DFlash blocks against EAGLE-3",
                Physics(
                    Target(t0_ms=5.0, knee=768.0, experts=256, topk=8, expert_ms=0.03),
                    (Drafter(Method.DFLASH, DFLASH, draft="draft/dflash", d0_ms=1.5, d_tok_ms=0.002), _e3(E3_LOW)),
                ),
                (1, 4, 16, 64),
                0.02,
                0.0,
            ),
            (
                "moe-32x4-dm-ngram",
                "32 experts, top-4: saturates early",
                Physics(Target(t0_ms=4.5, knee=256.0, experts=32, topk=4, expert_ms=0.12), (_dm(), _ngram(0.4))),
                (1, 8, 32, 128),
                0.03,
                0.0,
            ),
        ],
    )
    kv = Family(
        "kv-sched",
        "long contexts (KV read per request) and per-request scheduling, drafter cost growing with batch",
        False,
        [
            (
                "kv-16k-e3",
                "16k contexts: KV dominates at high c",
                Physics(
                    Target(t0_ms=7.0, knee=512.0, kv_ms=0.012, context=16000.0, sched_req_ms=0.03),
                    (_e3(d_req_ms=0.002), _ngram(0.35)),
                ),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "kv-4k-sched-dm",
                "4k contexts and a busy sampler, draft model",
                Physics(
                    Target(t0_ms=7.0, knee=256.0, kv_ms=0.01, context=4000.0, sched_req_ms=0.05, sched_tok_ms=0.02),
                    (_dm(), _e3(E3_LOW)),
                ),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
            (
                "kv-32k-mtp",
                "32k contexts, native MTP",
                Physics(
                    Target(t0_ms=8.0, knee=768.0, kv_ms=0.008, context=32000.0, sched_req_ms=0.02),
                    (Drafter(Method.MTP, MTP_HEAD, d0_ms=0.5, d_req_ms=0.004), _ngram(0.3)),
                ),
                (1, 4, 16, 64),
                0.02,
                0.0,
            ),
            (
                "kv-sched-heavy-e3",
                "a sampler paying per verified token",
                Physics(
                    Target(t0_ms=6.0, knee=384.0, kv_ms=0.004, context=2000.0, sched_req_ms=0.04, sched_tok_ms=0.05),
                    (_e3(), _ngram(0.5)),
                ),
                (1, 8, 32, 128),
                0.02,
                0.0,
            ),
        ],
    )
    hostile = Family(
        "hostile",
        "held out: mixed terms, 4% noise with slow outlier runs, refusals, crashes, OOM above a depth",
        True,
        [
            (
                "hostile-knee-oom",
                "knee 128, EAGLE-3 out of memory above depth 3",
                Physics(
                    Target(t0_ms=6.0, knee=128.0, kv_ms=0.004, context=3000.0),
                    (_e3(), _ngram(0.5), _dm()),
                    oom_above={Method.EAGLE3: 3},
                ),
                (1, 8, 32, 128),
                0.04,
                1 / 12,
            ),
            (
                "hostile-moe-refused",
                "MoE, EAGLE-3 refused, MTP and ngram",
                Physics(
                    Target(t0_ms=4.0, knee=512.0, experts=128, topk=8, expert_ms=0.05),
                    (_e3(), Drafter(Method.MTP, MTP_HEAD, d0_ms=0.6), _ngram(0.4)),
                    refused=frozenset({Method.EAGLE3}),
                ),
                (1, 8, 32, 128),
                0.04,
                1 / 12,
            ),
            (
                "hostile-kv-crash",
                "long contexts, the draft model crashes",
                Physics(
                    Target(t0_ms=7.0, knee=256.0, kv_ms=0.01, context=12000.0, sched_tok_ms=0.03),
                    (_dm(), _e3(E3_LOW), _ngram(0.3)),
                    crashing=frozenset({Method.DRAFT_MODEL}),
                ),
                (1, 8, 32, 128),
                0.04,
                1 / 12,
            ),
            (
                "hostile-flat-ngram",
                "flat chip, ngram only, slow runs",
                Physics(dense, (_ngram(0.6),)),
                (1, 16, 64, 256),
                0.04,
                1 / 12,
            ),
        ],
    )
    return [knee, moe, kv, hostile]
