"""A lease on this host's GPUs shared by every ``tuner worker`` process: never two trials on one GPU.

One lock file per GPU (``gpu-<index>.lock``) in a shared directory, held with ``fcntl.flock``. A flock
belongs to the open file, so it is released when the group is closed, when the holder process dies (even
by SIGKILL), and it excludes other threads of the same process too, because each acquisition opens the
file anew. The holder writes its pid and a label into the file for people reading it.

The lock alone is not enough: a vLLM server runs in its own session and outlives a worker that crashed, so
the GPUs are still in use after the flock went away. The holder therefore also writes the server's process
group id (and its leader's start time, so a reused pid is never taken for it) into the file
(``LeasedGroup.record_pgid``) before the server runs anything (``process_group.start_gated``). A file whose
flock is free but which names a live group was left by a holder that died: the next process to lock it kills
that group first (it is on this host, and nobody else knows of it when the worker died before the store
did). A flock still held means its holder is alive (``held_by_live_holder``): a runner fenced off its job
still holds the lease and stops its own server, so a recovering runner must not kill it. A clean release
empties the file.

The label says whose trial holds the GPUs (``job=<id> trial=<n>``), so a runner taking over a job finds what
the job's previous runner left on this host (``left_running``): groups whose holder is gone, to kill, and
groups a live holder still has. Where something else hands out the GPUs (Ray), a trial keeps the same kind of
file without a GPU (``trial_record``), so the same reading applies on every node.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import re
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.workers.process_group import group_alive, kill_process_group, leader_start_time

_POLL_S = 0.05
_PGID_LINE = re.compile(r"^pgid=(\d+)(?: start=(\d+))?$", re.MULTILINE)
_JOB_FIELD = re.compile(r"(?:^|\s)job=(\S+)")
_REAP_GRACE_S = 5.0

log = logging.getLogger(__name__)


class LeasedGroup:
    """A disjoint group of GPUs held until ``close()`` (or the holder's death)."""

    def __init__(self, gpus: tuple[int, ...], fds: dict[int, int], *, remove: Path | None = None):
        self.gpus = gpus
        self._fds = fds
        self._remove = remove  # a trial record's file, removed on close (a GPU's file stays, emptied)
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return not self._fds

    def record_pgid(self, pgid: int) -> None:
        """Note a process group (a server the trial started) in every lease file of the group, so that if
        this process dies while the group lives on, the GPUs stay busy for everyone else."""
        start = leader_start_time(pgid)
        line = (f"pgid={int(pgid)}" + (f" start={start}" if start is not None else "") + "\n").encode()
        with self._lock:
            for fd in self._fds.values():
                os.pwrite(fd, line, os.fstat(fd).st_size)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
            remove, self._remove = self._remove, None
        if remove is not None and fds:
            remove.unlink(missing_ok=True)  # before the unlock: nobody reads the file as left by a dead holder
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
        if orphan is not None:  # the holder died, the server it started did not: ours to kill, under the flock
            log.warning(
                "GPU %s: its lease file %s names process group %s, still alive, but its holder is gone (a worker "
                "died and left its server running): killing the group",
                gpu,
                self._path(gpu),
                orphan,
            )
            if not kill_process_group(orphan, grace_s=_REAP_GRACE_S):
                _release(fd)
                log.error("GPU %s: process group %s survived SIGKILL; the GPU stays busy", gpu, orphan)
                return None
            os.ftruncate(fd, 0)
        return fd

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
                _describe(fd, f"gpu={gpu} {label}")
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

    def left_running(self, job_id: str) -> LeftRunning:
        """The process groups this host's lease files record for trials of ``job_id`` (see ``left_running``)."""
        return left_running([self.lease_dir], job_id)


@dataclass(frozen=True)
class LeftRunning:
    """What lease files record of one job's trials: ``orphaned`` groups, alive and the ones recorded (leader
    start time), whose file nobody holds (its holder died: the groups are nobody's now, to be killed), and
    ``held`` groups, whose file a live holder still has locked (it stops them itself). ``unheld_files``: the
    job's files nobody holds (a trial record of a dead holder can go once its groups are killed)."""

    orphaned: tuple[int, ...] = ()
    held: tuple[int, ...] = ()
    unheld_files: tuple[Path, ...] = ()


def left_running(directories: Sequence[str | os.PathLike[str]], job_id: str) -> LeftRunning:
    """The live process groups that lease files (``*.lock``) in ``directories`` record for trials of ``job_id``
    (the label's ``job=`` field, matched exactly), held or not. A file is probed by locking and unlocking it,
    as ``free`` does; a group is counted as the recorded one only while its leader's start time matches."""
    orphaned: list[int] = []
    held: list[int] = []
    unheld: list[Path] = []
    with contextlib.closing(_open_leases(directories)) as leases:
        for path, fd in leases:
            if _job_of(fd) != job_id:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.extend(p for p in _live_pgids(fd) if p not in held)
                continue
            try:
                orphaned.extend(p for p in _live_pgids(fd) if p not in orphaned)
                unheld.append(path)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
    # a group named by a held file too (one file of a TP group) is the live holder's
    return LeftRunning(tuple(p for p in orphaned if p not in held), tuple(held), tuple(unheld))


def trial_record(directory: str | os.PathLike[str], name: str, label: str) -> LeasedGroup:
    """A lease file that leases no GPU: ``<directory>/<name>.lock``, locked and labelled as a GPU's is, for
    where something else hands out the GPUs (a Ray node) but the trial's process groups must still be on
    record on the host (``record_pgid``) for ``left_running``. ``name`` must be unique; closing it removes
    the file."""
    path = Path(directory) / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # only a prober ever holds it, for an instant
        _describe(fd, label)
    except BaseException:
        os.close(fd)
        raise
    return LeasedGroup((), {-1: fd}, remove=path)


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


def _recorded(fd: int) -> list[tuple[int, int | None]]:
    text = os.pread(fd, 4096, 0).decode(errors="replace")
    return [(int(m.group(1)), int(m.group(2)) if m.group(2) else None) for m in _PGID_LINE.finditer(text)]


def _job_of(fd: int) -> str | None:
    first = os.pread(fd, 4096, 0).decode(errors="replace").partition("\n")[0]
    match = _JOB_FIELD.search(first)
    return match.group(1) if match else None


def _live_pgids(fd: int) -> list[int]:
    """The process groups named in a lease file that are still the ones recorded and alive."""
    out = []
    for pgid, start in _recorded(fd):
        leader = leader_start_time(pgid)
        # A live leader started at another time is a reused pid, not our server (a missing leader with live
        # members is ours: nobody else can have that pgid while its members live).
        if pgid not in out and group_alive(pgid) and (start is None or leader is None or leader == start):
            out.append(pgid)
    return out


def _live_pgid(fd: int) -> int | None:
    """The first process group named in a lease file that is still the one recorded and alive, if any."""
    live = _live_pgids(fd)
    return live[0] if live else None


def held_by_live_holder(lease_dirs: Sequence[str | os.PathLike[str]], pgid: int) -> bool:
    """Whether a lease file naming ``pgid`` is locked right now, i.e. the process that started the group is
    alive and still holds its GPUs (a runner cut off from the database, say). Probed like ``free``."""
    with contextlib.closing(_open_leases(lease_dirs)) as leases:
        for _, fd in leases:
            if not any(p == pgid for p, _ in _recorded(fd)):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _open_leases(directories: Sequence[str | os.PathLike[str]]) -> Generator[tuple[Path, int], None, None]:
    """Each lease file (``*.lock``) in ``directories`` that can be opened, with its descriptor; the descriptor
    is closed when the loop moves on or the generator is closed (callers use ``contextlib.closing``, so an
    early return closes it too)."""
    for directory in directories:
        for path in sorted(Path(directory).glob("*.lock")):
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue  # removed since the glob, or not ours to read
            try:
                yield path, fd
            finally:
                os.close(fd)


def _release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _describe(fd: int, label: str) -> None:
    text = f"pid={os.getpid()} {label}".strip() + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
