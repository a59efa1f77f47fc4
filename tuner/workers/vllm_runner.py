"""The real trial runner: one ``vllm serve`` launch measured at every load level of a trial."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tuner.domain import (
    LEGACY_SCHEDULE_FIELD,
    CorrectnessReport,
    Engine,
    Failure,
    FailureClass,
    LevelResult,
    TrialContext,
    TrialProgress,
    TrialResult,
    TrialSpec,
    TrialStage,
    TrialStatus,
    UnsafeArgument,
    env_name_allowed,
    serve_env,
    throttled,
)
from tuner.workers.correctness import compare, greedy_outputs, not_gated, ungated_reason
from tuner.workers.devices import device_env
from tuner.workers.environment import server_env
from tuner.workers.failures import Observation, Phase, classify
from tuner.workers.measure import Target, measure_level
from tuner.workers.options import RunnerOptions
from tuner.workers.replay import ReplaySettings, Window, make_client, stream_client
from tuner.workers.vllm_probe import installed_capabilities
from tuner.workers.vllm_server import (
    ServerExited,
    ServerLaunchError,
    StartupCancelled,
    StartupTimeout,
    VllmServer,
    build_serve_argv,
    free_port,
)

# Lines of the log read to classify a failure (vLLM's refusal may sit above a long traceback).
_CLASSIFY_LINES = 600


class _Abort(Exception):
    def __init__(self, obs: Observation) -> None:
        super().__init__(obs.phase.value)
        self.obs = obs


@dataclass
class _Progress:
    """What a trial has gathered so far; kept on failure too."""

    levels: list[LevelResult] = field(default_factory=list)
    version: str | None = None
    startup_s: float | None = None
    correctness: CorrectnessReport | None = None
    reference: tuple[tuple[int, ...], ...] | None = None


class VllmRunner:
    """Runs a :class:`~tuner.domain.TrialSpec` on a real vLLM server (a :class:`~tuner.domain.Evaluator`).

    The server is launched once; each load level gets its warm-up requests, a metrics scrape before and
    after, and gauge sampling during its window. Speculative trials then pass the correctness gate against
    ``spec.reference_outputs`` (without one, ``correctness.not_gated`` says why they were not compared);
    a baseline trial returns its own greedy outputs as ``reference_outputs``.
    Trial failures are never raised: they come back as ``TrialResult(status=FAILED | CANCELLED,
    failure=...)``. The server's whole process group is stopped before returning, whatever happened.
    The call is blocking (it runs its own event loop); from async code, run it in a thread.
    """

    def __init__(self, options: RunnerOptions | None = None) -> None:
        self.options = options or RunnerOptions()

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        ctx = ctx or TrialContext()
        opts = self.options
        t0 = time.monotonic()
        deadline = t0 + spec.deadline_s if spec.deadline_s else float("inf")
        cancelled = throttled(ctx.is_cancelled, 1.0)
        progress = _Progress()
        port = free_port(opts.host)
        log_path = self._log_path(spec, ctx, port)

        for what, name in (("model", spec.model.name), ("draft model", spec.spec.model)):
            if name and (problem := opts.path_problem(what, name)) is not None:
                return self._result(spec, progress, Failure(FailureClass.UNSUPPORTED, problem), log_path, None, t0)
        bad_env = sorted(k for k in spec.serving.env if not env_name_allowed(k))
        if bad_env:
            refused = Failure(FailureClass.UNSUPPORTED, f"environment variables not allowed: {bad_env}")
            return self._result(spec, progress, refused, log_path, None, t0)

        caps = installed_capabilities(opts.probe_python())
        schedule_field = caps.schedule_field if caps is not None else LEGACY_SCHEDULE_FIELD
        if spec.spec.schedule and schedule_field is None:
            reason = f"vLLM {caps.version if caps else ''} has no per-batch-size schedule field"
            return self._result(spec, progress, Failure(FailureClass.UNSUPPORTED, reason), log_path, None, t0)
        try:
            argv = build_serve_argv(
                spec.model,
                spec.serving,
                spec.spec,
                port,
                command=opts.server_command(),
                host=opts.host,
                extra_args=opts.extra_args,
                schedule_field=schedule_field or LEGACY_SCHEDULE_FIELD,
            )
        except UnsafeArgument as exc:  # the API refuses these at submit; a library caller may not have
            return self._result(spec, progress, Failure(FailureClass.UNSUPPORTED, str(exc)), log_path, None, t0)
        trial_dir = log_path.with_suffix("")  # the trial's own files (tunable-op tables), beside its log
        env = device_env(
            server_env(os.environ, opts.extra_env, serve_env(spec.serving, spec.spec), trial_dir),
            spec.gpu_ids,
            in_ray=opts.in_ray,
        )
        server = VllmServer(
            argv,
            port=port,
            log_path=log_path,
            env=env,
            host=opts.host,
            grace_s=opts.stop_grace_s,
            on_started=ctx.on_process_started,
            cpus=_server_cpus(opts.client_cpus),
        )
        obs: Observation | None = None
        internal: BaseException | None = None
        try:
            with server:
                try:
                    ctx.on_progress(TrialProgress(TrialStage.STARTING, len(spec.levels)))
                    obs = self._start(server, progress, cancelled, deadline)
                    if obs is None:
                        ready = TrialProgress(TrialStage.READY, len(spec.levels), startup_s=progress.startup_s)
                        ctx.on_progress(ready)
                        asyncio.run(self._measure(server, spec, progress, cancelled, deadline, ctx.on_progress))
                except _Abort as abort:
                    obs = abort.obs
                except httpx.HTTPError as exc:  # a scrape or greedy request failed outside a replay window
                    obs = Observation(
                        Phase.RUNNING,
                        process_exited=server.exited_within(2.0),
                        returncode=server.returncode(),
                        request_errors=1,
                        requests=1,
                        error_sample=f"{type(exc).__name__}: {exc}",
                    )
                except Exception as exc:  # a bug on our side; the trial still ends cleanly
                    internal = exc
        except ServerLaunchError as exc:
            return self._result(spec, progress, Failure(FailureClass.INFRA, str(exc)), log_path, None, t0)
        failure: Failure | None = None
        tail = server.log_tail(opts.log_tail_lines)
        if internal is not None:
            failure = Failure(FailureClass.INTERNAL, f"{type(internal).__name__}: {internal}", tail)
        elif obs is not None:
            found = classify(server.log_tail(_CLASSIFY_LINES), obs)
            failure = dataclasses.replace(found, log_tail=tail)
        return self._result(spec, progress, failure, log_path, server.pgid, t0)

    def _log_path(self, spec: TrialSpec, ctx: TrialContext, port: int) -> Path:
        root = Path(ctx.log_dir or self.options.log_dir or Path(tempfile.gettempdir()) / "spec-tuner-logs")
        stamp = time.strftime("%Y%m%dT%H%M%S")
        parts = ("trial", spec.job_id, spec.number, stamp, os.getpid(), port)
        return root / ("-".join(str(p) for p in parts if p is not None) + ".log")

    def _start(
        self, server: VllmServer, progress: _Progress, cancelled: Callable[[], bool], deadline: float
    ) -> Observation | None:
        timeout = min(self.options.startup_timeout_s, max(0.0, deadline - time.monotonic()))
        try:
            progress.startup_s = server.wait_ready(timeout, cancelled)
        except ServerExited as e:
            return Observation(Phase.STARTUP, process_exited=True, returncode=e.returncode)
        except StartupTimeout:
            return Observation(Phase.STARTUP, timed_out=True)
        except StartupCancelled:
            return Observation(Phase.STARTUP, cancelled=True)
        return None

    async def _measure(
        self,
        server: VllmServer,
        spec: TrialSpec,
        progress: _Progress,
        cancelled: Callable[[], bool],
        deadline: float,
        report: Callable[[TrialProgress], None],
    ) -> None:
        opts = self.options
        base = server.base_url
        settings = ReplaySettings(
            model=spec.model.name,
            ignore_eos=opts.ignore_eos,
            request_timeout_s=opts.request_timeout_s,
            seed=opts.seed,
            return_token_ids=opts.return_token_ids,
        )

        def should_stop() -> bool:
            return cancelled() or not server.alive() or time.monotonic() > deadline

        def check(window: Window | None = None) -> None:
            """Abort when a window was stopped early, or (between windows) when the trial must stop."""
            stopped = window.stopped if window is not None else should_stop()
            if stopped:
                raise _Abort(
                    Observation(
                        Phase.RUNNING,
                        process_exited=not server.alive(),
                        returncode=server.returncode(),
                        timed_out=time.monotonic() > deadline,
                        cancelled=cancelled(),
                    )
                )

        target = Target(base, base)
        clients = opts.clients()
        async with make_client(opts.request_timeout_s) as client, stream_client(opts.request_timeout_s) as streams:
            progress.version = await _version(client, base)
            requests = spec.requests
            for i, level in enumerate(spec.levels, 1):
                report(TrialProgress(TrialStage.MEASURING, len(spec.levels), level=i, label=level.label))
                measured = await measure_level(
                    client,
                    streams,
                    target,
                    requests,
                    level,
                    settings,
                    slo=spec.slo,
                    num_speculative_tokens=spec.spec.num_speculative_tokens,
                    clients=clients,
                    metrics_interval_s=opts.metrics_interval_s,
                    should_stop=should_stop,
                    check=check,
                )
                result, window = measured.result, measured.window
                progress.levels.append(result)
                total = result.num_requests + result.errors
                if total and result.errors / total > opts.max_error_fraction:
                    sample = next((r.error for r in window.records if r.error), None)
                    raise _Abort(
                        Observation(
                            Phase.RUNNING,
                            process_exited=not server.alive(),
                            returncode=server.returncode(),
                            request_errors=result.errors,
                            requests=total,
                            error_sample=sample,
                        )
                    )
            check()
            report(TrialProgress(TrialStage.CHECKING, len(spec.levels)))
            subset = requests[: spec.correctness_prompts]
            if spec.spec.is_off:
                progress.reference = await greedy_outputs(client, base, subset, settings)
            elif (reason := ungated_reason(spec)) is not None:
                progress.correctness = not_gated(reason, opts.correctness_threshold)
            else:
                reference = (spec.reference_outputs or ())[: len(subset)]
                outputs = await greedy_outputs(client, base, subset[: len(reference)], settings)
                progress.correctness = compare(outputs, reference, opts.correctness_threshold)

    def _result(
        self,
        spec: TrialSpec,
        progress: _Progress,
        failure: Failure | None,
        log_path: Path,
        pgid: int | None,
        t0: float,
    ) -> TrialResult:
        if failure is not None:
            status = TrialStatus.CANCELLED if failure.cls is FailureClass.CANCELLED else TrialStatus.FAILED
        elif progress.correctness is not None and not progress.correctness.passed:
            status = TrialStatus.DIVERGED
        else:
            status = TrialStatus.SUCCEEDED
        return TrialResult(
            status=status,
            engine=Engine.VLLM,
            spec=spec.spec,
            levels=tuple(progress.levels),
            failure=failure,
            correctness=progress.correctness,
            reference_outputs=progress.reference,
            vllm_version=progress.version,
            hardware=spec.hardware,
            worker=socket.gethostname(),
            log_path=str(log_path),
            pgid=pgid,
            startup_s=progress.startup_s,
            wall_s=time.monotonic() - t0,
        )


def _server_cpus(client_cpus: tuple[int, ...] | None) -> list[int] | None:
    """The cores left to the server when the clients have cores of their own (None: no pinning)."""
    if not client_cpus:
        return None
    rest = sorted(os.sched_getaffinity(0) - set(client_cpus))
    return rest or None


async def _version(client: httpx.AsyncClient, base_url: str) -> str | None:
    try:
        resp = await client.get(f"{base_url}/version", timeout=10.0)
        return str(resp.json().get("version")) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
