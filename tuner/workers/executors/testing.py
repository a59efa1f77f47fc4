"""Evaluators for testing executors: real child process groups, controllable length, hangs.

They live in the package (as ``optuna.testing`` does) so Ray workers can import them by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.domain import (
    Engine,
    Failure,
    FailureClass,
    LevelResult,
    LoadLevel,
    ModelRef,
    ServingConfig,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialContext,
    TrialResult,
    TrialSpec,
    TrialStatus,
)


class SleepEvaluator:
    """Starts ``sleep`` in a new session (standing in for vLLM's process group), reports its pgid, waits
    ``duration_s`` (or, with ``hang=True``, until its process is killed from outside, ignoring
    cancellation), stops the group and returns a simulated result.

    With ``record_dir`` set it writes ``<record_dir>/start-<pid>-<n>.json`` when it starts (pid, pgid,
    gpu ids, visibility variables, the spec's hardware and deadline) and ``done-...json`` when it returns,
    so tests can find the worker to kill and count results. With ``echo_hardware`` its results say the
    spec's hardware, as the vLLM runner's do ("auto" for an "auto" job); ``engine`` labels its results
    (``"vllm"`` to stand in for the vLLM runner in a job for real hardware).
    """

    def __init__(
        self,
        duration_s: float = 0.5,
        hang: bool = False,
        record_dir: str | None = None,
        echo_hardware: bool = False,
        engine: str = Engine.SIMULATED.value,
    ):
        self.duration_s = duration_s
        self.hang = hang
        self.record_dir = record_dir
        self.echo_hardware = echo_hardware
        self.engine = Engine(engine)

    def _record(self, kind: str, spec: TrialSpec, data: dict) -> None:
        if not self.record_dir:
            return
        path = Path(self.record_dir) / f"{kind}-{os.getpid()}-{spec.number}-{time.monotonic_ns()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.rename(path)

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        ctx = ctx or TrialContext()
        t0 = time.monotonic()
        proc = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        ctx.on_process_started(proc.pid)
        visible = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
        node_id = None
        if "ray" in sys.modules:  # inside a Ray task: which node it runs on
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        self._record(
            "start",
            spec,
            {
                "pid": os.getpid(),
                "pgid": proc.pid,
                "number": spec.number,
                "gpu_ids": spec.gpu_ids,
                "visible": visible,
                "node_id": node_id,
                "hardware": spec.hardware,
                "deadline_s": spec.deadline_s,
                "t": time.time(),
            },
        )
        try:
            deadline = float("inf") if self.hang else t0 + self.duration_s
            while time.monotonic() < deadline:
                if proc.poll() is not None:  # its "server" was killed from outside, as a runner would see
                    return TrialResult(
                        status=TrialStatus.FAILED,
                        engine=self.engine,
                        spec=spec.spec,
                        failure=Failure(FailureClass.CRASH, f"process group exited ({proc.returncode})"),
                        pgid=proc.pid,
                    )
                if ctx.is_cancelled() and not self.hang:
                    return TrialResult(
                        status=TrialStatus.CANCELLED,
                        engine=self.engine,
                        spec=spec.spec,
                        failure=Failure(FailureClass.CANCELLED, "cancelled"),
                        pgid=proc.pid,
                    )
                time.sleep(0.02)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        self._record("done", spec, {"pid": os.getpid(), "pgid": proc.pid, "number": spec.number, "t": time.time()})
        return TrialResult(
            status=TrialStatus.SUCCEEDED,
            engine=self.engine,
            spec=spec.spec,
            levels=tuple(LevelResult(level=lv, num_requests=1, output_throughput=1.0) for lv in spec.levels),
            pgid=proc.pid,
            wall_s=time.monotonic() - t0,
            hardware=spec.hardware if self.echo_hardware else None,
        )


class FailingEvaluator:
    """Raises: an evaluator bug, which the executor must turn into an INTERNAL failure."""

    engine = Engine.SIMULATED

    def __call__(self, spec: TrialSpec, ctx: TrialContext | None = None) -> TrialResult:
        raise RuntimeError("evaluator bug")


def read_records(record_dir: str | os.PathLike[str], kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(record_dir).glob(f"{kind}-*.json"))]


def make_spec(
    number: int = 0,
    *,
    tp: int = 1,
    hardware: str = "auto",
    deadline_s: float | None = None,
    job_id: str = "job-test",
) -> TrialSpec:
    """A minimal trial spec for executor tests."""
    return TrialSpec(
        model=ModelRef("tiny"),
        spec=SpecConfig(),
        levels=(LoadLevel(value=1, num_requests=1),),
        requests=(TrafficRequest(format=TrafficFormat.COMPLETIONS, prompt="hi", output_tokens=4),),
        serving=ServingConfig(args={"tensor_parallel_size": tp}),
        hardware=hardware,
        job_id=job_id,
        number=number,
        deadline_s=deadline_s,
    )


def wait_for(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def group_gone(pgid: int) -> bool:
    """True when process group ``pgid`` has no live member."""
    from tuner.workers.process_group import group_members

    return not group_members(pgid)


# A runner's process, as far as a reclaim sees it: it records its trial in a lease file ("lease": GPU <gpu> of
# the lease in <directory>; "record": a trial record, as a Ray task keeps one), starts the trial's server group
# gated (the pgid is on record before it runs), prints the pgid and waits to be killed.
_RUNNER = """
import sys, time
from tuner.workers.gpu_lease import GpuLease, trial_record
from tuner.workers.process_group import start_gated
kind, directory, label, gpu = sys.argv[1:5]
if kind == "lease":
    group = GpuLease(directory).acquire(1, [int(gpu)], timeout=30, label=label)
else:
    group = trial_record(directory, "runner-" + sys.argv[5], label)
proc = start_gated(["sleep", "3600"], on_started=group.record_pgid)
print(proc.pid, flush=True)
time.sleep(3600)
"""


@dataclass
class TrialLeft:
    """A trial's server group started by a separate runner process (``holder``), for reclaim tests."""

    pgid: int
    holder: subprocess.Popen[str]

    def kill_holder(self) -> None:
        """The runner dies (SIGKILL: no cleanup); its server group lives on, on record, unheld."""
        self.holder.kill()
        self.holder.wait(timeout=30)

    def stop(self) -> None:
        from tuner.workers.process_group import kill_process_group

        if self.holder.poll() is None:
            self.kill_holder()
        kill_process_group(self.pgid, grace_s=1.0)


def leave_trial(
    kind: str, directory: str | os.PathLike[str], job_id: str, number: int, *, die: bool, gpu: int | None = None
) -> TrialLeft:
    """Start a runner process that records trial ``number`` of ``job_id`` in ``directory`` (``kind``: "lease",
    on GPU ``gpu``, default ``number``; or "record", see ``_RUNNER``) and starts its server group; with ``die``
    the runner is SIGKILLed once the group runs, leaving it alive and unheld."""
    label = f"job={job_id} trial={number}"
    gpu = number if gpu is None else gpu
    holder = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, kind, str(directory), label, str(gpu), uuid.uuid4().hex],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = holder.stdout.readline() if holder.stdout else ""
    if not line.strip().isdigit():
        holder.kill()
        raise AssertionError(f"the runner process did not start its group (exit {holder.wait()})")
    left = TrialLeft(int(line), holder)
    if die:
        left.kill_holder()
    return left
