"""Whole jobs through the job runner and the Ray executor on the local cluster with declared GPUs (a head,
MI300X nodes with 2 and 1 GPUs, an H100 node): which jobs a Ray runner claims and what it reports, a
simulated job through ``TUNER_EXECUTOR=ray`` with a Ray worker killed mid-trial, an "auto" job kept on one
chip and recorded under it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import LEVELS, ListPlanner
from tuner import recommendations, runs, tuning
from tuner.demo import LLAMA_8B_CONFIG
from tuner.domain import (
    Budget,
    Engine,
    JobSpec,
    LoadLevel,
    Method,
    ModelRef,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialResult,
)
from tuner.job_runner import JobRunner
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow
from tuner.wiring import host_report, make_executor, make_runner
from tuner.workers.executors import EvaluatorRecipe, LocalExecutor
from tuner.workers.executors.testing import group_gone, read_records, wait_for

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from tuner.workers.executors.ray_executor import RayExecutor  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
REQUESTS = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"p{i} " * 20, output_tokens=64) for i in range(16)]
PACE_S = 1.5
PLACEHOLDER = f"sleep\0{int(PACE_S) + 600}\0".encode()  # the process a paced simulated trial holds


def submit(factory, **spec) -> str:  # type: ignore[no-untyped-def]
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        job, _ = tuning.submit_job(s, JobSpec(traffic_id=traffic.id, **spec))
        return job.id


def ray_settings(db_url: str, tmp_path: Path, **extra) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(database_url=db_url, data_dir=tmp_path, executor="ray", poll_s=0.1, heartbeat_s=0.5, **extra)


def test_a_ray_runner_claims_only_jobs_for_chips_its_cluster_has(ray_cluster, db_url: str, tmp_path: Path) -> None:
    factory = make_session_factory(make_engine(db_url))
    model = ModelRef("org/m")
    wanted = {
        submit(factory, model=model, hardware="mi300x"),
        submit(factory, model=model, hardware="h100"),
        submit(factory, model=model, hardware="auto"),
        submit(factory, model=model, hardware="mi355x", engine=Engine.SIMULATED),  # stands in for any chip
    }
    missing = submit(factory, model=model, hardware="mi355x")
    settings = ray_settings(db_url, tmp_path)
    runner = make_runner(settings, factory, report=False)
    claimed = set()
    while True:
        with transaction(factory) as s:
            job = tuning.claim_job(s, runner.worker, stale_after_s=60, hardware=runner.config.hardware)
        if job is None:
            break
        claimed.add(job.id)
    assert claimed == wanted and missing not in claimed
    # A simulated job for a chip the cluster lacks runs on this host's CPU, as it would without Ray.
    spec = JobSpec(model=model, traffic_id="t", hardware="mi355x", engine=Engine.SIMULATED, levels=LEVELS)
    fallback = make_executor(settings, spec)
    assert isinstance(fallback, LocalExecutor) and fallback.cpu_only
    fallback.close()
    # The runner reports the cluster's GPU nodes, not this (driver) host.
    report = host_report(settings)
    assert report["executor"] == "ray" and {"mi300x", "h100"} <= set(report["families"])
    by_id = {n["node_id"]: n for n in report["nodes"]}
    assert by_id[ray_cluster.node_id("mi300x-oam")]["gpu_count"] == 2
    assert by_id[ray_cluster.node_id("h100")]["hardware"] == "h100"


class Placeholders:
    """Watches the processes paced simulated trials hold (one per running trial, on whichever Ray node):
    the most at once, every one seen with the raylet (node) it ran under, and kills the Ray worker running
    the first one, once, mid-trial: after it has held its placeholder for a while (by then the trial has
    reported the placeholder's process group, as a vLLM runner reports its server's right after starting it)."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}  # placeholder pid -> raylet pid of its node
        self._first_seen: dict[int, float] = {}
        self.peak = 0
        self.errors: list[str] = []
        self.killed: tuple[int, int] | None = None  # (worker pid, the placeholder's process group)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Placeholders:
        self._before = set(_placeholders())  # left by someone else: not ours to count
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def kill_leftovers(self) -> None:
        """Whatever the test found, leave no placeholder behind."""
        for pid in self.seen:
            if not group_gone(pid):
                os.killpg(pid, signal.SIGKILL)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self._look()
            except Exception as exc:  # a process gone between two reads: look again
                self.errors.append(repr(exc))

    def _look(self) -> None:
        live = [pid for pid in _placeholders() if pid not in self._before]
        for pid in live:
            if pid not in self.seen:  # the Ray worker's environment names its node's raylet
                env = dict(v.split(b"=", 1) for v in _read(f"/proc/{pid}/environ").split(b"\0") if b"=" in v)
                self.seen[pid] = int(env.get(b"RAY_RAYLET_PID", b"0"))
                self._first_seen[pid] = time.monotonic()
        self.peak = max(self.peak, len(live))
        if self.killed is None and live and time.monotonic() - self._first_seen[live[0]] >= PACE_S / 3:
            pid = live[0]
            worker = int(_read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1])
            if b"ray::" in _read(f"/proc/{worker}/cmdline"):
                os.kill(worker, signal.SIGKILL)  # the Ray worker dies mid-trial
                self.killed = (worker, pid)


def _placeholders() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _read(f"/proc/{p}/cmdline") == PLACEHOLDER]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def test_a_simulated_job_runs_through_ray(ray_cluster, db_url: str, tmp_path: Path) -> None:
    """TUNER_EXECUTOR=ray applies to simulated jobs: paced trials overlap up to the cluster's three MI300X
    GPUs, land only on MI300X nodes, a Ray worker killed mid-trial is retried (the loss on the trial's
    record, its process group killed), every trial has one stored result, the recommendation is published."""
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(
        factory,
        model=ModelRef(LLAMA),
        model_config=LLAMA_8B_CONFIG,
        engine=Engine.SIMULATED,
        hardware="mi300x",
        levels=(LoadLevel(value=1, num_requests=8), LoadLevel(value=16, num_requests=32)),
        budget=Budget(max_trials=8),
        confirm_runs=1,
    )
    settings = ray_settings(
        db_url, tmp_path, simulated_trial_s=PACE_S, simulated_placeholder_process=True, trial_deadline_s=120
    )
    runner = make_runner(settings, factory, report=False)
    watch = Placeholders()
    try:
        with watch:
            assert runner.run_once(job_id) == job_id
        check_simulated_job(ray_cluster, factory, job_id, watch)
    finally:
        watch.kill_leftovers()


def check_simulated_job(ray_cluster, factory, job_id: str, watch: Placeholders) -> None:  # type: ignore[no-untyped-def]
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "succeeded", job.error
        rows = tuning.list_trials(s, job_id)
        results = {row.number: runs.trial_result(row) for row in rows}
        rec = recommendations.find(s, model=LLAMA, engine=Engine.SIMULATED, hardware="mi300x")
    assert rec["hardware"] == "mi300x" and rec["simulated"] is True
    # One stored result per trial, each run once, but for the attempt lost with its worker.
    assert len(rows) == len({row.number for row in rows}) >= 4
    assert all(isinstance(r, TrialResult) and r.status.is_finished() for r in results.values())
    assert all(r.status.value == "succeeded" for r in results.values()), [r.failure for r in results.values()]
    assert len(watch.seen) == len(rows) + 1
    # The lost attempt: its worker was killed during the baseline, which was retried; its processes are gone.
    assert watch.killed is not None
    (lost,) = results[0].retried_failures
    assert lost.cls.value == "infrastructure" and "lost" in lost.reason
    retried = [n for n, r in results.items() if r.retried_failures]
    assert retried == [0]
    wait_for(lambda: group_gone(watch.killed[1]), 30, "the lost attempt's process group to be killed")
    # Parallel after the baseline, never beyond the cluster's MI300X GPUs, never on another chip.
    assert 2 <= watch.peak <= 3
    raylets = {node.all_processes["raylet"][0].process.pid: role for role, node in ray_cluster.nodes.items()}
    assert {raylets.get(raylet) for raylet in watch.seen.values()} <= {"mi300x-oam", "mi300x-hf"}
    assert {r.hardware for r in results.values()} == {"mi300x"}


def test_an_auto_job_stays_on_one_chip_and_is_recorded_under_it(ray_cluster, db_url: str, tmp_path: Path) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory, model=ModelRef("org/m"), hardware="auto", engine=Engine.VLLM, levels=LEVELS)
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    # Stands in for the vLLM runner: labelled vllm, echoes the trial's hardware ("auto" for the baseline).
    recipe = EvaluatorRecipe(
        Engine.VLLM,
        {"duration_s": 0.3, "record_dir": str(rec_dir), "echo_hardware": True, "engine": "vllm"},
        factory="tuner.workers.executors.testing:SleepEvaluator",
    )
    specs = [SpecConfig(Method.NGRAM, k) for k in (2, 3, 4, 5)]
    runner = JobRunner(
        factory,
        planner_factory=lambda job_id, spec, reqs: ListPlanner(specs),
        executor_factory=lambda spec: RayExecutor(recipe, hardware=spec.hardware),
        heartbeat_s=0.2,
        poll_s=0.05,
        trial_deadline_s=60,
    )
    assert runner.run_once(job_id) == job_id
    with factory() as s:
        assert s.get(JobRow, job_id).status == "succeeded"
        results = [runs.trial_result(row) for row in tuning.list_trials(s, job_id)]
        rec = recommendations.find(s, model="org/m", hardware="mi300x")
    assert len(results) == 5 and {r.hardware for r in results} == {"mi300x"}
    assert rec["hardware"] == "mi300x"
    starts = sorted(read_records(rec_dir, "start"), key=lambda r: r["number"])
    # The baseline asked for "auto"; every later trial for the chip the baseline ran on.
    assert [r["hardware"] for r in starts] == ["auto"] + ["mi300x"] * 4
    assert all(r["deadline_s"] == 60 for r in starts)
    mi300x = {ray_cluster.node_id("mi300x-oam"), ray_cluster.node_id("mi300x-hf")}
    assert {r["node_id"] for r in starts} <= mi300x
