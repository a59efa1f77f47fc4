"""A tune process SIGKILLed mid-way; a new one on the same storage finishes without re-running a trial."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna

from tests.search import kill_target

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_sigkill_mid_tune_then_resume(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    log = tmp_path / "started.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.search.kill_target", url, str(log), "0.3"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(_lines(log)) < 4:
            assert proc.poll() is None, "the tune finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    before = _lines(log)
    study = optuna.load_study(study_name="killed", storage=url)
    told = {t.number: t.user_attrs["spec"] for t in study.trials if "result" in t.user_attrs}
    running = [t.number for t in study.trials if t.state.name == "RUNNING"]
    assert told and running  # killed with finished trials and one in flight
    log.unlink()
    monkeypatch.setattr(kill_target.time, "sleep", lambda s: None)
    kill_target.main(url, str(log), 0.0)
    after = [line.split(" ", 1) for line in _lines(log)]
    assert after, "nothing left to run after the kill?"
    assert all(int(number) > max(told) for number, _ in after)  # no finished trial number ran again
    finished_keys = {line.split(" ", 1)[1] for line in before[: len(told)]}
    study = optuna.load_study(study_name="killed", storage=url)
    search_after = [
        t
        for t in study.trials
        if t.number > max(told) and t.user_attrs.get("purpose") == "search" and "result" in t.user_attrs
    ]
    from tuner.domain import SpecConfig, from_jsonable

    assert not [
        t
        for t in search_after
        if from_jsonable(SpecConfig, t.user_attrs["spec"]).key() in finished_keys
        and t.user_attrs.get("retry_of") is None
    ]
    assert all(t.state.name != "RUNNING" for t in study.trials)
    assert study.user_attrs.get("search_finished")
