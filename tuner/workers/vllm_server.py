"""One ``vllm serve`` process: argv, process group, readiness and teardown.

The server runs in its own session, so its API server, EngineCore and worker processes share one process
group that can be signalled as a whole, by us or by whoever recovers a dead runner from the stored pgid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from tuner.domain import ModelRef, ServingConfig, SpecConfig, serve_argv


def build_serve_argv(
    model: ModelRef,
    serving: ServingConfig,
    spec: SpecConfig,
    port: int,
    *,
    command: Sequence[str],
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """A trial's server argv: ``command``, the configuration's arguments from :func:`tuner.domain.serve_argv`
    unchanged (exactly what a recommendation deploys), then the runtime extras: host, port, ``extra_args``
    (flags of this platform, e.g. ``--enforce-eager`` on CPU).

    ``command`` is the prefix. ``[..., "serve"]`` takes the model positionally, as the deploy command does;
    the module entry point (``[python, "-m", "vllm.entrypoints.openai.api_server"]``) has no positional
    model, so ``--model`` is put in front of it there.
    """
    model_flag = [] if list(command[-1:]) == ["serve"] else ["--model"]
    return [
        *command,
        *model_flag,
        *serve_argv(model, serving, spec),
        "--host",
        host,
        "--port",
        str(port),
        *extra_args,
    ]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    that died, from the pgid stored with its trial.
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


class ServerExited(RuntimeError):
    """The server process ended before it was stopped."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(f"vLLM server exited with code {returncode}")
        self.returncode = returncode


class ServerLaunchError(RuntimeError):
    """The server could not be launched, or was stopped at once because its start could not be recorded."""


class StartupTimeout(RuntimeError):
    pass


class StartupCancelled(RuntimeError):
    pass


class VllmServer:
    """A context manager owning one server process; leaving the block always stops the whole group.

    ``__enter__`` only launches (and reports the pgid through ``on_started``); call :meth:`wait_ready`
    inside the block so that a failed or cancelled start is still cleaned up by ``__exit__``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        grace_s: float = 20.0,
        on_started: Callable[[int], None] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.log_path = Path(log_path)
        self._env = dict(env) if env is not None else None
        self._grace_s = grace_s
        self._on_started = on_started
        self._cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd=self._cwd,
                    start_new_session=True,
                )
            except OSError as e:
                raise ServerLaunchError(f"cannot start {self.argv[0]}: {e}") from e
        self.pgid = self._proc.pid  # a new session's leader is its own group leader
        if self._on_started is not None:
            try:
                self._on_started(self.pgid)
            except Exception as e:  # e.g. the pgid could not be stored: do not leave an orphan running
                self.stop()
                raise ServerLaunchError(f"process-start callback failed: {e!r}") from e
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited_within(self, seconds: float) -> bool:
        """True if the process has exited or exits within ``seconds`` (a refused connection may precede
        the exit status by a moment)."""
        if self._proc is None:
            return False
        try:
            self._proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait_ready(
        self,
        timeout_s: float,
        is_cancelled: Callable[[], bool] = lambda: False,
        poll_s: float = 0.5,
    ) -> float:
        """Poll ``/health`` until 200; return seconds waited. Raises ServerExited / StartupTimeout /
        StartupCancelled."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if not self.alive():
                    raise ServerExited(self.returncode())
                if is_cancelled():
                    raise StartupCancelled("cancelled while the server was starting")
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return time.monotonic() - t0
                except httpx.HTTPError:
                    pass  # connection refused until the API server binds
                if time.monotonic() >= deadline:
                    raise StartupTimeout(f"no healthy /health within {timeout_s:.0f} s")
                time.sleep(poll_s)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL after the grace period, reap the leader."""
        if self._proc is None or self.pgid is None:
            return
        kill_process_group(self.pgid, self._grace_s)
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def log_tail(self, lines: int = 80) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
