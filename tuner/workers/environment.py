"""The environment a launched vLLM server gets: the worker's own minus its secrets, plus the job's variables.

vLLM needs most of what the worker has (PATH, the HF cache and token for gated models, ROCm/CUDA setup), so the
server inherits the worker's environment, minus a denylist: every ``TUNER_*`` variable (the database URL with
its password among them), database and Ray credentials, and any ``*_TOKEN``/``*_PASSWORD``/``*_SECRET`` other
than the Hugging Face token. The job's own variables (checked at submit by
:func:`tuner.domain.env_name_problem`) come on top; a path-taking one (``PYTORCH_TUNABLEOP_FILENAME``) is
confined to the trial's directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePath

from tuner.domain import SERVING_ENV_CONFINED_PATHS

# The Hugging Face token stays: gated models need it, and it is the worker's, configured for that purpose.
KEPT = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
DENIED = frozenset(
    {
        "DATABASE_URL",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICEFILE",
        "RAY_AUTH_TOKEN",
        "RAY_REDIS_PASSWORD",
        "REDIS_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }
)
DENIED_PREFIXES = ("TUNER_",)
DENIED_SUFFIXES = ("_TOKEN", "_PASSWORD", "_SECRET", "_SECRET_KEY", "_API_KEY")


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment without its secrets."""
    return {
        k: v
        for k, v in env.items()
        if k in KEPT or not (k in DENIED or k.startswith(DENIED_PREFIXES) or k.endswith(DENIED_SUFFIXES))
    }


def confined(job_env: Mapping[str, str], trial_dir: Path) -> dict[str, str]:
    """The job's variables, path-taking ones rewritten to a file of that base name in ``trial_dir``."""
    out = dict(job_env)
    for name in SERVING_ENV_CONFINED_PATHS:
        if name in out:
            base = PurePath(out[name]).name or "file"
            trial_dir.mkdir(parents=True, exist_ok=True)
            out[name] = str(trial_dir / base)
    return out


def server_env(
    worker: Mapping[str, str], extra: Mapping[str, str], job_env: Mapping[str, str], trial_dir: Path
) -> dict[str, str]:
    """What a trial's server runs with: inherited, then the platform's extras (trusted settings), then the job's."""
    return {**inherited(worker), **extra, **confined(job_env, trial_dir)}
