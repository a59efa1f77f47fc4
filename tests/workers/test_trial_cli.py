"""``tuner trial`` wiring, run on the simulated engine (the real one is covered in test_vllm_real.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.domain import LoadKind
from tuner.workers import trial_cli
from tuner.workers.trial_cli import TrialArgs


@pytest.fixture
def traffic(tmp_path: Path) -> Path:
    path = tmp_path / "traffic.jsonl"
    lines = [{"prompt": f"def f{i}(x): return x", "output_tokens": 32} for i in range(4)]
    lines.append({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_build_trial_from_flags(traffic: Path) -> None:
    args = TrialArgs(
        model="m", traffic=traffic, rate=[2, 8], num_requests=5,
        speculative_config='{"method": "ngram", "num_speculative_tokens": 3}',
        serving='{"max_model_len": 512}', gpu_ids="0,1",
    )  # fmt: skip
    trial = trial_cli.build_trial(args)
    assert [(lv.kind, lv.value, lv.num_requests) for lv in trial.levels] == [
        (LoadKind.RATE, 2.0, 5),
        (LoadKind.RATE, 8.0, 5),
    ]
    assert trial.spec.to_vllm() == {"method": "ngram", "num_speculative_tokens": 3}
    assert len(trial.requests) == 5 and trial.gpu_ids == (0, 1)
    assert trial.serving.args == {"max_model_len": 512}


def test_concurrency_and_rate_are_exclusive(traffic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["trial", "--model", "m", "--traffic", str(traffic), "--concurrency", "1", "--rate", "2"]
    assert main([*argv, "--engine", "simulated"]) == 2
    assert "--concurrency and --rate are alternatives" in capsys.readouterr().err


def test_list_flags_take_their_values_space_separated_or_repeated() -> None:
    from tuner.cli import spread_list_flags

    assert spread_list_flags(["trial", "--rate", "2", "8", "--json"]) == [
        "trial",
        "--rate",
        "2",
        "--rate",
        "8",
        "--json",
    ]
    assert spread_list_flags(["trial", "--concurrency", "1", "--concurrency", "4"]) == [
        "trial", "--concurrency", "1", "--concurrency", "4",
    ]  # fmt: skip
    assert spread_list_flags(["recommend", "--concurrency", "8"]) == ["recommend", "--concurrency", "8"]


def test_simulated_engine_json_output(traffic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    argv = ["trial", "--model", "m", "--traffic", str(traffic), "--engine", "simulated", "--json"]
    assert main([*argv, "--concurrency", "1", "4", "--speculative-config", spec]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["engine"] == "simulated" and [lv["level"]["kind"] for lv in out["levels"]] == ["concurrency"] * 2
    # the stages on stderr, stdout left to the JSON
    assert "level 1 of 2 (c1)" in captured.err and "level 2 of 2 (c4)" in captured.err


def test_simulated_engine_human_summary(traffic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    argv = ["trial", "--model", "m", "--traffic", str(traffic), "--engine", "simulated", "--speculative-config", spec]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("trial succeeded: ngram k=3 on simulated")
    assert "c1:" in text and "acceptance rate" in text
    assert "correctness: NOT GATED (no reference outputs" in text  # one config by hand has no baseline to compare


@pytest.mark.vllm
def test_tuner_trial_measures_a_real_server_started_with_vllm_serve(
    tiny_model: Path, vllm_python: Path, tmp_path: Path
) -> None:
    """The command a user reaches for, end to end: `vllm serve <model>` (the console script, model positional),
    the model drafting for itself (acceptance exactly 1.0), two levels on one launch, JSON out."""
    import os
    import subprocess
    import sys

    traffic = tmp_path / "t.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"def f{i}(x):", "output_tokens": 24}) + "\n" for i in range(6)))
    spec = json.dumps({"method": "draft_model", "model": str(tiny_model), "num_speculative_tokens": 2})
    vllm = str(vllm_python.parent / "vllm")
    argv = [
        str(Path(sys.executable).parent / "tuner"), "trial", "--model", str(tiny_model), "--traffic", str(traffic),
        "--speculative-config", spec, "--concurrency", "1", "2", "--num-requests", "4", "--warmup", "1",
        "--serving", '{"max_model_len": 512, "enforce_eager": true}', "--cpu", "--json",
        "--vllm-command", json.dumps([vllm, "serve"]), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["status"] == "succeeded" and out["engine"] == "vllm" and out["simulated"] is False
    assert [lv["level"]["value"] for lv in out["levels"]] == [1, 2]
    log = Path(out["log_path"]).read_text(errors="replace")
    assert log.count("Application startup complete") == 1  # both levels on one launch
    assert f"'model_tag': '{tiny_model}'" in log  # started as `vllm serve <model>`, the model positional
    c1 = out["levels"][0]["spec_decode"]
    assert c1["num_drafts"] > 0 and c1["num_accepted_tokens"] == c1["num_draft_tokens"]  # drafting for itself
    for lv in out["levels"]:
        assert lv["num_requests"] == 4 and lv["output_tokens"] == 4 * 24


def test_the_server_command_follows_the_flag_then_the_services_setting(
    traffic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tuner trial` starts vLLM as the service does: TUNER_VLLM_EXECUTABLE (``<it> serve``) unless
    --vllm-command says otherwise, else the module entry point."""
    from tuner.settings import Settings

    monkeypatch.setenv("TUNER_VLLM_EXECUTABLE", "/opt/vllm/bin/vllm")
    base = TrialArgs(model="m", traffic=traffic, concurrency=[1])
    executable = Settings().vllm_executable
    assert executable == "/opt/vllm/bin/vllm"
    runner = trial_cli.evaluator(base, vllm_executable=executable)
    assert runner.options.server_command() == ["/opt/vllm/bin/vllm", "serve"]
    flagged = trial_cli.evaluator(replace(base, vllm_command='["my-vllm", "serve"]'), vllm_executable=executable)
    assert flagged.options.server_command() == ["my-vllm", "serve"]
    default = trial_cli.evaluator(replace(base, vllm_python="/venv/bin/python"))
    assert default.options.server_command()[:2] == ["/venv/bin/python", "-m"]
