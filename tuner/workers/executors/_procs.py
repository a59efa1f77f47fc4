"""Killing a trial's process group (the vLLM server and its children) from wherever it was left."""

from __future__ import annotations

import os
import signal
import time


def kill_group(pgid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM then SIGKILL process group ``pgid``; True once it has no live member."""
    try:
        from tuner.workers.vllm_server import kill_process_group
    except ImportError:  # the runner module is optional here
        return _kill_group(pgid, grace_s)
    return kill_process_group(pgid, grace_s=grace_s)


def group_alive(pgid: int) -> bool:
    try:
        from tuner.workers.vllm_server import group_members
    except ImportError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return bool(group_members(pgid))


def _kill_group(pgid: int, grace_s: float) -> bool:
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return True
            time.sleep(0.05)
    return not group_alive(pgid)
