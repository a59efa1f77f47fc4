from __future__ import annotations

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
