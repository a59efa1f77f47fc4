"""Classify a failed trial from the server's log tail and what the runner saw.

Order matters: an out-of-memory error often surfaces as an ``EngineDeadError`` or a ``ValueError`` further
down, so memory is checked first, then vLLM refusing the configuration, then crashes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from tuner.domain import Failure, FailureClass


class Phase(StrEnum):
    """Where the runner was when the trial stopped."""

    STARTUP = "startup"  # before /health answered
    RUNNING = "running"  # measuring


@dataclass(frozen=True)
class Observation:
    """What the runner knows besides the log."""

    phase: Phase
    process_exited: bool = False
    returncode: int | None = None
    timed_out: bool = False  # startup deadline or the trial's own deadline passed
    cancelled: bool = False
    request_errors: int = 0
    requests: int = 0
    error_sample: str | None = None  # one failed request's message


_OOM = re.compile(
    r"(?:CUDA|HIP|XPU)? ?out of memory|OutOfMemoryError|No available memory for the cache blocks"
    r"|larger than the available KV cache memory|hipErrorOutOfMemory|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)
_ENGINE_DEAD = re.compile(r"EngineDeadError|EngineCore encountered an issue|Engine core proc .* died")
_PYDANTIC = re.compile(r"ValidationError: \d+ validation errors? for (\w+)")
_ARGPARSE = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)
_REFUSAL = re.compile(r"^(?:\S*\.)?(ValueError|NotImplementedError|TypeError|AssertionError|KeyError): (.+)$")


def _oom_line(log: str) -> str | None:
    lines = [ln for ln in log.splitlines() if _OOM.search(ln)]
    return lines[-1].strip() if lines else None


def _refusal(log: str) -> str | None:
    """vLLM's own message when it refuses a configuration at start: pydantic, argparse or a raised error."""
    lines = log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if _PYDANTIC.search(lines[i]):
            body = [lines[i].strip()]
            for ln in lines[i + 1 : i + 8]:
                if not ln.startswith("  ") or "errors.pydantic.dev" in ln:
                    break
                body.append(ln.strip())
            return " ".join(body)
    argparse_err = _ARGPARSE.findall(log)
    if argparse_err:
        return argparse_err[-1].strip()
    for ln in reversed(lines):
        m = _REFUSAL.match(_strip_prefix(ln))
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


def _strip_prefix(line: str) -> str:
    # vLLM prefixes worker lines with "(EngineCore pid=123) " or "(APIServer pid=1) ".
    return re.sub(r"^\(\w+ pid=\d+\)\s*", "", line.strip())


def _last_error_line(log: str) -> str | None:
    for ln in reversed(log.splitlines()):
        s = _strip_prefix(ln)
        if re.match(r"^[\w.]+(Error|Exception)\b", s) or " ERROR " in s:
            return s
    return None


def classify(log_tail: str, obs: Observation) -> Failure:
    """One failure record: class, a one-line reason, and the log tail it was read from."""

    def fail(cls: FailureClass, reason: str) -> Failure:
        return Failure(cls, reason, log_tail)

    if obs.cancelled:
        return fail(FailureClass.CANCELLED, f"cancelled during {obs.phase.value}")
    oom = _oom_line(log_tail)
    if oom:
        return fail(FailureClass.OOM, oom)
    if obs.process_exited:
        if obs.phase is Phase.STARTUP:
            refusal = _refusal(log_tail)
            if refusal:
                return fail(FailureClass.UNSUPPORTED, refusal)
        detail = _last_error_line(log_tail) or f"exit code {obs.returncode}"
        return fail(FailureClass.CRASH, f"server exited during {obs.phase.value}: {detail}")
    if _ENGINE_DEAD.search(log_tail):
        return fail(FailureClass.CRASH, _last_error_line(log_tail) or "EngineDeadError")
    if obs.timed_out:
        if obs.phase is Phase.STARTUP:
            return fail(FailureClass.STARTUP_TIMEOUT, "server did not answer /health before the deadline")
        return fail(FailureClass.TIMEOUT, "trial deadline passed while measuring")
    if obs.request_errors:
        sample = f"; e.g. {obs.error_sample}" if obs.error_sample else ""
        return fail(FailureClass.REQUEST_ERRORS, f"{obs.request_errors} of {obs.requests} requests failed{sample}")
    return fail(FailureClass.INTERNAL, _last_error_line(log_tail) or "unclassified failure")
