"""The serving side of a trial: the target model, the allowlisted ``vllm serve`` arguments and environment,
and the one function that turns a configuration into ``vllm serve`` argv."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain.capabilities import LEGACY_SCHEDULE_FIELD
from tuner.domain.spec_config import SpecConfig


@dataclass(frozen=True)
class ModelRef:
    """The target model: an HF id (with revision) or a path that exists on the workers."""

    name: str
    revision: str | None = None
    trust_remote_code: bool = False


class UnsafeArgument(ValueError):
    """A value that must not reach a command line (it could be read as an option, or carries control bytes)."""


def argv_value_problem(value: str) -> str | None:
    """Why ``value`` (a model, revision, draft checkpoint or string serving value) may not be put on a vLLM
    command line; None when it may. A leading ``-`` would make vLLM's parser read it as an option (``model:
    "--trust-remote-code"``); NUL and other control characters have no business in an id or a path."""
    if not value:
        return "must not be empty"
    if value.startswith("-"):
        return "must not start with '-' (it would be read as a command-line option)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "must not contain NUL or other control characters"
    return None


def check_argv_value(field: str, value: str) -> str:
    """``value`` unchanged, or :class:`UnsafeArgument` naming ``field``."""
    problem = argv_value_problem(value)
    if problem is not None:
        raise UnsafeArgument(f"{field} {problem}")
    return value


# vLLM serve arguments a job may set, with the Python type each takes. Anything else is refused so that a
# job cannot smuggle in flags that change what is measured (or --speculative-config itself).
SERVING_ARG_TYPES: dict[str, type] = {
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "max_model_len": int,
    "dtype": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "gpu_memory_utilization": float,
    "quantization": str,
    "kv_cache_dtype": str,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "enforce_eager": bool,
    "block_size": int,
    "attention_backend": str,
    "compilation_config": str,
    "seed": int,
    "swap_space": float,
    "load_format": str,
    "tokenizer": str,
}
# Environment variables a job may set, as exact names or prefixes ending in '*'.
SERVING_ENV_ALLOWED: tuple[str, ...] = (
    "VLLM_ROCM_USE_AITER*",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_TRITON_FLASH_ATTN",
    "VLLM_ROCM_CUSTOM_PAGED_ATTN",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "NCCL_*",
    "RCCL_*",
    "HSA_*",
    "PYTORCH_TUNABLEOP_*",
    "OMP_NUM_THREADS",
)


# Under the allowed prefixes, names that load a library or name a file to write or read are refused: a
# tuning job must not make a worker's vLLM dlopen a plugin or write over a file (HSA_TOOLS_LIB,
# NCCL_NET_PLUGIN, NCCL_DEBUG_FILE, ...).
_ENV_DENIED_SUFFIXES = ("_LIB", "_LIBS", "_PLUGIN", "_FILE", "_FILENAME", "_PATH", "_DIR", "_PREFIX")
# Path-taking variables that are useful to tune with: allowed, but their value is confined to the trial's
# own directory (only the file's base name is kept; see tuner.workers.environment).
SERVING_ENV_CONFINED_PATHS: tuple[str, ...] = ("PYTORCH_TUNABLEOP_FILENAME", "PYTORCH_TUNABLEOP_UNTUNED_FILENAME")


def env_name_problem(name: str) -> str | None:
    """Why a job may not set environment variable ``name``; None when it may."""
    if not name or "=" in name or any(ord(ch) < 32 for ch in name):  # NUL among the control characters
        return "is not a valid environment variable name"
    if name in SERVING_ENV_CONFINED_PATHS:
        return None
    if not any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in SERVING_ENV_ALLOWED):
        return "is not allowed (see SERVING_ENV_ALLOWED)"
    if name.endswith(_ENV_DENIED_SUFFIXES):
        return "is not allowed: it loads a library or names a file"
    return None


def env_name_allowed(name: str) -> bool:
    return env_name_problem(name) is None


@dataclass(frozen=True)
class ServingConfig:
    """The production serving configuration every trial of a job reproduces (allowlisted args and env)."""

    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", dict(sorted(self.args.items())))
        object.__setattr__(self, "env", dict(sorted(self.env.items())))

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.args.get("tensor_parallel_size", 1))

    def to_cli_args(self) -> list[str]:
        """vLLM CLI flags for these args (booleans as ``--flag`` / ``--no-flag``)."""
        out: list[str] = []
        for name, value in self.args.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, str):
                # "--flag=value": the parser takes what follows "=" as the value whatever it looks like
                out.append(f"{flag}={check_argv_value(name, value)}")
            else:
                out.extend([flag, str(value)])
        return out


def serve_argv(
    model: ModelRef, serving: ServingConfig, spec: SpecConfig, *, schedule_field: str = LEGACY_SCHEDULE_FIELD
) -> list[str]:
    """The one place a configuration becomes ``vllm serve`` arguments: what a trial measures and what a
    recommendation deploys (``vllm serve <these>``).

    The model comes first, as ``vllm serve`` takes it (positional); then revision, remote code, the serving
    args, and the speculative config as canonical JSON (sorted keys, no spaces). No speculative config means
    no flag at all: ``num_speculative_tokens: 0``, or K=0 in a schedule, is a configuration, not "off".
    Runners add only their runtime extras around this (host, port, platform flags). A schedule goes under
    ``schedule_field``, the name the worker's vLLM takes it by (``VllmCapabilities.schedule_field``).
    Strings from the job are checked (:func:`argv_value_problem`, :class:`UnsafeArgument`) and passed as
    ``--flag=value``; the model is positional in ``vllm serve``, so a leading ``-`` is refused outright.
    """
    argv = [check_argv_value("model", model.name)]
    if model.revision:
        argv.append(f"--revision={check_argv_value('revision', model.revision)}")
    if spec.model:
        check_argv_value("draft model", spec.model)  # inside the JSON config, but vLLM loads it as a model
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += serving.to_cli_args()
    if spec.target_backend and "attention_backend" not in serving.args:
        argv.append(f"--attention-backend={check_argv_value('attention backend', spec.target_backend)}")
    config = spec.to_vllm(schedule_field)
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"), sort_keys=True)]
    return argv


def serve_env(serving: ServingConfig, spec: SpecConfig) -> dict[str, str]:
    """The environment a configuration runs with beyond the worker's, beside :func:`serve_argv`: what the
    configuration needs (an AITER backend's ``VLLM_ROCM_USE_AITER=1``) under the job's serving env, which
    may override it. What a trial's server gets and what a recommendation deploys."""
    return {**spec.serve_env(), **serving.env}
