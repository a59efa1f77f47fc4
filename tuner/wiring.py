"""The composition root: builds the planner (tuner.search) and executor (tuner.workers) a job runner uses.

This is the one module that knows all the packages; api, search, workers and store know only the domain.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from tuner.domain import (
    Engine,
    Evaluator,
    JobSpec,
    Method,
    Planner,
    TrafficRequest,
    TrialExecutor,
    VllmCapabilities,
)
from tuner.errors import InvalidInput
from tuner.job_runner import JobRunner
from tuner.settings import Settings

if TYPE_CHECKING:
    from tuner.search import CompatRule
    from tuner.workers.executors import EvaluatorRecipe, ExecutorBackend, Placement

log = logging.getLogger("tuner.wiring")


_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def study_name(job_id: str, spec: JobSpec) -> str:
    """The Optuna study of a job: ``tuner/<model>/<hardware>/<engine>/<job id>``, e.g.
    ``tuner/Llama-3.1-8B-Instruct/mi300x/vllm/3f2a...``, so a person scanning optuna-dashboard's study list
    finds the job. Deterministic from the stored job (the hardware as submitted, "auto" included, not as a
    worker resolved it), so a runner taking the job over opens the same study. ``<model>`` is the last part
    of the model's id or path, with anything but letters, digits, ``.``, ``_`` and ``-`` made ``_``."""
    model = _NAME_UNSAFE.sub("_", spec.model.name.rstrip("/").rsplit("/", 1)[-1])[:64] or "model"
    hardware = _NAME_UNSAFE.sub("_", spec.hardware)[:50] or "auto"
    return f"tuner/{model}/{hardware}/{spec.engine.value}/{job_id}"


def former_study_names(job_id: str) -> tuple[str, ...]:
    """Names a job's study had before :func:`study_name`: a job started under one resumes its study."""
    return (f"tuner-job-{job_id}",)


def study_attrs(job_id: str, spec: JobSpec) -> dict[str, Any]:
    """What a job's study says about the job (optuna-dashboard lists a study's user attrs beside its name)."""
    return {
        "job_id": job_id,
        "model": spec.model.name,
        "revision": spec.model.revision,
        "hardware": spec.hardware,
        "engine": spec.engine.value,
        "simulated": spec.engine is Engine.SIMULATED,
        "objective": spec.objective.value,
    }


def executor_backend(settings: Settings) -> ExecutorBackend:
    """The kind of executor this worker's trials run on (``TUNER_EXECUTOR``), from the workers' registry."""
    from tuner.workers.executors import EXECUTORS

    return EXECUTORS[settings.executor]


def placement(settings: Settings) -> Placement:
    """Where this worker's trials may run, read from its settings for the executor backend. On the SQLite
    store a local executor runs one trial at a time: SQLite takes one writer at a time, and parallel trials
    on one file (several runners, Optuna's storage) end in "database is locked"; use PostgreSQL for parallel
    trials."""
    from tuner.workers.executors import Placement

    gpus = tuple(int(g) for g in settings.gpus.split(",")) if settings.gpus else (() if settings.cpu_vllm else None)
    return Placement(
        lease_dir=lease_dirs(settings)[0],
        gpus=gpus,
        max_parallel=1 if settings.db_url.startswith("sqlite") else None,
        vllm_python=settings.vllm_python,
        ray_address=settings.ray_address,
        num_cpus_per_trial=ray_trial_cpus(settings),
    )


def host_report(settings: Settings) -> dict[str, Any]:
    """What this worker reports: chip, count, memory, driver and vLLM version (cached per process).

    A Ray runner reports the cluster's GPU nodes (chip, count, memory, driver and vLLM version per node, as
    each node detects them) instead of the driver's host; ``hardware`` is the cluster's family when it has
    one, else None (``families`` lists them). Re-read every few minutes."""
    return executor_backend(settings).report(placement(settings))


def optuna_storage_url(settings: Settings) -> str:
    """The store's URL for Optuna. On SQLite with the driver's ``timeout`` (seconds a writer waits for the
    database lock) raised from pysqlite's 5 s to 30 s, as our own engine has it: several runners on one
    SQLite file otherwise hit "database is locked". SQLAlchemy's pysqlite dialect reads ``timeout`` from the
    URL, so this needs no Optuna import here (only tuner.search imports Optuna)."""
    url = settings.db_url
    if not url.startswith("sqlite") or "timeout=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}timeout=30"


def make_planner(settings: Settings, job_id: str, spec: JobSpec, requests: list[TrafficRequest]) -> Planner:
    from tuner.search import OptunaPlanner, build_space, read_model_config

    if spec.model.trust_remote_code and not settings.allow_trust_remote_code:
        # The API checked its own settings; a worker runs the model's code, so it decides for itself too.
        raise InvalidInput("trust_remote_code is not allowed on this worker (TUNER_ALLOW_TRUST_REMOTE_CODE)")
    config = read_model_config(spec.model.name, supplied=spec.model_config, revision=spec.model.revision)
    capabilities = None
    vllm_version: str | None
    if spec.engine is Engine.SIMULATED:
        vllm_version = "0.34.0"  # the simulated engine models current vLLM
        hardware = spec.hardware
    else:
        report = host_report(settings)
        vllm_version = report.get("vllm_version")
        hardware = spec.hardware if spec.hardware != "auto" else str(report.get("hardware") or "auto")
        if report.get("vllm_capabilities"):
            capabilities = VllmCapabilities.from_dict(report["vllm_capabilities"])
    space = build_space(
        spec.model.name,
        config,
        hardware=hardware,
        vllm_version=vllm_version,
        methods=spec.methods,
        depth_range=spec.depth_range,
        drafts={Method(m): list(p) for m, p in spec.drafts.items()} or None,
        compat_overrides={Method(m): allow for m, allow in spec.compat_overrides.items()} or None,
        attention_backends=(
            {Method(m): b for m, b in spec.attention_backends.items()}
            if isinstance(spec.attention_backends, Mapping)
            else spec.attention_backends
        ),
        target_backend_pinned="attention_backend" in spec.serving.args,
        rules=compat_rules(settings),
        capabilities=capabilities,
        data_parallel_size=int(spec.serving.args.get("data_parallel_size", 1)),
    )
    max_num_seqs = spec.serving.args.get("max_num_seqs")
    return OptunaPlanner(
        space,
        spec.levels,
        objective=spec.objective,
        slo=spec.slo,
        budget=spec.budget,
        storage=optuna_storage_url(settings),
        study_name=study_name(job_id, spec),
        former_study_names=former_study_names(job_id),
        study_attrs=study_attrs(job_id, spec),
        seed=spec.seed,
        confirm_runs=spec.confirm_runs,
        level_weights=spec.level_weights,
        max_num_seqs=int(max_num_seqs) if max_num_seqs else None,
        keep_outputs=False,  # the trial rows hold them, where DELETE /traffic removes them
    )


def simulated_recipe(spec: JobSpec, *, pace_s: float = 0.0, placeholder_process: bool = False) -> EvaluatorRecipe:
    """The simulated engine of a job as a picklable recipe (built in a thread here, or on a Ray node): the
    model profile is read here, once, so every node simulates the same model."""
    from tuner.search import read_model_config
    from tuner.workers.executors import EvaluatorRecipe
    from tuner.workers.simulated import ModelProfile

    config = read_model_config(spec.model.name, supplied=spec.model_config, revision=spec.model.revision)
    options = {
        "model": ModelProfile.from_hf_config(config) if config else None,
        "seed": spec.seed,
        "hardware": spec.hardware if spec.hardware != "auto" else "simulated",
        "vllm_version": "simulated",
        "pace_s": pace_s,
        "placeholder_process": placeholder_process,
    }
    return EvaluatorRecipe(Engine.SIMULATED, options)


def simulated_evaluator(spec: JobSpec, *, pace_s: float = 0.0, placeholder_process: bool = False) -> Evaluator:
    from tuner.workers.executors import build_evaluator

    return build_evaluator(simulated_recipe(spec, pace_s=pace_s, placeholder_process=placeholder_process))


def runner_options(settings: Settings, log_dir: Path) -> dict[str, Any]:
    from tuner.workers.options import CPU_SERVER_ENV, default_client_cpus

    ray = executor_backend(settings).reserves_trial_cpus  # a trial reserves a CPU per client up front
    client_cpus = settings.client_cpu_list
    if settings.client_cpus_auto and not ray:
        client_cpus = default_client_cpus()
    options: dict[str, Any] = {
        "log_dir": str(log_dir),
        "startup_timeout_s": settings.startup_timeout_s,
        "extra_env": dict(settings.vllm_extra_env),
        "return_token_ids": settings.return_token_ids,
        "client_processes": settings.client_processes,
        "client_cpus": client_cpus,
        "model_roots": settings.model_root_list,
    }
    if ray:
        options["max_client_processes"] = ray_client_processes(settings)
    elif settings.max_client_processes is not None:
        options["max_client_processes"] = settings.max_client_processes
    if settings.vllm_executable:
        options["vllm_command"] = (settings.vllm_executable, "serve")
    if settings.vllm_python:
        options["vllm_python"] = settings.vllm_python
    if settings.cpu_vllm:
        options["extra_env"] = {**CPU_SERVER_ENV, **options["extra_env"]}
        options["extra_args"] = ("--enforce-eager",)
    return options


def ray_client_processes(settings: Settings) -> int:
    """Client processes a trial may use under Ray: each gets a CPU of the trial's reservation."""
    return max(settings.client_processes, settings.max_client_processes or 2)


def ray_trial_cpus(settings: Settings) -> float:
    """The CPUs a Ray trial reserves: one for the runner and the server's API process, one per client."""
    return 1.0 + ray_client_processes(settings)


def make_executor(settings: Settings, spec: JobSpec) -> TrialExecutor:
    """The executor one job's trials run on, built by the backend of ``TUNER_EXECUTOR`` (see
    :mod:`tuner.workers.executors.registry`) from the job's recipe: the simulated engine or the vLLM runner.

    ``ray``: a Ray executor for the job's hardware, for vLLM and simulated jobs alike (simulated trials then
    take GPUs of the job's chip like real ones); a simulated job for a chip the cluster lacks runs on this
    host's CPU instead, as it would locally. ``local``: a local executor on this host's GPUs (one trial at a
    time on SQLite, see :func:`placement`), the CPU slot for simulated jobs.
    """
    from tuner.workers.executors import EvaluatorRecipe

    if spec.engine is Engine.SIMULATED:
        recipe = simulated_recipe(
            spec, pace_s=settings.simulated_trial_s, placeholder_process=settings.simulated_placeholder_process
        )
    else:
        recipe = EvaluatorRecipe(Engine.VLLM, runner_options(settings, settings.log_dir))
    return executor_backend(settings).executor(recipe, hardware=spec.hardware, placement=placement(settings))


def compat_rules(settings: Settings) -> tuple[CompatRule, ...]:
    """The server's own compatibility rules (TUNER_COMPAT_RULES_FILE), checked before the built-in table."""
    from tuner.search import DEFAULT_RULES, load_rules

    if settings.compat_rules_file is None:
        return DEFAULT_RULES
    return (*load_rules(settings.compat_rules_file), *DEFAULT_RULES)


def make_runner(settings: Settings, factory: sessionmaker[Session], *, report: bool = True) -> JobRunner:
    # Read here so a bad rules file stops the runner at start; make_planner reads it again per job, so an
    # edited file applies without a restart (a few rules: cheap next to planning).
    from tuner.workers.process_group import KILL_GRACE_S, group_alive, kill_process_group

    compat_rules(settings)
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
        trial_deadline_s=settings.trial_deadline_s,
        held_by_live_runner=lambda pgid: _held_by_live_runner(settings, pgid),
        kill_group=lambda pgid: kill_process_group(pgid, grace_s=KILL_GRACE_S),
        group_alive=group_alive,
        db_retry_s=settings.db_retry_s,
    )


def _held_by_live_runner(settings: Settings, pgid: int) -> bool:
    from tuner.workers.gpu_lease import held_by_live_holder

    return held_by_live_holder(lease_dirs(settings), pgid)


def lease_dirs(settings: Settings) -> list[Path]:
    """The GPU lease directories of this host's workers (GPUs, and the CPU-only slot)."""
    root = settings.data_dir / "gpu-leases"
    return [root, root / "cpu"]


def claimable_hardware(settings: Settings, report: dict[str, Any] | None) -> Sequence[str] | None:
    """The chips a runner claims jobs for (besides "auto" and simulated jobs).

    Locally: its GPUs' family (each family on a mixed host; None without a report: anything). With Ray: the
    families of the cluster's GPU nodes, read from their accelerator types and re-read as nodes join and
    leave, so a Ray runner never claims a job for a chip its cluster lacks."""
    return executor_backend(settings).claimable_hardware(placement(settings), report)
