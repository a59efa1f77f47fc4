"""One ``vllm serve`` process: argv, process group, readiness and teardown.

The server runs in its own session, so its API server, EngineCore and worker processes share one process
group that can be signalled as a whole, by us or by whoever recovers a dead runner from the stored pgid.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from tuner.domain import LEGACY_SCHEDULE_FIELD, ModelRef, ServingConfig, SpecConfig, serve_argv
from tuner.workers.process_group import kill_process_group, start_gated


def build_serve_argv(
    model: ModelRef,
    serving: ServingConfig,
    spec: SpecConfig,
    port: int,
    *,
    command: Sequence[str],
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    schedule_field: str = LEGACY_SCHEDULE_FIELD,
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
        *serve_argv(model, serving, spec, schedule_field=schedule_field),
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
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.log_path = Path(log_path)
        self._env = dict(env) if env is not None else None
        self._grace_s = grace_s
        self._on_started = on_started
        self._cwd = cwd
        self._cpus = tuple(cpus) if cpus else None  # the cores the server (and what it spawns) may use
        self._proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

        def started(pgid: int) -> None:
            self.pgid = pgid
            if self._cpus:
                os.sched_setaffinity(pgid, self._cpus)  # before the gate opens: inherited by every child
            if self._on_started is not None:
                self._on_started(pgid)

        with open(self.log_path, "ab") as log:
            try:
                # Gated: the server runs only once its pgid is recorded (the lease, the store), so a runner
                # killed in between leaves nothing running that nobody knows about.
                self._proc = start_gated(
                    self.argv,
                    on_started=started,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd=self._cwd,
                )
            except OSError as e:
                self.pgid = None
                raise ServerLaunchError(f"cannot start {self.argv[0]}: {e}") from e
            except Exception as e:  # e.g. the pgid could not be stored: the server never ran
                self.pgid = None
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
