"""The simulated engine: the Evaluator contract without a process, from an analytic model.

It serves the demo, CPU development, the search benchmarks and what-if estimates before GPU time is spent.
Every result says ``engine=Engine.SIMULATED``. ``expected`` is the noise-free truth (benchmarks use it to
know the true optimum); ``__call__`` adds measurement noise (3% by default) seeded from (seed, the spec's
key, the level, how often this engine ran that spec before): repeats differ, and a result does not depend
on which other trials ran in between. The model lives in ``sim_model.py``, the profiles in ``sim_profiles.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
import threading
from collections.abc import Sequence

from tuner.domain import (
    SLO,
    CorrectnessReport,
    Engine,
    Failure,
    FailureClass,
    LevelResult,
    LoadLevel,
    Method,
    ServingConfig,
    SpecConfig,
    TrafficRequest,
    TrialContext,
    TrialProgress,
    TrialResult,
    TrialSpec,
    TrialStage,
    TrialStatus,
    mtp_depth_allowed,
    parse_version,
)
from tuner.workers import sim_model
from tuner.workers.correctness import compare, not_gated, ungated_reason
from tuner.workers.sim_backends import backend_effect, with_backend
from tuner.workers.sim_level import level_result
from tuner.workers.sim_profiles import CHARS_PER_TOKEN, PRESETS, WORKLOADS, ModelProfile, WorkloadProfile

__all__ = ["PRESETS", "WORKLOADS", "ModelProfile", "SimulatedEngine", "WorkloadProfile"]

_REFERENCE_LEN = 16


class SimulatedEngine:
    """Computes a TrialResult from the analytic model; the same contract as the real vLLM runner."""

    def __init__(
        self,
        model: ModelProfile | None = None,
        workload: WorkloadProfile | None = None,
        *,
        noise: float = 0.03,
        seed: int = 0,
        hardware: str = "simulated",
        vllm_version: str = "simulated",
        correctness_threshold: float = 0.5,
    ) -> None:
        self.model = model or PRESETS["llama-3.1-8b"]
        self.correctness_threshold = float(correctness_threshold)  # as RunnerOptions.correctness_threshold
        self.workload = workload
        self.noise = float(noise)
        self.seed = int(seed)
        self.hardware = hardware
        self.vllm_version = vllm_version
        self._repeats: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    # ---- the public model --------------------------------------------------------------------------
    def acceptance(self, spec: SpecConfig) -> tuple[float, ...]:
        """Conditional acceptance per position (given the step proposed) for this method, depth, workload."""
        return sim_model.acceptance(self.model, self._workload(()), spec)

    def proposal_rate(self, spec: SpecConfig) -> float:
        """P(a request's decode step proposes anything): below 1 only for ngram and suffix."""
        return 1.0 if spec.is_off else sim_model.proposal_rate(spec, self._workload(()))

    def expected(
        self,
        spec: SpecConfig,
        level: LoadLevel,
        *,
        slo: SLO | None = None,
        serving: ServingConfig | None = None,
        requests: Sequence[TrafficRequest] = (),
    ) -> LevelResult:
        """The noise-free figures of one configuration at one load level (optionally on a trial's traffic)."""
        workload = self._workload(requests)
        return self._level(spec, level, workload, serving or ServingConfig(), slo or SLO(), requests, None)

    def speedup(self, spec: SpecConfig, level: LoadLevel) -> float:
        """Noise-free output-throughput ratio over no speculation at this level."""
        base = self.expected(SpecConfig(), level).output_throughput
        return self.expected(spec, level).output_throughput / base if base else 0.0

    # ---- the Evaluator contract --------------------------------------------------------------------
    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        ctx = ctx or TrialContext()
        call = self._repeat(spec.spec)
        workload = self._workload(spec.requests)
        startup = 40.0 + (20.0 if spec.spec.method.needs_draft_checkpoint else 0.0)
        refusal = self._refusal(spec.spec)
        if refusal is not None:
            return self._result(spec, TrialStatus.FAILED, failure=refusal, startup=startup)
        crash = backend_effect(self.hardware, spec.spec).crash
        if crash is not None:
            failure = Failure(FailureClass.CRASH, crash, f"(EngineCore pid=2) {crash}\n")
            return self._result(spec, TrialStatus.FAILED, failure=failure, startup=startup)
        if self._ooms(spec.spec):
            return self._result(spec, TrialStatus.FAILED, failure=_oom(spec.spec), startup=startup)
        levels: list[LevelResult] = []
        crash_at = max(1, len(spec.levels) - 1) if spec.spec.method in self.model.crashing else None
        for i, level in enumerate(spec.levels):
            ctx.on_progress(TrialProgress(TrialStage.MEASURING, len(spec.levels), level=i + 1, label=level.label))
            if ctx.is_cancelled():
                failure = Failure(FailureClass.CANCELLED, "cancelled during running")
                return self._result(spec, TrialStatus.CANCELLED, levels, failure=failure, startup=startup)
            if crash_at is not None and i >= crash_at:
                return self._result(spec, TrialStatus.FAILED, levels, failure=_crash(), startup=startup)
            rng = random.Random(self._seed_for(spec.spec, level, call))
            levels.append(self._level(spec.spec, level, workload, spec.serving, spec.slo, spec.requests, rng))
        if crash_at is not None:
            return self._result(spec, TrialStatus.FAILED, levels, failure=_crash(), startup=startup)
        outputs = _outputs(spec, diverged=spec.spec.method in self.model.diverging)
        report = None if spec.spec.is_off else self._gate(spec, outputs)
        status = TrialStatus.DIVERGED if report is not None and not report.passed else TrialStatus.SUCCEEDED
        return self._result(spec, status, levels, correctness=report, outputs=outputs, startup=startup)

    # ---- pieces ------------------------------------------------------------------------------------
    def _workload(self, requests: Sequence[TrafficRequest]) -> WorkloadProfile:
        if self.workload is None:
            base = WorkloadProfile.from_requests(requests) if requests else WORKLOADS["chat"]
        else:
            base = self.workload
        if not requests:
            return base
        prompt = sum(len(r.prompt_text()) for r in requests) / len(requests) / CHARS_PER_TOKEN
        output = sum(r.target_output_tokens for r in requests) / len(requests)
        return dataclasses.replace(base, prompt_tokens=prompt, output_tokens=output)

    def _repeat(self, spec: SpecConfig) -> int:
        """How often this configuration ran before: repeats differ, other trials' order does not matter."""
        with self._lock:
            counter = self._repeats.setdefault(spec.key(), itertools.count())
            return next(counter)

    def _seed_for(self, spec: SpecConfig, level: LoadLevel, call: int) -> int:
        raw = f"{self.seed}|{spec.key()}|{level.label}|{call}".encode()
        return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")

    def _refusal(self, spec: SpecConfig) -> Failure | None:
        """vLLM-like start-up refusals (the runner's classifier reads such lines as unsupported_config)."""
        method = spec.method
        if spec.is_off:
            return None
        k = spec.num_speculative_tokens
        msg = None
        if method in self.model.unsupported:
            msg = f"NotImplementedError: speculative method '{method.value}' is not supported for {self.model.name}"
        elif k <= 0:
            msg = f"ValueError: num_speculative_tokens must be > 0 for method '{method.value}', got {k}"
        elif method is Method.MTP and spec.model is None and self.model.mtp_layers <= 0:
            msg = f"ValueError: method 'mtp' needs MTP layers; {self.model.name} has none (num_nextn_predict_layers)"
        elif method is Method.MTP and spec.model is None and not mtp_depth_allowed(k, self.model.mtp_layers):
            msg = (
                f"ValueError: num_speculative_tokens ({k}) must be divisible by the number of MTP layers "
                f"(n_predict={self.model.mtp_layers})"
            )
        elif method is Method.MEDUSA and parse_version(self.vllm_version) >= (0, 33, 0):
            msg = "ValueError: method 'medusa' is not supported in this version of vLLM"
        elif spec.schedule and not method.supports_batch_schedule:
            msg = f"ValueError: num_speculative_tokens_per_batch_size is not supported for method '{method.value}'"
        if msg is None:
            return None
        return Failure(FailureClass.UNSUPPORTED, msg, f"(APIServer pid=1) {msg}\n")

    def _gate(self, spec: TrialSpec, outputs: Sequence[Sequence[int]]) -> CorrectnessReport:
        """The runner's gate (tuner.workers.correctness) on the simulated outputs, same threshold semantics."""
        reason = ungated_reason(spec)
        if reason is not None:
            return not_gated(reason, self.correctness_threshold)
        return compare(outputs, spec.reference_outputs or (), self.correctness_threshold)

    def _ooms(self, spec: SpecConfig) -> bool:
        limit = self.model.max_depth_before_oom.get(spec.method)
        return limit is not None and spec.num_speculative_tokens > limit

    def _result(
        self,
        spec: TrialSpec,
        status: TrialStatus,
        levels: Sequence[LevelResult] = (),
        *,
        failure: Failure | None = None,
        correctness: CorrectnessReport | None = None,
        outputs: tuple[tuple[int, ...], ...] | None = None,
        startup: float = 0.0,
    ) -> TrialResult:
        return TrialResult(
            status=status,
            engine=Engine.SIMULATED,
            spec=spec.spec,
            levels=tuple(levels),
            failure=failure,
            correctness=correctness,
            reference_outputs=outputs,
            vllm_version=self.vllm_version,
            hardware=self.hardware,
            worker="simulated",
            startup_s=startup,
            wall_s=startup + sum(lr.duration_s for lr in levels),  # simulated seconds, not this call's
        )

    def _level(
        self,
        spec: SpecConfig,
        level: LoadLevel,
        workload: WorkloadProfile,
        serving: ServingConfig,
        slo: SLO,
        requests: Sequence[TrafficRequest],
        rng: random.Random | None,
    ) -> LevelResult:
        model = with_backend(self.model, self.hardware, spec)
        return level_result(model, workload, spec, level, serving, slo, requests, rng, self.noise)


def _oom(spec: SpecConfig) -> Failure:
    msg = (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB while capturing CUDA graphs "
        f"for {spec.method.value} with num_speculative_tokens={spec.num_speculative_tokens}"
    )
    return Failure(FailureClass.OOM, msg, f"(EngineCore pid=2) {msg}\n")


def _crash() -> Failure:
    tail = (
        "(EngineCore pid=2) RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    )
    return Failure(FailureClass.CRASH, "RuntimeError: CUDA error: an illegal memory access was encountered", tail)


def _outputs(spec: TrialSpec, diverged: bool) -> tuple[tuple[int, ...], ...]:
    """Greedy outputs of the correctness subset: the prompt's own token ids, lossless unless diverging."""
    out: list[tuple[int, ...]] = []
    for i, req in enumerate(spec.requests[: spec.correctness_prompts]):
        if spec.reference_outputs and i < len(spec.reference_outputs) and not diverged:
            out.append(tuple(spec.reference_outputs[i]))
            continue
        digest = hashlib.sha256(req.prompt_text().encode()).digest()
        ids = [b * 97 + j for j, b in enumerate(digest[:_REFERENCE_LEN])]
        if diverged:
            ids = ids[:3] + [(x + 7919) % 151_000 for x in ids[3:]]
        out.append(tuple(ids))
    return tuple(out)
