"""The executor registry: ``TUNER_EXECUTOR`` is an ``ExecutorKind``, every kind has a backend, and the
composition root builds executors, reports and claimable chips through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tuner.domain import Engine, ExecutorKind, JobSpec, LoadLevel, ModelRef
from tuner.settings import Settings
from tuner.wiring import claimable_hardware, executor_backend, host_report, make_executor, placement
from tuner.workers.executors import EXECUTORS, LocalExecutor
from tuner.workers.executors.registry import LocalBackend, RayBackend
from tuner.workers.hardware import vllm_version_in, worker_host_report

LEVELS = (LoadLevel(value=1, num_requests=1),)


def test_the_executor_setting_is_an_executor_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(data_dir=tmp_path).executor is ExecutorKind.LOCAL
    monkeypatch.setenv("TUNER_EXECUTOR", "ray")
    settings = Settings(data_dir=tmp_path)
    assert settings.executor is ExecutorKind.RAY and settings.executor == "ray"
    with pytest.raises(ValidationError) as raised:
        Settings(data_dir=tmp_path, executor="kubernetes")
    assert [e["loc"] for e in raised.value.errors()] == [("executor",)]


def test_every_kind_has_a_backend(tmp_path: Path) -> None:
    assert set(EXECUTORS) == set(ExecutorKind)
    assert all(backend.kind is kind for kind, backend in EXECUTORS.items())
    assert isinstance(executor_backend(Settings(data_dir=tmp_path)), LocalBackend)
    assert isinstance(executor_backend(Settings(data_dir=tmp_path, executor="ray")), RayBackend)


def test_the_placement_follows_the_settings(tmp_path: Path) -> None:
    default = placement(Settings(data_dir=tmp_path))
    assert default.gpus is None and default.max_parallel == 1  # detect GPUs; SQLite: one trial at a time
    assert default.lease_dir == tmp_path / "gpu-leases"
    chosen = placement(Settings(data_dir=tmp_path, gpus="2,3", database_url="postgresql+psycopg://u@h/db"))
    assert chosen.gpus == (2, 3) and chosen.max_parallel is None
    assert placement(Settings(data_dir=tmp_path, cpu_vllm=True)).gpus == ()


def test_a_local_worker_builds_local_executors(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, cpu_vllm=True)
    simulated = JobSpec(
        model=ModelRef("org/m"), traffic_id="t", hardware="mi300x", engine=Engine.SIMULATED, levels=LEVELS
    )
    sim = make_executor(settings, simulated)
    real = make_executor(settings, JobSpec(model=ModelRef("org/m"), traffic_id="t", levels=LEVELS))
    try:
        assert isinstance(sim, LocalExecutor) and sim.cpu_only and sim.family == "mi300x"
        assert sim.engine is Engine.SIMULATED
        assert isinstance(real, LocalExecutor) and real.cpu_only and real.engine is Engine.VLLM
        assert real.max_parallel == 1
    finally:
        sim.close()
        real.close()


def test_a_local_worker_reports_this_host_once_per_process(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = host_report(settings)
    hits = worker_host_report.cache_info().hits
    assert host_report(settings) is first and worker_host_report.cache_info().hits == hits + 1
    assert "hardware" in first and "gpus" in first
    assert claimable_hardware(settings, None) is None
    assert claimable_hardware(settings, {"gpus": [{"family": "mi300x"}], "hardware": "mi300x"}) == ["mi300x"]


def test_vllm_version_from_another_python() -> None:
    def run(argv, **kwargs):  # type: ignore[no-untyped-def]
        assert argv[:2] == ["/venv/bin/python", "-c"] and kwargs["timeout"] == 120
        return subprocess.CompletedProcess(argv, 0, stdout="some warning\n0.11.0\n", stderr="")

    assert vllm_version_in("/venv/bin/python", run=run) == "0.11.0"
    assert vllm_version_in(sys.executable + "-missing") is None
