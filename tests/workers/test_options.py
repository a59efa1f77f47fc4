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
