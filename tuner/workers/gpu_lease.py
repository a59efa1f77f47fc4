"""A lease on this host's GPUs shared by every ``tuner worker`` process: never two trials on one GPU.

One lock file per GPU (``gpu-<index>.lock``) in a shared directory, held with ``fcntl.flock``. A flock
belongs to the open file, so it is released when the group is closed, when the holder process dies (even
by SIGKILL), and it excludes other threads of the same process too, because each acquisition opens the
file anew. The holder writes its pid and a label into the file for people reading it.

The lock alone is not enough: a vLLM server runs in its own session and outlives a worker that crashed, so
the GPUs are still in use after the flock went away. The holder therefore also writes the server's process
group id into the file (``LeasedGroup.record_pgid``) and a GPU whose file names a live process group is busy
even when its flock is free, until that group is gone (the job's next runner kills it when it recovers the
job). A clean release empties the file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_POLL_S = 0.05
_PGID_LINE = re.compile(r"^pgid=(\d+)$", re.MULTILINE)

log = logging.getLogger(__name__)


class LeasedGroup:
    """A disjoint group of GPUs held until ``close()`` (or the holder's death)."""

    def __init__(self, gpus: tuple[int, ...], fds: dict[int, int]):
        self.gpus = gpus
        self._fds = fds
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return not self._fds

    def record_pgid(self, pgid: int) -> None:
        """Note a process group (a server the trial started) in every lease file of the group, so that if
        this process dies while the group lives on, the GPUs stay busy for everyone else."""
        line = f"pgid={int(pgid)}\n".encode()
        with self._lock:
            for fd in self._fds.values():
                os.pwrite(fd, line, os.fstat(fd).st_size)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> LeasedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten group must not hold GPUs for the process lifetime
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"LeasedGroup(gpus={self.gpus}, closed={self.closed})"


class GpuLease:
    """Hands out disjoint GPU groups among a host's GPUs, across threads and processes."""

    def __init__(self, lease_dir: str | os.PathLike[str]):
        self.lease_dir = Path(lease_dir)
        self.lease_dir.mkdir(parents=True, exist_ok=True)
        self._warned: set[tuple[int, int]] = set()
        self._warned_lock = threading.Lock()

    def _path(self, gpu: int) -> Path:
        return self.lease_dir / f"gpu-{int(gpu)}.lock"

    def _try_lock(self, gpu: int) -> int | None:
        fd = os.open(self._path(gpu), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            orphan = _live_pgid(fd)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if orphan is not None:  # the holder died, the server it started did not: still busy
            _release(fd)
            self._warn_orphan(gpu, orphan)
            return None
        return fd

    def _warn_orphan(self, gpu: int, pgid: int) -> None:
        with self._warned_lock:
            if (gpu, pgid) in self._warned:
                return
            self._warned.add((gpu, pgid))
        log.warning(
            "GPU %s is free in the lease but its file %s names process group %s, still alive (a worker died "
            "and left its server running): treating the GPU as busy until that group is gone",
            gpu,
            self._path(gpu),
            pgid,
        )

    def try_acquire(self, n: int, among: Sequence[int], label: str = "") -> LeasedGroup | None:
        """One attempt: a group of ``n`` free GPUs (aligned blocks preferred), or None.

        Every free candidate is locked for an instant, the preferred group is kept and the rest let go,
        so a competing process sees at worst a brief false "busy" and retries."""
        if n <= 0:
            return LeasedGroup((), {})
        held: dict[int, int] = {}
        try:
            for gpu in sorted(set(among)):
                fd = self._try_lock(gpu)
                if fd is not None:
                    held[gpu] = fd
            if len(held) < n:
                return None
            group = _choose(n, sorted(held))
            for gpu in list(held):
                if gpu not in group:
                    _release(held.pop(gpu))
            for gpu, fd in held.items():
                _describe(fd, gpu, label)
            leased = LeasedGroup(group, held)
            held = {}
            return leased
        finally:
            for fd in held.values():
                _release(fd)

    def acquire(
        self, n: int, among: Sequence[int], timeout: float | None = None, label: str = ""
    ) -> LeasedGroup | None:
        """Wait up to ``timeout`` seconds (None: forever, 0: one try) for ``n`` GPUs among ``among``."""
        if n > len(set(among)):
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            group = self.try_acquire(n, among, label)
            if group is not None:
                return group
            if deadline is not None and time.monotonic() >= deadline:
                return None
            # jitter so two processes contending for overlapping blocks do not retry in lock step
            pause = _POLL_S * (1 + random.random())
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    def free(self, among: Sequence[int]) -> tuple[int, ...]:
        """The GPUs nobody holds right now (probed by locking and unlocking each)."""
        out = []
        for gpu in sorted(set(among)):
            fd = self._try_lock(gpu)
            if fd is not None:
                _release(fd)
                out.append(gpu)
        return tuple(out)

    def holders(self, among: Sequence[int]) -> dict[int, str]:
        """What each held GPU's file says about its holder (for status pages and debugging)."""
        busy = set(among) - set(self.free(among))
        out = {}
        for gpu in sorted(busy):
            try:
                out[gpu] = self._path(gpu).read_text().strip()
            except OSError:
                out[gpu] = ""
        return out


def _choose(n: int, free: list[int]) -> tuple[int, ...]:
    """Aligned blocks first (0-1, 2-3 for n=2; 0-3, 4-7 for n=4), then neighbouring GPUs, then any: TP
    groups stay on adjacent GPUs when they can and still form when they cannot."""
    free_set = set(free)
    top = max(free) + 1
    for start in range(0, top, n):
        block = tuple(range(start, start + n))
        if free_set.issuperset(block):
            return block
    for start in range(top):
        block = tuple(range(start, start + n))
        if free_set.issuperset(block):
            return block
    return tuple(free[:n])


def _live_pgid(fd: int) -> int | None:
    """The first process group named in a lease file that still has a live member, if any."""
    from tuner.workers.vllm_server import group_alive

    text = os.pread(fd, 4096, 0).decode(errors="replace")
    for match in _PGID_LINE.finditer(text):
        pgid = int(match.group(1))
        if group_alive(pgid):
            return pgid
    return None


def _release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _describe(fd: int, gpu: int, label: str) -> None:
    text = f"pid={os.getpid()} gpu={gpu} {label}".strip() + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
