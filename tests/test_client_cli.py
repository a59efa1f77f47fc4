"""The client commands end to end against a real `tuner serve` (uvicorn, a free port, its own SQLite file,
the simulated engine): submit and follow to the end, list, status, recommend, report, Ctrl-C that leaves the
job running, cancel, and errors that are the API's problem title, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tuner.cli import main
from tuner.demo import DEFAULT_MODEL, LLAMA_8B_CONFIG

TUNER = Path(sys.executable).parent / "tuner"


@dataclass
class Served:
    url: str
    token: str
    env: dict[str, str]  # what a client process needs: TUNER_SERVER and TUNER_TOKEN
    traffic: Path
    hf_config: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("served")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    server_env = base_env | {
        "TUNER_DATABASE_URL": f"sqlite:///{tmp / 'tuner.db'}",
        "TUNER_DATA_DIR": str(tmp),
        "TUNER_POLL_S": "0.1",
        "TUNER_HEARTBEAT_S": "0.5",
        "TUNER_SIMULATED_TRIAL_S": "0.3",  # long enough to see a trial run and to cancel a job in flight
    }
    subprocess.run([str(TUNER), "db", "upgrade"], env=server_env, check=True, capture_output=True, timeout=120)
    made = subprocess.run(
        [str(TUNER), "token", "create", "--scope", "tune", "--scope", "read"],
        env=server_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    token = made.stdout.strip().splitlines()[-1]
    assert "cli-" in made.stderr  # the default name says who made it
    port = _free_port()
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [str(TUNER), "serve", "--port", str(port), "--log-level", "warning"],
        env=server_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "tuner serve did not come up"
        time.sleep(0.1)
    traffic = tmp / "traffic.jsonl"
    lines = [{"prompt": f"# Python\ndef f{i}(x):\n", "output_tokens": 64} for i in range(8)]
    lines += [{"messages": [{"role": "user", "content": f"Explain topic {i}."}], "max_tokens": 96} for i in range(8)]
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    hf_config = tmp / "config.json"
    hf_config.write_text(json.dumps(LLAMA_8B_CONFIG))
    try:
        yield Served(url, token, base_env | {"TUNER_SERVER": url, "TUNER_TOKEN": token}, traffic, hf_config)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


@pytest.fixture
def client_env(served: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Served:
    """The in-process CLI sees the server through the environment, as a user's shell would set it."""
    for k in [k for k in os.environ if k.startswith("TUNER_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("TUNER_SERVER", served.url)
    monkeypatch.setenv("TUNER_TOKEN", served.token)
    monkeypatch.setenv("TUNER_CLIENT_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.chdir(tmp_path)
    return served


def tune_args(s: Served, *extra: str) -> list[str]:
    return [
        "tune", "--model", DEFAULT_MODEL, "--traffic", str(s.traffic), "--engine", "simulated",
        "--hf-config", str(s.hf_config), "--concurrency", "1", "8", "--num-requests", "16", "--budget", "3",
        *extra,
    ]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_submit_follow_recommend_report(client_env: Served, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, out, err = run(capsys, *tune_args(client_env, "--wait", "--poll", "0.2"))
    assert code == 0, out + err
    job_id = out.split()[1]
    assert f"job {job_id} succeeded" in out and "best " in out and "[SIMULATED]" in out
    assert f"tuner recommend --model {DEFAULT_MODEL} --engine simulated" in out
    # the progress, on stderr: trials done of the budget, a trial while it ran, the best so far
    assert "/3 trials" in err and "running" in err and "(baseline)" in err
    assert "succeeded: 3/3 trials" in err

    code, out, _ = run(capsys, "status", job_id, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "succeeded" and doc["trials"][0]["purpose"] == "baseline"
    code, out, _ = run(capsys, "status", job_id)
    assert code == 0 and f"job {job_id}: {DEFAULT_MODEL}" in out and "baseline" in out and "off" in out

    code, out, _ = run(capsys, "jobs")
    assert code == 0 and job_id in out and "succeeded" in out
    code, out, _ = run(capsys, "jobs", "--status", "queued", "--json")
    assert code == 0 and job_id not in out

    code, out, _ = run(capsys, "recommend", "--model", DEFAULT_MODEL, "--engine", "simulated", "--concurrency", "8")
    assert code == 0 and "SIMULATED RECOMMENDATION" in out and "deploy: vllm serve " + DEFAULT_MODEL in out
    assert f"provenance: job {job_id}" in out

    code, out, err = run(capsys, "report", job_id)
    assert code == 0, err
    written = tmp_path / f"tuner-report-{job_id}.html"
    assert out.strip() == str(written.relative_to(tmp_path)) and written.read_text().lstrip().lower().startswith(
        "<!doctype html"
    )
    code, out, _ = run(capsys, "report", job_id, "-o", str(tmp_path / "r.html"))
    assert code == 0 and (tmp_path / "r.html").read_bytes() == written.read_bytes()


def test_ctrl_c_leaves_the_job_running_and_cancel_stops_it(client_env: Served, capsys) -> None:
    """A follower interrupted says how to follow again; the job runs on until `tuner cancel` stops it."""
    proc = subprocess.Popen(
        [str(TUNER), *tune_args(client_env, "--budget", "40", "--wait", "--poll", "0.2")],
        env=client_env.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    headers = {"Authorization": f"Bearer {client_env.token}"}
    while not (running := httpx.get(f"{client_env.url}/tune", params={"status": "running"}, headers=headers).json()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    job_id = running[0]["id"]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert f"job {job_id} keeps running" in err and f"tuner status {job_id} --wait" in err
    assert f"tuner cancel {job_id}" in err and "Traceback" not in err
    code, out, _ = run(capsys, "status", job_id, "--json")
    assert json.loads(out)["status"] == "running"

    code, out, _ = run(capsys, "cancel", job_id)
    assert code == 0 and f"job {job_id}: cancel requested" in out
    code, out, _ = run(capsys, "status", job_id, "--wait", "--poll", "0.2", "--json")
    assert json.loads(out)["status"] == "cancelled"
    code, _, err = run(capsys, "cancel", job_id)  # a finished job: the API's 409, as a message
    assert code == 1 and "Conflict (409)" in err and "already cancelled" in err and "Traceback" not in err


def test_errors_are_the_problem_title_and_detail(client_env: Served, capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "output_tokens": 4}\n{"nonsense": true}\n')
    code, out, err = run(capsys, "tune", "--model", "m", "--traffic", str(bad))
    assert code == 1 and out == ""
    assert err.startswith("tuner tune: Invalid input (422)") and "Traceback" not in err
    assert "  2" in err or "line 2" in err  # the line at fault, from the problem's errors
    code, _, err = run(capsys, "status", "0" * 32)
    assert code == 1 and err.strip() == f"tuner status: Not found (404): no tune job {'0' * 32}"
    code, _, err = run(capsys, "jobs", "--token", "not-a-token")
    assert code == 1 and "Unauthorized (401)" in err
    code, _, err = run(capsys, "jobs", "--server", f"http://127.0.0.1:{_free_port()}")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "cannot reach the spec-tuner server" in err
    assert "URL from --server" in err


def test_the_config_file_names_the_server_and_token(served: Served, tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text(f'server = "{served.url}"\ntoken = "{served.token}"\n')
    config.chmod(0o600)
    env = {k: v for k, v in served.env.items() if k not in ("TUNER_SERVER", "TUNER_TOKEN")}
    done = subprocess.run(
        [str(TUNER), "jobs", "--json"],
        env=env | {"TUNER_CLIENT_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list) and "warning" not in done.stderr
