"""Process groups a trial starts (a vLLM server, a placeholder): launched gated, found, killed.

A server runs in its own session, so its API server, EngineCore and workers share one process group that can
be signalled as a whole, by us or by whoever recovers a dead runner. For that, the group must be recorded
somewhere before it can hold anything: :func:`start_gated` starts a tiny gate in the new session that waits
on a pipe; the caller records the pgid (the GPU lease file, the store), then opens the gate and the gate
``exec``s the real argv (same pid, same group). If the caller dies before opening it, the pipe closes, the
gate reads end-of-file and exits: nothing ran that nobody knows about.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

KILL_GRACE_S = 10.0  # SIGTERM-to-SIGKILL grace when an executor cleans up a trial's processes

# argv of the gate: python -c GATE <fd> <argv...>. Reads "go" or end-of-file; only "go" runs the command.
_GATE = (
    "import os,sys\n"
    "fd=int(sys.argv[1])\n"
    "ok=os.read(fd,2)==b'go'\n"
    "os.close(fd)\n"
    "sys.exit(75) if not ok else os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def _resolvable(program: str, env: Mapping[str, str] | None) -> bool:
    if os.sep in program:
        return os.access(program, os.X_OK)
    path = (env or os.environ).get("PATH", os.defpath)
    return shutil.which(program, path=path) is not None


def start_gated(argv: Sequence[str], *, on_started: Callable[[int], None], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, start_new_session=True, **popen)`` that runs nothing until ``on_started(pgid)``
    returned. If ``on_started`` raises, the command never runs; the error is raised.

    A missing program raises FileNotFoundError here, as Popen would (the gate would only exit)."""
    if not argv:
        raise ValueError("empty argv")
    if not _resolvable(argv[0], popen.get("env")):
        raise FileNotFoundError(f"no executable {argv[0]!r}")
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _GATE, str(read_end), *argv],
            pass_fds=(read_end,),
            start_new_session=True,
            **popen,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        on_started(proc.pid)  # a new session's leader is its own group leader: pgid == pid
    except BaseException:
        os.close(write_end)  # end-of-file: the gate exits without running the command
        proc.wait()
        raise
    try:
        os.write(write_end, b"go")
    finally:
        os.close(write_end)
    return proc


def leader_start_time(pgid: int) -> int | None:
    """The group leader's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pgid, it
    names one process for good, where the pgid alone may be reused by an unrelated process later."""
    try:
        stat = Path(f"/proc/{int(pgid)}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()
    return int(rest[19]) if len(rest) > 19 else None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``, read from /proc."""
    members: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ')'.
        rest = stat[stat.rfind(")") + 2 :].split()
        if rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry))
    return members


def group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a live (non-zombie) member; zombies hold no GPU."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return bool(group_members(pgid))


def kill_process_group(pgid: int, grace_s: float = 20.0, poll_s: float = 0.1) -> bool:
    """SIGTERM the group, SIGKILL it after ``grace_s``; True once no live member remains.

    Safe to call for a group that is already gone. Meant also for recovering the processes of a runner
    that died, from the pgid stored with its trial or in the GPU lease.
    """
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid):
            return True
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return True
            time.sleep(poll_s)
    return not group_members(pgid)
