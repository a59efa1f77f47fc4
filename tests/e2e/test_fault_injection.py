"""Faults, injected for real: jobs on a PostgreSQL cluster of the test's own, two `tuner worker` processes
SIGKILLed again and again mid-trial, the API SIGKILLed, the database stopped and started in the middle.

Every job must succeed; no trial may be lost, left running or run twice (in our tables and in Optuna's);
each job publishes once; no trial's process group outlives it; idle workers do not burn CPU afterwards.

The cluster is made here with initdb/pg_ctl on a free port (as the postgres user when run as root, since
initdb refuses root), so the shared server at 127.0.0.1:5432 stays up for the rest of the suite.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import optuna
import pytest
from sqlalchemy import create_engine, select, text

from tuner.demo import LLAMA_8B_CONFIG
from tuner.store import migrate
from tuner.store.db import make_engine, make_session_factory
from tuner.store.models import JobRow, RecommendationRow, TrialRow
from tuner.tuning import job_spec
from tuner.wiring import study_name
from tuner.workers.process_group import group_alive

pytestmark = pytest.mark.postgres

JOBS = 4
WORKER_KILLS = 8
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        pytest.fail(f"{name} not found: the fault-injection test needs the PostgreSQL server binaries")
    return found


@dataclass
class Cluster:
    data: Path
    port: int
    as_postgres: list[str]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/tuner"

    def ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_postgres, _pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args],
            check=True,
            capture_output=True,
            timeout=90,
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.ctl("-o", opts, "-l", str(self.data / "server.log"), "start")

    def stop(self) -> None:
        self.ctl("-m", "fast", "stop")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="tuner-faults-pg-"))
    data = root / "data"
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
        os.chmod(root, 0o755)
    subprocess.run(
        [*as_postgres, _pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    c = Cluster(data, _free_port(), as_postgres)
    c.start()
    admin = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{c.port}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE tuner"))
    admin.dispose()
    migrate.upgrade(c.url)
    try:
        yield c
    finally:
        try:
            c.ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Fleet:
    """The API and the workers, as processes that can be killed and started again."""

    db_url: str
    data_dir: Path
    api_port: int = field(default_factory=_free_port)
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api: subprocess.Popen[bytes] | None = None
    generation: int = 0

    def env(self) -> dict[str, str]:
        return os.environ | {
            "TUNER_DATABASE_URL": self.db_url,
            "TUNER_DATA_DIR": str(self.data_dir),
            "TUNER_AUTH": "open",
            "TUNER_AUTO_MIGRATE": "false",
            "TUNER_SIMULATED_TRIAL_S": "0.5",
            "TUNER_SIMULATED_PLACEHOLDER_PROCESS": "true",
            "TUNER_HEARTBEAT_S": "0.3",
            "TUNER_STALE_AFTER_S": "2",
            "TUNER_POLL_S": "0.2",
        }

    def _spawn(self, args: list[str], name: str, extra: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", *args],
            env=self.env() | extra,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_worker(self) -> str:
        self.generation += 1
        name = f"w{self.generation}"
        self.workers[name] = self._spawn(["worker"], name, {"TUNER_WORKER_NAME": name})
        return name

    def start_api(self) -> None:
        self.api = self._spawn(
            ["serve", "--no-runner", "--port", str(self.api_port), "--log-level", "warning"], "api", {}
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("the API did not come up")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)  # the process only: what it started lives in its own session
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in [*self.workers.values(), *([self.api] if self.api else [])]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.workers.values(), *([self.api] if self.api else [])]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, every thread's


def _placeholders() -> set[int]:
    """Live `sleep` processes of the shape the paced engine's placeholder has."""
    out = set()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            argv = Path(cmdline).read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [b"sleep"] and len(argv) >= 2 and argv[1].isdigit() and int(argv[1]) >= 600:
            out.add(int(cmdline.split("/")[2]))
    return out


def _submit(fleet: Fleet, i: int) -> str:
    body = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine": "simulated",
        "traffic": [{"prompt": f"def f{i}_{n}(x):\n    return x", "max_tokens": 64} for n in range(8)],
        "concurrency": [1, 8],
        "num_requests": 8,
        "budget": {"max_trials": 3},
        "confirm_runs": 3,
        "hf_config": LLAMA_8B_CONFIG,
        "seed": i,
    }
    for _ in range(50):  # a retried POST with the same key is the same job
        try:
            r = httpx.post(f"{fleet.base}/tune", json=body, headers={"Idempotency-Key": f"job-{i}"}, timeout=10)
            if r.status_code in (200, 202):
                return str(r.json()["id"])
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("could not submit")


def test_jobs_survive_killed_workers_a_killed_api_and_a_database_restart(cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(7)
    before = _placeholders()
    fleet = Fleet(cluster.url, tmp_path)
    factory = make_session_factory(make_engine(cluster.url))
    fleet.start_api()
    job_ids = [_submit(fleet, i) for i in range(JOBS)]
    fleet.start_worker()
    fleet.start_worker()

    def statuses() -> list[str]:
        try:
            with factory() as s:
                return [s.get(JobRow, j, populate_existing=True).status for j in job_ids]  # type: ignore[union-attr]
        except Exception:  # the database is restarting
            return []

    def running_trial() -> bool:
        try:
            with factory() as s:
                return s.scalars(select(TrialRow).where(TrialRow.status == "running")).first() is not None
        except Exception:
            return False

    # The faults, spread over the jobs' life; each worker kill lands while a trial runs.
    # The API and database faults come early (in a random order, between worker kills): jobs of three
    # simulated trials can finish before a plan that leaves them last has run.
    rare = ["api", "db"]
    rng.shuffle(rare)
    plan = ["worker", rare[0], "worker", rare[1]] + ["worker"] * (WORKER_KILLS - 1)
    done_faults: list[str] = []
    deadline = time.monotonic() + 240
    try:
        while plan and time.monotonic() < deadline:
            if all(st == "succeeded" for st in statuses()):
                break
            time.sleep(rng.uniform(0.5, 1.5))
            fault = plan.pop(0)
            if fault == "worker":
                wait_until = time.monotonic() + 10
                while not running_trial() and time.monotonic() < wait_until:
                    time.sleep(0.1)
                live = [n for n, p in fleet.workers.items() if p.poll() is None]
                victim = rng.choice(live)
                fleet.kill(fleet.workers[victim])
                fleet.start_worker()
            elif fault == "api":
                assert fleet.api is not None
                fleet.kill(fleet.api)
                fleet.start_api()
            else:
                cluster.stop()
                time.sleep(3)  # longer than a heartbeat, shorter than the runners' patience
                cluster.start()
            done_faults.append(fault)
        while time.monotonic() < deadline:
            st = statuses()
            if st and all(s in ("succeeded", "failed", "cancelled") for s in st):
                break
            time.sleep(0.5)

        # ---- every job succeeded, and the API answers about each (it was killed once)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("w*.log")}
        with factory() as s:
            jobs = [s.get(JobRow, j) for j in job_ids]
            assert all(j is not None and j.status == "succeeded" for j in jobs), (
                [(j.status, j.error) for j in jobs if j],
                logs,
            )
        assert "db" in done_faults and "api" in done_faults and done_faults.count("worker") >= 4
        for j in job_ids:
            assert httpx.get(f"{fleet.base}/tune/{j}", timeout=10).json()["status"] == "succeeded"

        with factory() as s:
            trials = list(s.scalars(select(TrialRow).where(TrialRow.job_id.in_(job_ids))))
            recs = list(s.scalars(select(RecommendationRow).where(RecommendationRow.job_id.in_(job_ids))))
        # ---- no trial left running; an abandoned one is failed as infrastructure, with no result
        assert not [t for t in trials if t.status in ("running", "queued")]
        assert all(t.result is not None or t.failure_class == "infrastructure" for t in trials)
        # ---- each job published once: one recommendation per scope
        for j in job_ids:
            scopes = [r.scope for r in recs if r.job_id == j]
            assert "all" in scopes and len(scopes) == len(set(scopes)), scopes

        # ---- Optuna agrees: nothing running or waiting, one result per told trial, no trial created twice
        storage = optuna.storages.RDBStorage(cluster.url)
        specs = {row.id: job_spec(row) for row in jobs if row is not None}
        for j in job_ids:
            study = optuna.load_study(study_name=study_name(j, specs[j]), storage=storage)
            ot = study.get_trials(deepcopy=False)
            assert not [t.number for t in ot if t.state.name in ("RUNNING", "WAITING")], j
            ops = [k for t in ot for k in t.system_attrs if k.startswith("tuner:op:")]
            assert len(ops) == len(set(ops))
            ours = {t.number: t for t in trials if t.job_id == j}
            with_result = {t.number for t in ot if "result" in t.user_attrs}
            assert with_result == {n for n, t in ours.items() if t.result is not None}, j
            # a trial number ran at most once: each launched trial has one row, and nothing ran unrecorded
            assert set(ours) <= {t.number for t in ot}

        # ---- no process group outlives its trial (recorded in the store, or only in the lease)
        pgids = {t.pgid for t in trials if t.pgid}
        assert len(pgids) >= len([t for t in trials if t.result is not None]) // 2
        grace = time.monotonic() + 15
        while time.monotonic() < grace and (any(group_alive(p) for p in pgids) or _placeholders() - before):
            time.sleep(0.2)
        assert not [p for p in pgids if group_alive(p)], "a trial's process group outlived it"
        assert not (_placeholders() - before), "a placeholder nobody recorded is still running"

        # ---- idle workers sleep: under 10% of a core each over three seconds
        live = [p for p in fleet.workers.values() if p.poll() is None]
        assert live
        start = {p.pid: _cpu_ticks(p.pid) for p in live}
        time.sleep(3)
        for p in live:
            share = (_cpu_ticks(p.pid) - start[p.pid]) / CLK_TCK / 3
            assert share < 0.10, f"idle worker {p.pid} used {share:.0%} of a core"
    finally:
        fleet.stop_all()
        for pid in _placeholders() - before:
            os.kill(pid, signal.SIGKILL)
