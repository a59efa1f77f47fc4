"""A job whose speculative trials diverge never recommends them: the real job runner, the real planner, the
real VllmRunner, against the protocol-speaking stand-in for vLLM (tests/workers/fake_vllm.py).

The stand-in serves recorded outputs (tests/workers/data/divergent_outputs.json): without a speculative config
the reference, with one a broken config's early-diverging tokens, delivered two per step so the speculative
server is clearly faster. The control job serves the reference from both, and the same search recommends
ngram: only the gate stands between the diverged trial and the recommendation.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from tests.fakes import ThreadExecutor
from tuner import recommendations, runs, tuning
from tuner.domain import (
    Budget,
    Engine,
    JobSpec,
    LoadKind,
    LoadLevel,
    Method,
    ModelRef,
    TrafficFormat,
    TrafficRequest,
)
from tuner.job_runner import JobRunner
from tuner.search import OptunaPlanner, build_space
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow
from tuner.workers.options import RunnerOptions
from tuner.workers.vllm_runner import VllmRunner

WORKERS = Path(__file__).parents[1] / "workers"
FAKE_VLLM = WORKERS / "fake_vllm.py"
RECORDED = WORKERS / "data" / "divergent_outputs.json"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000}
LEVELS = (
    LoadLevel(LoadKind.CONCURRENCY, 1, num_requests=4, warmup_requests=1),
    LoadLevel(LoadKind.CONCURRENCY, 4, num_requests=8, warmup_requests=0),
)


def _requests() -> list[TrafficRequest]:
    prompts = json.loads(RECORDED.read_text())["prompts"]
    return [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=p, output_tokens=16) for p in prompts]


def _run_job(db_url: str, log_dir: Path, speculative_set: str) -> tuple[str, sessionmaker[Session]]:
    factory = make_session_factory(make_engine(db_url))
    spec = JobSpec(
        model=ModelRef("fake"),
        traffic_id="",
        hardware="cpu",
        engine=Engine.VLLM,
        levels=LEVELS,
        budget=Budget(max_trials=4),
        methods=(Method.NGRAM,),
        depth_range=(3, 3),
        confirm_runs=1,
        correctness_prompts=4,
    )
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, _requests())
        job, _ = tuning.submit_job(s, dataclasses.replace(spec, traffic_id=traffic.id))
        job_id = job.id
    options = RunnerOptions(
        vllm_command=(sys.executable, str(FAKE_VLLM)),
        stop_grace_s=1.0,
        metrics_interval_s=0.05,
        extra_env={
            "FAKE_VLLM_MODE": "serve",
            "FAKE_VLLM_OUTPUTS": str(RECORDED),
            "FAKE_VLLM_SPECULATIVE_SET": speculative_set,
            "FAKE_VLLM_STEP_S": "0.005",
        },
    )

    def planner(job_id: str, job: JobSpec, reqs: list[TrafficRequest]) -> OptunaPlanner:
        space = build_space(
            "fake", LLAMA, hardware="cpu", vllm_version="0.32.0", methods=list(job.methods or ()),
            depth_range=job.depth_range, ngram_lookups=[(1, 3)],
        )  # fmt: skip
        return OptunaPlanner(space, job.levels, budget=job.budget, confirm_runs=job.confirm_runs, study_name=job_id)

    runner = JobRunner(
        factory,
        planner_factory=planner,
        executor_factory=lambda job: ThreadExecutor(VllmRunner(options), slots=1),  # type: ignore[arg-type]
        heartbeat_s=0.2,
        poll_s=0.05,
        log_dir=log_dir,
    )
    assert runner.run_once() == job_id
    return job_id, factory


def test_a_diverged_trial_never_reaches_a_recommendation(db_url: str, tmp_path: Path) -> None:
    job_id, factory = _run_job(db_url, tmp_path, "speculative")
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "succeeded", job.error
        trials = tuning.list_trials(s, job_id)
        diverged = [t for t in trials if t.status == "diverged"]
        assert diverged, [(t.number, t.status, t.failure_reason) for t in trials]
        for t in diverged:
            result = runs.trial_result(t)
            assert result is not None and result.levels and result.correctness is not None
            assert [c.common_prefix for c in result.correctness.comparisons] == [2, 1, 3, 14]
        assert all(t.status in ("succeeded", "diverged") for t in trials)
        for concurrency in (None, 1, 4):  # the overall answer and each level's
            rec = recommendations.find(s, model="fake", concurrency=concurrency)
            assert rec["speculative_config"] is None, rec  # "no speculation", said plainly
            assert rec["speculation"] == "off" and "--speculative-config" not in rec["serve_args"]
            assert set(rec["provenance"]["trial_numbers"]).isdisjoint(t.number for t in diverged)
            assert all(w["spec"]["method"] == "off" for w in rec["per_level_winners"])
        overall = recommendations.find(s, model="fake")
        assert any("diverged" in note for note in overall["notes"]), overall["notes"]  # and says why


def test_the_control_job_recommends_the_same_config_when_it_is_lossless(db_url: str, tmp_path: Path) -> None:
    job_id, factory = _run_job(db_url, tmp_path, "baseline")
    with factory() as s:
        assert s.get(JobRow, job_id).status == "succeeded"
        assert all(t.status == "succeeded" for t in tuning.list_trials(s, job_id))
        rec = recommendations.find(s, model="fake")
        assert rec["speculative_config"]["method"] == "ngram", rec
