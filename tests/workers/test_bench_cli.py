"""``tuner bench`` against a server it did not launch: the protocol-speaking stand-in (fake_vllm.py) on a port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from runner_support import DATA

from tuner.cli import main
from tuner.workers.vllm_server import free_port

FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FAKE_VLLM_MODE": "serve", "FAKE_VLLM_OUTPUTS": str(DATA / "divergent_outputs.json")}
    env["FAKE_VLLM_SPECULATIVE_SET"] = "baseline"
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_VLLM), "--port", str(port), "--speculative-config", NGRAM], env=env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{base}/version", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        yield base
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def traffic(tmp_path: Path) -> Path:
    prompts = json.loads((DATA / "divergent_outputs.json").read_text())["prompts"]
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens": 16}) + "\n" for p in prompts))
    return path


def _bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_measures_a_running_server_with_its_metrics(server: str, traffic: Path, capsys) -> None:
    code, out, _ = _bench(
        capsys,
        *("--base-url", server, "--model", "fake", "--traffic", str(traffic), "--metrics-url", server),
        *("--concurrency", "1", "4", "--num-requests", "8", "--warmup", "1", "--json"),
    )
    assert code == 0, out
    doc = json.loads(out)
    assert doc["metrics"] is True and [lr["level"]["value"] for lr in doc["levels"]] == [1, 4]
    for lr in doc["levels"]:
        assert lr["num_requests"] == 8 and lr["errors"] == 0 and lr["output_tokens"] == 8 * 16
        sd = lr["spec_decode"]
        # 16 tokens: the prefill's first, then decode steps of two (a draft of 3, one accepted) and a last
        # step of one: 8 drafts, 7 accepted per request, read from the server's counters over the window
        assert sd["num_drafts"] == 8 * 8 and sd["num_accepted_tokens"] == 8 * 7
        assert lr["client_processes"] == 1


def test_without_a_metrics_url_acceptance_is_unknown_not_guessed(server: str, traffic: Path, capsys) -> None:
    code, out, _ = _bench(
        capsys, "--base-url", server, "--model", "fake", "--traffic", str(traffic), "--num-requests", "4"
    )
    assert code == 0, out
    assert "c1:" in out and "tok/s" in out and "TPOT mean" in out
    assert "acceptance: unknown" in out and "acceptance rate" not in out


def test_bench_refuses_more_requests_than_the_cap(server: str, traffic: Path, capsys) -> None:
    code, out, err = _bench(
        capsys,
        *("--base-url", server, "--model", "fake", "--traffic", str(traffic)),
        *("--concurrency", "1", "64", "--max-requests", "100"),
    )
    assert code == 2 and out == ""
    assert "292 requests planned" in err and "--max-requests 100" in err  # 32+2 at c1, 4 x 64 + 2 at c64


def test_api_key_and_headers_become_request_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from tuner.workers.bench_cli import BenchArgs, connection

    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    base = BenchArgs(base_url="https://x", model="m", traffic=Path("t"))
    conn = connection(replace(base, header=["X-Team: infra"], insecure=True))
    assert conn.headers == (("Authorization", "Bearer from-env"), ("X-Team", "infra"))
    assert conn.ssl_context() is False
    args = replace(base, api_key="k", ca_cert="/etc/ssl/certs/ca-certificates.crt")
    assert connection(args).headers[0] == ("Authorization", "Bearer k")
    with pytest.raises(typer.BadParameter):
        connection(replace(base, header=["no colon"]))


def test_insecure_and_a_ca_bundle_are_alternatives(traffic: Path, capsys) -> None:
    base = ["--base-url", "https://x", "--model", "m", "--traffic", str(traffic)]
    code, _, err = _bench(capsys, *base, "--insecure", "--ca-cert", "/etc/ssl/certs/ca-certificates.crt")
    assert code == 2 and "alternatives" in err
