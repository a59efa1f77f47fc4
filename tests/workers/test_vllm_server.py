"""Server argv, process-group teardown and the runner's start-up failures, with stand-in processes."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from runner_support import assert_group_gone

from tuner.domain import (
    FailureClass,
    LoadLevel,
    ModelRef,
    ServingConfig,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialContext,
    TrialSpec,
    TrialStatus,
    env_name_allowed,
)
from tuner.workers.options import RunnerOptions
from tuner.workers.process_group import group_members, kill_process_group, start_gated
from tuner.workers.vllm_runner import VllmRunner
from tuner.workers.vllm_server import (
    ServerExited,
    StartupTimeout,
    VllmServer,
    build_serve_argv,
    free_port,
)

PY = sys.executable


def test_build_serve_argv_passes_the_spec_as_json() -> None:
    spec = SpecConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    serving = ServingConfig(args={"max_model_len": 512, "enforce_eager": True, "enable_prefix_caching": False})
    argv = build_serve_argv(
        ModelRef("org/m", revision="abc"), serving, spec, 8123, command=["vllm", "serve"], extra_args=["--x"]
    )
    assert argv[:4] == ["vllm", "serve", "org/m", "--revision=abc"]  # vllm serve takes the model positionally
    assert argv[-5:] == ["--host", "127.0.0.1", "--port", "8123", "--x"]  # the runtime extras come last
    assert "--model" not in argv
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--max-model-len") + 1] == "512"
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_the_module_entry_point_gets_the_model_as_a_flag() -> None:
    command = [PY, "-m", "vllm.entrypoints.openai.api_server"]
    argv = build_serve_argv(ModelRef("org/m"), ServingConfig(), SpecConfig(), 8123, command=command)
    assert argv == [*command, "--model", "org/m", "--host", "127.0.0.1", "--port", "8123"]


def test_no_speculation_means_no_flag() -> None:
    off = build_serve_argv(ModelRef("m"), ServingConfig(), SpecConfig(), 1, command=["vllm", "serve"])
    assert "--speculative-config" not in off


# K=0 above batch size 1: ngram proposes at batch 1 and nothing from 2 up. vLLM rejects a top-level
# num_speculative_tokens of 0, so a schedule is how K=0 is expressed; it keeps the speculative path (and its
# cost) and must stay a configuration of its own, distinct from "off" and from the static k=3.
K0_ABOVE_1 = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]],
}


def test_a_k0_schedule_is_a_speculative_config_not_off() -> None:
    spec = SpecConfig.from_vllm(K0_ABOVE_1)
    assert not spec.is_off and spec.schedule == ((1, 1, 3), (2, 1024, 0))
    assert [spec.k_at(b) for b in (1, 2, 8, 1024, 4096)] == [3, 0, 0, 0, 0]  # the tail carries K=0
    argv = build_serve_argv(ModelRef("m"), ServingConfig(), spec, 1, command=["vllm", "serve"])
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == K0_ABOVE_1
    static = SpecConfig.from_vllm({k: v for k, v in K0_ABOVE_1.items() if k != "num_speculative_tokens_per_batch_size"})
    assert len({spec.key(), static.key(), SpecConfig().key()}) == 3


def test_a_k0_schedule_round_trips_through_json() -> None:
    spec = SpecConfig.from_vllm(K0_ABOVE_1)
    argv = build_serve_argv(ModelRef("m"), ServingConfig(), spec, 1, command=["vllm", "serve"])
    assert SpecConfig.from_vllm(json.loads(argv[argv.index("--speculative-config") + 1])) == spec


def _spawn_group(script: str, tmp_path: Path) -> VllmServer:
    return VllmServer([PY, "-c", script], port=free_port(), log_path=tmp_path / "s.log", grace_s=1.0)


def test_kill_process_group_takes_children_and_term_ignorers(tmp_path: Path) -> None:
    # A leader with two children, one of which ignores SIGTERM: only SIGKILL after the grace ends it.
    script = (
        "import signal, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    server = _spawn_group(script, tmp_path)
    with server:
        deadline = time.monotonic() + 10
        while len(group_members(server.pgid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(server.pgid)) == 3
        while "1" not in server.log_tail() and time.monotonic() < deadline:
            time.sleep(0.05)  # the SIGTERM handler is installed
    assert_group_gone(server.pgid)
    assert kill_process_group(server.pgid) is True  # already gone: harmless


def test_kill_process_group_refuses_init() -> None:
    with pytest.raises(ValueError):
        kill_process_group(1)


def test_wait_ready_sees_the_process_die(tmp_path: Path) -> None:
    server = _spawn_group("import sys; print('ValueError: nope'); sys.exit(3)", tmp_path)
    with server, pytest.raises(ServerExited) as info:
        server.wait_ready(30, poll_s=0.05)
    assert info.value.returncode == 3
    assert "ValueError: nope" in server.log_tail()


def test_wait_ready_times_out_and_the_group_is_stopped(tmp_path: Path) -> None:
    server = _spawn_group("import time; time.sleep(60)", tmp_path)
    with server, pytest.raises(StartupTimeout):
        server.wait_ready(0.5, poll_s=0.05)
    assert_group_gone(server.pgid)


def test_wait_ready_answers_when_health_is_200(tmp_path: Path) -> None:
    port = free_port()
    script = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    server = VllmServer([PY, "-c", script], port=port, log_path=tmp_path / "h.log", grace_s=1.0)
    with server:
        assert server.wait_ready(20, poll_s=0.05) < 20
    assert_group_gone(server.pgid)


# --- the runner's start-up failures, with a stand-in for vLLM ------------------------------------------
FAKE_REFUSAL = """
import sys
print("Traceback (most recent call last):", file=sys.stderr)
print("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig", file=sys.stderr)
print("  Value error, bad k [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]", file=sys.stderr)
sys.exit(1)
"""


def _trial(**kw: object) -> TrialSpec:
    return TrialSpec(
        model=ModelRef("tiny"),
        spec=SpecConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 2}),
        levels=(LoadLevel(num_requests=1),),
        requests=(TrafficRequest(TrafficFormat.COMPLETIONS, prompt="x", output_tokens=4),),
        **kw,
    )


def _runner(tmp_path: Path, script: str, **kw: object) -> VllmRunner:
    path = tmp_path / "fake_vllm.py"
    path.write_text(script)
    return VllmRunner(RunnerOptions(vllm_command=(PY, str(path)), log_dir=str(tmp_path), stop_grace_s=1.0, **kw))


def test_runner_reports_unsupported_with_vllms_message(tmp_path: Path) -> None:
    pgids: list[int] = []
    result = _runner(tmp_path, FAKE_REFUSAL)(_trial(), TrialContext(on_process_started=pgids.append))
    assert result.status is TrialStatus.FAILED
    assert result.failure is not None and result.failure.cls is FailureClass.UNSUPPORTED
    assert "Value error, bad k" in result.failure.reason
    assert "ValidationError" in result.failure.log_tail
    assert result.pgid == pgids[0]
    assert Path(result.log_path).exists()
    assert_group_gone(result.pgid)


def test_runner_startup_timeout_leaves_no_process(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "import time; time.sleep(60)", startup_timeout_s=1.0)
    result = runner(_trial())
    assert result.failure is not None and result.failure.cls is FailureClass.STARTUP_TIMEOUT
    assert_group_gone(result.pgid)


def test_runner_cancel_during_startup(tmp_path: Path) -> None:
    result = _runner(tmp_path, "import time; time.sleep(60)")(_trial(), TrialContext(is_cancelled=lambda: True))
    assert result.status is TrialStatus.CANCELLED
    assert result.failure is not None and result.failure.cls is FailureClass.CANCELLED
    assert_group_gone(result.pgid)


def test_runner_refuses_env_outside_the_allowlist(tmp_path: Path) -> None:
    result = _runner(tmp_path, "raise SystemExit(0)")(_trial(serving=ServingConfig(env={"LD_PRELOAD": "x"})))
    assert result.failure is not None and result.failure.cls is FailureClass.UNSUPPORTED
    assert result.pgid is None


def test_runner_passes_device_visibility(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = (
        "import json, os, sys\n"
        "names = ('CUDA_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES')\n"
        f"json.dump({{k: os.environ.get(k) for k in names}}, open({str(out)!r}, 'w'))\n"
        "sys.exit(1)\n"
    )
    _runner(tmp_path, script)(_trial(gpu_ids=(2, 3)))
    assert json.loads(out.read_text()) == {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"}
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "2,3"  # ours untouched


def test_the_server_inherits_the_workers_env_without_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "env.json"
    script = f"import json, os, sys\njson.dump(dict(os.environ), open({str(out)!r}, 'w'))\nsys.exit(1)\n"
    monkeypatch.setenv("TUNER_DATABASE_URL", "postgresql+psycopg://tuner:hunter2@db/tuner")
    monkeypatch.setenv("PGPASSWORD", "hunter2")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "r")
    monkeypatch.setenv("GITHUB_TOKEN", "g")
    monkeypatch.setenv("HF_TOKEN", "hf_gated")
    monkeypatch.setenv("HF_HOME", "/models/hf")
    job_env = {"PYTORCH_TUNABLEOP_FILENAME": "/root/.bashrc", "NCCL_DEBUG": "INFO"}
    _runner(tmp_path, script)(_trial(serving=ServingConfig(env=job_env)))
    env = json.loads(out.read_text())
    assert not {"TUNER_DATABASE_URL", "PGPASSWORD", "RAY_AUTH_TOKEN", "GITHUB_TOKEN"} & set(env)
    assert "hunter2" not in json.dumps(env)
    assert env["HF_TOKEN"] == "hf_gated" and env["HF_HOME"] == "/models/hf" and env["PATH"]
    # a path the job names is confined to the trial's own directory, under the worker's log dir
    tunable = Path(env["PYTORCH_TUNABLEOP_FILENAME"])
    assert tunable.name == ".bashrc" and tunable.parent.is_dir() and tmp_path in tunable.parents
    assert env["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize(
    "name",
    ["HSA_TOOLS_LIB", "NCCL_NET_PLUGIN", "NCCL_DEBUG_FILE", "RCCL_MSCCL_PATH", "LD_PRELOAD", "A=B", "X\x00", ""],
)
def test_a_job_may_not_set_variables_that_load_code_or_write_files(name: str) -> None:
    assert not env_name_allowed(name)


def test_a_job_may_set_tuning_variables() -> None:
    for name in ("NCCL_DEBUG", "HSA_NO_SCRATCH_RECLAIM", "PYTORCH_TUNABLEOP_ENABLED", "PYTORCH_TUNABLEOP_FILENAME"):
        assert env_name_allowed(name), name


FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"


def _fake_runner(tmp_path: Path, mode: str) -> VllmRunner:
    options = RunnerOptions(
        vllm_command=(PY, str(FAKE_VLLM)), log_dir=str(tmp_path), stop_grace_s=1.0, extra_env={"FAKE_VLLM_MODE": mode}
    )
    return VllmRunner(options)


def test_runner_server_dying_mid_run_is_a_crash(tmp_path: Path) -> None:
    result = _fake_runner(tmp_path, "die")(_trial())
    assert result.status is TrialStatus.FAILED
    assert result.failure is not None and result.failure.cls is FailureClass.CRASH
    assert "EngineDeadError" in result.failure.reason
    assert result.vllm_version == "0.0-fake" and result.startup_s is not None
    assert_group_gone(result.pgid)


def test_runner_request_errors_above_threshold(tmp_path: Path) -> None:
    result = _fake_runner(tmp_path, "reject")(_trial())
    assert result.failure is not None and result.failure.cls is FailureClass.REQUEST_ERRORS
    assert result.failure.reason.startswith("1 of 1 requests failed; e.g. HTTP 400")
    assert len(result.levels) == 1 and result.levels[0].errors == 1  # the figures that were measured are kept
    assert_group_gone(result.pgid)


def test_runner_missing_executable_is_an_infrastructure_failure(tmp_path: Path) -> None:
    runner = VllmRunner(RunnerOptions(vllm_command=(str(tmp_path / "no-such-vllm"),), log_dir=str(tmp_path)))
    result = runner(_trial())
    assert result.failure is not None and result.failure.cls is FailureClass.INFRA
    assert "no-such-vllm" in result.failure.reason and result.pgid is None


def test_a_failing_pgid_callback_stops_the_process(tmp_path: Path) -> None:
    seen: list[int] = []

    def store(pgid: int) -> None:
        seen.append(pgid)
        raise RuntimeError("database is down")

    result = _runner(tmp_path, "import time; time.sleep(60)")(_trial(), TrialContext(on_process_started=store))
    assert result.failure is not None and result.failure.cls is FailureClass.INFRA
    assert "database is down" in result.failure.reason
    assert_group_gone(seen[0])


def test_a_gated_process_runs_nothing_until_its_group_is_recorded(tmp_path: Path) -> None:
    """start_gated: the command runs only after on_started returned; if it raises, the command never runs."""
    marker = tmp_path / "ran"
    seen: list[tuple[int, bool]] = []

    def record(pgid: int) -> None:
        time.sleep(0.3)  # time enough for an ungated command to have written its marker
        seen.append((pgid, marker.exists()))

    proc = start_gated(["touch", str(marker)], on_started=record)
    assert proc.wait(timeout=10) == 0 and marker.exists()
    assert seen == [(proc.pid, False)]

    def refuse(pgid: int) -> None:
        raise RuntimeError("the store is away")

    other = tmp_path / "never"
    with pytest.raises(RuntimeError):
        start_gated(["touch", str(other)], on_started=refuse)
    time.sleep(0.2)
    assert not other.exists()
    with pytest.raises(FileNotFoundError):
        start_gated(["no-such-program-here"], on_started=record)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_server_kept_off_the_client_cores_runs_only_on_the_others(tmp_path: Path) -> None:
    """Pinned before the gate opens, so the server and everything it spawns stay off the clients' cores."""
    cores = sorted(os.sched_getaffinity(0))
    script = "import os, subprocess, sys, time; print(sorted(os.sched_getaffinity(0)), flush=True); " + (
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    server = VllmServer([sys.executable, "-c", script], port=free_port(), log_path=tmp_path / "s.log", cpus=cores[:1])
    with server, pytest.raises(ServerExited):
        server.wait_ready(30, poll_s=0.05)
    assert server.log_tail().split("\n")[:2] == [str(cores[:1])] * 2


def test_runner_refuses_a_local_model_outside_its_roots(tmp_path: Path) -> None:
    runner = VllmRunner(
        RunnerOptions(vllm_command=(PY, "-c", "raise SystemExit(0)"), model_roots=(str(tmp_path / "m"),))
    )
    result = runner(TrialSpec(model=ModelRef("/etc"), spec=SpecConfig(), levels=(LoadLevel(),), requests=()))
    assert result.failure is not None and result.failure.cls is FailureClass.UNSUPPORTED
    assert "outside the worker's model roots" in result.failure.reason and result.pgid is None
