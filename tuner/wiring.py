"""The composition root: builds the planner (tuner.search) and executor (tuner.workers) a job runner uses.

This is the one module that knows all the packages; api, search, workers and store know only the domain.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tuner.domain import (
    Engine,
    Evaluator,
    JobSpec,
    Method,
    Planner,
    TrafficRequest,
    TrialContext,
    TrialResult,
    TrialSpec,
)
from tuner.errors import InvalidInput
from tuner.job_runner import JobRunner, TrialExecutor
from tuner.settings import Settings

log = logging.getLogger("tuner.wiring")


def study_name(job_id: str) -> str:
    return f"tuner-job-{job_id}"


@lru_cache(maxsize=4)
def _host_report(vllm_python: str | None) -> dict[str, Any]:
    from tuner.workers.hardware import host_report, probe_vllm_version

    def probe() -> str | None:
        if vllm_python:
            import subprocess

            try:
                out = subprocess.run(
                    [vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
            except (OSError, subprocess.TimeoutExpired):
                return None
        return probe_vllm_version()

    report = host_report(vllm_version_probe=probe)
    data = report.to_dict()
    data.setdefault("hardware", report.family() or "cpu")
    return data


def host_report(settings: Settings) -> dict[str, Any]:
    """What this worker reports: chip, count, memory, driver and vLLM version (cached per process)."""
    return _host_report(settings.vllm_python)


def make_planner(settings: Settings, job_id: str, spec: JobSpec, requests: list[TrafficRequest]) -> Planner:
    from tuner.search import OptunaPlanner, build_space, read_model_config

    if spec.model.trust_remote_code and not settings.allow_trust_remote_code:
        # The API checked its own settings; a worker runs the model's code, so it decides for itself too.
        raise InvalidInput("trust_remote_code is not allowed on this worker (TUNER_ALLOW_TRUST_REMOTE_CODE)")
    config = read_model_config(spec.model.name, supplied=spec.model_config, revision=spec.model.revision)
    if spec.engine is Engine.SIMULATED:
        vllm_version = "0.34.0"  # the simulated engine models current vLLM
        hardware = spec.hardware
    else:
        report = host_report(settings)
        vllm_version = report.get("vllm_version")
        hardware = spec.hardware if spec.hardware != "auto" else report.get("hardware", "auto")
    space = build_space(
        spec.model.name,
        config,
        hardware=hardware,
        vllm_version=vllm_version,
        methods=spec.methods,
        depth_range=spec.depth_range,
        drafts={Method(m): list(p) for m, p in spec.drafts.items()} or None,
    )
    return OptunaPlanner(
        space,
        spec.levels,
        objective=spec.objective,
        slo=spec.slo,
        budget=spec.budget,
        storage=settings.db_url,
        study_name=study_name(job_id),
        seed=spec.seed,
        confirm_runs=spec.confirm_runs,
    )


class PacedEvaluator:
    """Makes each simulated trial take ``seconds`` of wall time (demos, recovery tests), honouring cancel.

    With ``placeholder_process`` it also holds a real process group for the trial's duration and reports it
    like a vLLM server's, so the recovery path (kill what a dead runner left) is exercised end to end.
    """

    def __init__(self, inner: Evaluator, seconds: float, *, placeholder_process: bool = False) -> None:
        self.inner = inner
        self.seconds = seconds
        self.placeholder_process = placeholder_process

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        import subprocess

        proc = None
        if self.placeholder_process:
            proc = subprocess.Popen(["sleep", str(int(self.seconds) + 600)], start_new_session=True)
            if ctx is not None:
                ctx.on_process_started(proc.pid)
        try:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                if ctx is not None and ctx.is_cancelled():
                    break
                time.sleep(0.05)
            return self.inner(spec, ctx)
        finally:
            if proc is not None:
                from tuner.workers.vllm_server import kill_process_group

                kill_process_group(proc.pid, grace_s=2.0)
                proc.wait()


def simulated_evaluator(spec: JobSpec, *, pace_s: float = 0.0, placeholder_process: bool = False) -> Evaluator:
    from tuner.search import read_model_config
    from tuner.workers.simulated import ModelProfile, SimulatedEngine

    config = read_model_config(spec.model.name, supplied=spec.model_config, revision=spec.model.revision)
    profile = ModelProfile.from_hf_config(config) if config else None
    hardware = spec.hardware if spec.hardware != "auto" else "simulated"
    engine: Evaluator = SimulatedEngine(profile, seed=spec.seed, hardware=hardware, vllm_version="simulated")
    if pace_s > 0 or placeholder_process:
        return PacedEvaluator(engine, pace_s, placeholder_process=placeholder_process)
    return engine


def runner_options(settings: Settings, log_dir: Path) -> dict[str, Any]:
    from tuner.workers.options import CPU_SERVER_ENV

    options: dict[str, Any] = {
        "log_dir": str(log_dir),
        "startup_timeout_s": settings.startup_timeout_s,
        "extra_env": dict(settings.vllm_extra_env),
    }
    if settings.vllm_executable:
        options["vllm_command"] = (settings.vllm_executable, "serve")
    if settings.vllm_python:
        options["vllm_python"] = settings.vllm_python
    if settings.cpu_vllm:
        options["extra_env"] = {**CPU_SERVER_ENV, **options["extra_env"]}
        options["extra_args"] = ("--enforce-eager",)
    return options


def make_executor(settings: Settings, spec: JobSpec) -> TrialExecutor:
    from tuner.workers.executors import EvaluatorRecipe, LocalExecutor

    log_dir = settings.log_dir
    lease_dir = settings.data_dir / "gpu-leases"
    if spec.engine is Engine.SIMULATED:
        evaluator = simulated_evaluator(
            spec, pace_s=settings.simulated_trial_s, placeholder_process=settings.simulated_placeholder_process
        )
        # The simulated engine stands in for the requested chip, whatever this host has.
        family = None if spec.hardware == "auto" else spec.hardware
        return LocalExecutor(
            evaluator, gpus=[], lease_dir=lease_dir, hardware=spec.hardware, family=family, engine=Engine.SIMULATED
        )
    options = runner_options(settings, log_dir)
    if settings.executor == "ray":
        from tuner.workers.executors import RayExecutor

        return RayExecutor(EvaluatorRecipe(Engine.VLLM, options), address=settings.ray_address, hardware=spec.hardware)
    from tuner.workers.executors import build_evaluator

    evaluator = build_evaluator(EvaluatorRecipe(Engine.VLLM, options))
    gpus = [int(g) for g in settings.gpus.split(",")] if settings.gpus else ([] if settings.cpu_vllm else None)
    return LocalExecutor(evaluator, gpus=gpus, lease_dir=lease_dir, hardware=spec.hardware, engine=Engine.VLLM)


def make_runner(settings: Settings, factory: sessionmaker[Session], *, report: bool = True) -> JobRunner:
    report_data = host_report(settings) if report else None
    return JobRunner(
        factory,
        planner_factory=lambda job_id, spec, reqs: make_planner(settings, job_id, spec, reqs),
        executor_factory=lambda spec: make_executor(settings, spec),
        worker=settings.worker_name,
        heartbeat_s=settings.heartbeat_s,
        stale_after_s=settings.stale_after_s,
        poll_s=settings.poll_s,
        log_dir=settings.log_dir,
        host_report=report_data,
        hardware=claimable_hardware(settings, report_data),
    )


def claimable_hardware(settings: Settings, report: dict[str, Any] | None) -> list[str] | None:
    """The chips a runner claims jobs for: its own GPUs' family locally; anything behind a Ray cluster."""
    if settings.executor == "ray" or report is None:
        return None
    family = report.get("hardware")
    return [family] if family else []
