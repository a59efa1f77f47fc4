"""What a finished job publishes and how ``GET /recommendation`` answers (tuner/recommendations.py).

- Per-concurrency-range answers: the best measured at each level, said plainly when it is "off".
- History, staleness, workload matching and the serving configuration as part of the key, on jobs run by the
  job runner with test doubles (tests/fakes.py).
- The correctness gate: a job whose speculative trials diverge never recommends them. The real job runner, the
  real planner, the real VllmRunner, against the protocol-speaking stand-in for vLLM (tests/workers/fake_vllm.py),
  which serves recorded outputs (tests/workers/data/divergent_outputs.json): without a speculative config the
  reference, with one a broken config's early-diverging tokens, delivered two per step so the speculative server
  is clearly faster. The control job serves the reference from both, and the same search recommends ngram: only
  the gate stands between the diverged trial and the recommendation.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.fakes import LEVELS, REQUESTS, SPECS, FakeEvaluator, ListPlanner, ThreadExecutor, runner, submit
from tuner import recommendations, runs, tuning
from tuner.domain import (
    Budget,
    Engine,
    JobSpec,
    LevelWinner,
    LoadKind,
    LoadLevel,
    Method,
    ModelRef,
    ServingConfig,
    SpecConfig,
    Speedup,
    TrafficFormat,
    TrafficRequest,
    TuneOutcome,
)
from tuner.errors import NotFound
from tuner.job_runner import JobRunner
from tuner.recommendations import level_answer, level_ranges
from tuner.search import OptunaPlanner, build_space
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, TrafficSampleRow
from tuner.workers.options import RunnerOptions
from tuner.workers.vllm_runner import VllmRunner

DEPLOYED = SpecConfig(Method.EAGLE3, 4, model="d", schedule=((1, 16, 4), (17, 1024, 0)))
OTHER = SpecConfig(Method.NGRAM, 3)


def outcome(per_level: dict[str, float]) -> TuneOutcome:
    speedup = Speedup(mean=1.3, low=1.25, high=1.35, runs=3, per_level=per_level)
    return TuneOutcome(
        best=SpecConfig(Method.EAGLE3, 4, model="d"),
        schedule=DEPLOYED,
        per_level_winners=(),
        speedup=speedup,
        baseline_trial=0,
        best_trial=3,
        noise=0.03,
    )


@pytest.mark.parametrize(
    ("winner", "expect_spec", "confirmed", "says"),
    [
        (LevelWinner("c1", DEPLOYED, 1.8, 9), DEPLOYED, True, "runs on fresh servers"),
        # the deployed schedule runs K=0 at c128 and measured 0.89x there: that range deploys nothing
        (LevelWinner("c128", DEPLOYED, 0.89, 9), SpecConfig(), False, "0.890x there over 3 runs on fresh servers"),
        (LevelWinner("c64", SpecConfig(), 1.0, 0), SpecConfig(), False, "nothing beat the baseline there"),
        (LevelWinner("c8", OTHER, 1.01, 5), SpecConfig(), False, "within noise"),
        (LevelWinner("c8", OTHER, 1.40, 5), OTHER, False, "one search trial (unconfirmed)"),
    ],
)
def test_level_answer(winner: LevelWinner, expect_spec: SpecConfig, confirmed: bool, says: str) -> None:
    out = outcome({"c1": 1.8, "c8": 1.5, "c64": 1.02, "c128": 0.89})
    spec, speedup, why = level_answer(out, winner)
    assert spec.key() == expect_spec.key()
    assert (speedup is not None) is confirmed
    assert says in why and why.startswith(("No speculation", "Speedup"))


def test_level_ranges_split_at_geometric_midpoints() -> None:
    ranges = level_ranges([1, 8, 32, 128])
    assert [(r.low, r.high) for r in ranges] == [(1, 2), (3, 16), (17, 64), (65, None)]


def test_history_staleness_and_workload_class(db_url: str) -> None:
    """Through one warm render cache, as the API keeps it: new answers and staleness still show at once."""
    factory = make_session_factory(make_engine(db_url))
    cache = recommendations.RenderCache(size=2)
    first = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with factory() as s:
        uncached = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache) == uncached
    second = submit(factory)
    runner(factory, ListPlanner(SPECS[:1]), FakeEvaluator()).run_once()
    with factory() as s:
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache)
        assert rec["provenance"]["job_id"] == second
        assert [h["job_id"] for h in rec["history"]] == [first]  # past answers are kept
        assert rec["stale"] is False
        cls = rec["measured_on"]["workload_class"]
        assert recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=cls)["id"] == rec["id"]
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload="code/prompt-long/x")
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, hardware="mi355x")
    with transaction(factory) as s:  # a worker for that hardware now reports a newer vLLM
        tuning.report_worker(s, "gpu-node-1", {"hardware": "cpu", "vllm_version": "0.34.0", "driver": "rocm 7.0"})
    with factory() as s:
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache)
        assert rec["stale"] is True and "0.34.0" in rec["stale_reason"]
        assert rec == recommendations.find(s, model="org/m", engine=Engine.SIMULATED)  # cached == fresh


def test_tomorrows_sample_of_the_same_kind_finds_todays_answer(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with transaction(factory) as s:  # tomorrow's traffic: other prompts, same lengths, so the same class
        tomorrow = tuning.create_traffic(s, [dataclasses.replace(r, prompt=r.prompt + "!") for r in REQUESTS])
        other = tuning.create_traffic(s, [dataclasses.replace(r, output_tokens=2000) for r in REQUESTS])
        today = s.get(JobRow, job).traffic_id
        assert tomorrow.workload_class == s.get(TrafficSampleRow, today).workload_class
        assert other.workload_class != tomorrow.workload_class
        ids = (tomorrow.id, tomorrow.fingerprint, other.id, s.get(TrafficSampleRow, today).fingerprint)
    with factory() as s:
        for workload in ids[:2]:
            rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=workload)
            assert rec["provenance"]["job_id"] == job and rec["matched_by"] == "workload_class"
            assert rec["measured_on"]["traffic_id"] == today  # says which sample it was measured on
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=ids[2])
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=ids[3])
        assert rec["matched_by"] == "fingerprint"


def test_the_serving_configuration_is_part_of_the_key(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    plain = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with transaction(factory) as s:  # the same model tuned again for a TP=2, fp8-KV production setup
        traffic = tuning.create_traffic(s, REQUESTS)
        serving = ServingConfig(args={"tensor_parallel_size": 2, "kv_cache_dtype": "fp8"})
        tp2, _ = tuning.submit_job(
            s,
            JobSpec(ModelRef("org/m"), traffic.id, engine=Engine.SIMULATED, levels=LEVELS, serving=serving),
        )
        tp2 = tp2.id
    runner(factory, ListPlanner(SPECS[:1]), FakeEvaluator()).run_once()
    with factory() as s:
        newest = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert newest["provenance"]["job_id"] == tp2
        assert "--tensor-parallel-size" in newest["serve_args"] and newest["history"] == []
        (other,) = newest["other_serving_configs"]
        assert other["job_id"] == plain
        by_key = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, serving=other["serving_key"])
        assert by_key["provenance"]["job_id"] == plain and "--tensor-parallel-size" not in by_key["serve_args"]
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, serving="0" * 64)


WORKERS = Path(__file__).parent / "workers"
FAKE_VLLM = WORKERS / "fake_vllm.py"
RECORDED = WORKERS / "data" / "divergent_outputs.json"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000}
GATE_LEVELS = (
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
        levels=GATE_LEVELS,
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

    gated = JobRunner(
        factory,
        planner_factory=planner,
        executor_factory=lambda job: ThreadExecutor(VllmRunner(options), slots=1),  # type: ignore[arg-type]
        heartbeat_s=0.2,
        poll_s=0.05,
        log_dir=log_dir,
    )
    assert gated.run_once() == job_id
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
