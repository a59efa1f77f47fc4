from __future__ import annotations

import os

import pytest

from tuner.workers.options import API_SERVER_MODULE, VLLM_PYTHON_ENV, RunnerOptions, default_vllm_python


def test_module_entry_point_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/opt/vllm/bin/python")
    assert default_vllm_python() == "/opt/vllm/bin/python"
    assert RunnerOptions().server_command() == ["/opt/vllm/bin/python", "-m", API_SERVER_MODULE]
    assert RunnerOptions(vllm_python="/x/python").server_command() == ["/x/python", "-m", API_SERVER_MODULE]


def test_an_executable_wins_and_lists_become_tuples() -> None:
    options = RunnerOptions(vllm_command=["vllm", "serve"], extra_args=["--x"])  # type: ignore[arg-type]
    assert options.server_command() == ["vllm", "serve"]
    assert options.vllm_command == ("vllm", "serve") and options.extra_args == ("--x",)


def test_token_ids_in_measured_windows_follow_the_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tuner.domain import TrafficFormat, TrafficRequest
    from tuner.settings import Settings
    from tuner.wiring import runner_options
    from tuner.workers.replay import ReplaySettings, build_request

    for flag in (True, False):
        options = RunnerOptions(**runner_options(Settings(data_dir=tmp_path, return_token_ids=flag), tmp_path))
        assert options.return_token_ids is flag
        _, body = build_request(
            TrafficRequest(TrafficFormat.COMPLETIONS, prompt="p", output_tokens=4),
            ReplaySettings(model="m", return_token_ids=options.return_token_ids),
        )
        assert body.get("return_token_ids", False) is flag


def test_client_processes_and_cores_follow_the_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from tuner.settings import Settings, parse_cpu_list
    from tuner.wiring import ray_trial_cpus, runner_options
    from tuner.workers.measure import Clients
    from tuner.workers.options import default_client_cpus

    assert parse_cpu_list("6-7") == (6, 7) and parse_cpu_list("0, 2,4-5") == (0, 2, 4, 5)
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, client_cpus="x")

    # Left unset on the local executor, the clients get the last quarter of the cores (1-8) and the server the
    # rest: sharing a core with vLLM's API server starves them. Under Ray (CPUs by count) and "none": unpinned.
    assert default_client_cpus([0]) is None
    assert default_client_cpus([0, 1]) == (1,)
    assert default_client_cpus(range(16)) == (12, 13, 14, 15)
    assert default_client_cpus(range(128)) == tuple(range(120, 128))
    cores = os.sched_getaffinity(0)
    auto = RunnerOptions(**runner_options(Settings(data_dir=tmp_path), tmp_path)).clients().cpus
    assert auto == ((max(cores),) if len(cores) > 1 else None)
    unpinned = Settings(data_dir=tmp_path, client_cpus="none")
    assert RunnerOptions(**runner_options(unpinned, tmp_path)).clients().cpus is None
    ray_auto = Settings(data_dir=tmp_path, executor="ray")
    assert RunnerOptions(**runner_options(ray_auto, tmp_path)).clients().cpus is None

    pinned = Settings(data_dir=tmp_path, client_cpus="6-7", max_client_processes=2)
    options = RunnerOptions(**runner_options(pinned, tmp_path))
    assert options.clients() == Clients(1, 2, (6, 7))
    # Under Ray each client process gets a CPU of the trial's reservation, beside one for the runner and the
    # server's API process; the runner never re-measures with more processes than were reserved.
    ray = Settings(data_dir=tmp_path, executor="ray", max_client_processes=3)
    assert ray_trial_cpus(ray) == 4.0
    assert RunnerOptions(**runner_options(ray, tmp_path)).clients().max_processes == 3
    assert ray_trial_cpus(Settings(data_dir=tmp_path, executor="ray")) == 3.0


def test_local_model_paths_must_lie_under_the_model_roots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "models"
    (root / "llama").mkdir(parents=True)
    options = RunnerOptions(model_roots=(str(root),))
    assert options.path_problem("model", "meta-llama/Llama-3.1-8B-Instruct") is None  # an HF id, not a path
    assert options.path_problem("model", str(root / "llama")) is None
    for outside in ("/etc", str(root / ".." / "elsewhere"), "~/.ssh", "./x"):
        problem = options.path_problem("model", outside)
        assert problem is not None and "outside the worker's model roots" in problem, outside
    assert RunnerOptions().path_problem("model", "/etc") is None  # an operator's own `tuner trial`: any path


def test_the_service_always_restricts_local_paths(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tuner.settings import Settings
    from tuner.wiring import runner_options

    options = RunnerOptions(**runner_options(Settings(data_dir=tmp_path), tmp_path))
    assert options.model_roots is not None and str((tmp_path / "models").resolve()) in options.model_roots
    assert options.path_problem("model", "/etc") is not None
    explicit = Settings(data_dir=tmp_path, model_roots="/models:/scratch/ckpt")
    assert RunnerOptions(**runner_options(explicit, tmp_path)).model_roots == ("/models", "/scratch/ckpt")
