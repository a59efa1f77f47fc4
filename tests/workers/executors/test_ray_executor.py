"""RayExecutor on a local multi-node Ray cluster with declared GPUs: parallelism bounded by free GPUs,
routing by hardware, a worker killed mid-trial and recovered with its processes gone, hangs killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.domain import Engine, FailureClass, TrialContext, TrialStatus
from tuner.workers.executors import EvaluatorRecipe, HardwareMismatch
from tuner.workers.executors.testing import group_gone, make_spec, read_records, wait_for
from tuner.workers.process_group import kill_process_group

MI300X_OAM = "AMD-Instinct-MI300X-OAM"
MI300X_HF = "AMD-Instinct-MI300X-HF"
pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from tuner.workers.executors.ray_executor import RayExecutor  # noqa: E402


def sleep_recipe(record_dir, **options) -> EvaluatorRecipe:
    return EvaluatorRecipe(
        Engine.SIMULATED,
        {"record_dir": str(record_dir), **options},
        factory="tuner.workers.executors.testing:SleepEvaluator",
    )


def max_overlap(starts: list[dict], dones: list[dict]) -> int:
    by_pgid = {d["pgid"]: d["t"] for d in dones}
    events = sorted([(s["t"], 1) for s in starts] + [(by_pgid[s["pgid"]], -1) for s in starts])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_free_slots_count_gpus_per_node_and_hardware(ray_cluster, tmp_path):
    mi300x = RayExecutor(sleep_recipe(tmp_path), hardware="mi300x", hang_grace_s=0.5)
    h100 = RayExecutor(sleep_recipe(tmp_path), hardware="h100")
    anything = RayExecutor(sleep_recipe(tmp_path), hardware="auto")
    try:
        # OAM node: 2 GPUs, HF node: 1 GPU; both MI300X. A TP=2 group fits only on the OAM node.
        assert mi300x.free_slots(1) == 3
        assert mi300x.free_slots(2) == 1
        assert mi300x.free_slots(4) == 0
        assert h100.free_slots(1) == 1 and h100.free_slots(2) == 0
        assert anything.free_slots(1) == 4
        with pytest.raises(HardwareMismatch):
            h100.submit(make_spec(hardware="mi300x"), TrialContext())
        # No node can hold TP=4: an infrastructure failure at once, nothing queued forever.
        result = mi300x.submit(make_spec(tp=4), TrialContext()).result(timeout=10)
        assert result.failure.cls is FailureClass.INFRA
    finally:
        for ex in (mi300x, h100, anything):
            ex.close()


def test_parallel_trials_bounded_by_gpus_and_routed_by_hardware(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=1.5), hardware="mi300x")
    try:
        futures = [ex.submit(make_spec(i, hardware="mi300x"), TrialContext()) for i in range(6)]
        wait_for(lambda: len(read_records(tmp_path, "start")) >= 3, 60, "three trials running")
        assert ex.free_slots(1) == 0
        results = [f.result(timeout=120) for f in futures]
    finally:
        ex.close()
    assert [r.status for r in results] == [TrialStatus.SUCCEEDED] * 6
    assert {r.hardware for r in results} == {"mi300x"}
    assert all(r.simulated for r in results)
    starts, dones = read_records(tmp_path, "start"), read_records(tmp_path, "done")
    assert len(starts) == len(dones) == 6  # nothing ran twice
    assert max_overlap(starts, dones) <= 3  # the cluster has three MI300X GPUs
    oam, hf = ray_cluster.node_id("mi300x-oam"), ray_cluster.node_id("mi300x-hf")
    nodes = {r.worker.split("/")[1] for r in results}
    assert nodes <= {oam[:12], hf[:12]} and ray_cluster.node_id("h100")[:12] not in nodes
    # Ray set the visibility variables itself; the spec carried no physical ids into the task.
    assert all(s["gpu_ids"] is None and s["visible"]["CUDA_VISIBLE_DEVICES"] for s in starts)


def test_auto_executor_routes_each_trial_by_its_hardware(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=0.2), hardware="auto")
    try:
        h = ex.submit(make_spec(0, hardware="h100"), TrialContext()).result(timeout=60)
        m = ex.submit(make_spec(1, hardware="MI300X"), TrialContext()).result(timeout=60)
    finally:
        ex.close()
    assert h.hardware == "h100" and h.worker.endswith(ray_cluster.node_id("h100")[:12])
    assert m.hardware == "mi300x"


def test_tp2_trial_gets_two_gpus_on_one_node(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=0.2), hardware="mi300x")
    try:
        result = ex.submit(make_spec(0, tp=2, hardware="mi300x"), TrialContext()).result(timeout=60)
    finally:
        ex.close()
    assert result.status is TrialStatus.SUCCEEDED
    assert result.worker.endswith(ray_cluster.node_id("mi300x-oam")[:12])
    (start,) = read_records(tmp_path, "start")
    assert len(start["visible"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2


def test_worker_killed_mid_trial_is_retried_elsewhere_and_its_processes_killed(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=2.0), hardware="mi300x")
    try:
        future = ex.submit(make_spec(7, hardware="mi300x"), TrialContext())
        (first,) = wait_for(lambda: read_records(tmp_path, "start"), 60, "the first attempt to start")
        assert not group_gone(first["pgid"])  # its "vLLM" process group is running
        os.kill(first["pid"], signal.SIGKILL)  # the Ray worker dies mid-trial
        result = future.result(timeout=120)
        assert result.status is TrialStatus.SUCCEEDED
        wait_for(lambda: group_gone(first["pgid"]), 30, "the lost attempt's process group to be killed")
        starts, dones = read_records(tmp_path, "start"), read_records(tmp_path, "done")
        assert len(starts) == 2 and len(dones) == 1  # one retry, one result
        outcomes = [(h.attempt, h.outcome) for h in ex.history]
        assert outcomes == [(0, "lost"), (1, "result")]
        lost, retry = ex.history
        assert lost.pgids == (first["pgid"],)
        assert retry.where != lost.where  # retried on the other MI300X node
        # The lost attempt is on the result, so the stored trial shows an infrastructure failure was retried.
        (retried,) = result.retried_failures
        assert retried.cls is FailureClass.INFRA and lost.where[:12] in retried.reason
        # Ray's resource view catches up with the finished task within a heartbeat or two.
        wait_for(lambda: ex.free_slots(1) == 3, 30, "all three MI300X GPUs to be free again")
    finally:
        ex.close()


def test_lost_twice_is_an_infrastructure_failure(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=30), hardware="mi300x")
    try:
        future = ex.submit(make_spec(8, hardware="mi300x"), TrialContext())
        killed: set[int] = set()
        for n in (1, 2):
            starts = wait_for(
                lambda n=n: len(read_records(tmp_path, "start")) >= n and read_records(tmp_path, "start"),
                60,
                f"attempt {n} to start",
            )
            for s in starts:
                if s["pid"] not in killed:
                    killed.add(s["pid"])
                    os.kill(s["pid"], signal.SIGKILL)
        result = future.result(timeout=120)
        assert result.status is TrialStatus.FAILED and result.failure.cls is FailureClass.INFRA
        assert result.engine is Engine.SIMULATED
        assert [f.cls for f in result.retried_failures] == [FailureClass.INFRA]  # the first loss, retried
        for s in read_records(tmp_path, "start"):
            wait_for(lambda s=s: group_gone(s["pgid"]), 30, "process groups of both attempts to be killed")
        assert read_records(tmp_path, "done") == []
    finally:
        ex.close()


def test_hang_is_killed_at_its_deadline_with_its_processes(ray_cluster, tmp_path):
    ex = RayExecutor(sleep_recipe(tmp_path, hang=True), hardware="mi300x", hang_grace_s=0.5)
    try:
        t0 = time.monotonic()
        result = ex.submit(make_spec(9, hardware="mi300x", deadline_s=2.0), TrialContext()).result(timeout=120)
        took = time.monotonic() - t0
        assert result.failure.cls is FailureClass.TIMEOUT and result.status is TrialStatus.FAILED
        assert 2.0 <= took < 30
        (start,) = read_records(tmp_path, "start")
        wait_for(lambda: group_gone(start["pgid"]), 30, "the hung trial's processes to be killed")
        assert [h.outcome for h in ex.history] == ["timeout"]
    finally:
        ex.close()


def test_cancel_reaches_the_task(ray_cluster, tmp_path):
    flag = {"cancel": False}
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=60), hardware="mi300x", cancel_grace_s=20)
    try:
        future = ex.submit(make_spec(10, hardware="mi300x"), TrialContext(is_cancelled=lambda: flag["cancel"]))
        wait_for(lambda: read_records(tmp_path, "start"), 60, "the trial to start")
        flag["cancel"] = True
        result = future.result(timeout=60)
        assert result.status is TrialStatus.CANCELLED
    finally:
        ex.close()
    # the evaluator saw the flag through the registry and stopped itself: no forced kill needed
    assert [h.outcome for h in ex.history] == ["result"]


def test_evaluator_error_is_internal_failure(ray_cluster, tmp_path):
    recipe = EvaluatorRecipe(Engine.SIMULATED, {}, factory="tuner.workers.executors.testing:FailingEvaluator")
    ex = RayExecutor(recipe, hardware="mi300x")
    try:
        result = ex.submit(make_spec(11, hardware="mi300x"), TrialContext()).result(timeout=60)
    finally:
        ex.close()
    assert result.failure.cls is FailureClass.INTERNAL and "evaluator bug" in result.failure.reason
    assert [h.outcome for h in ex.history] == ["error"]


def test_auto_trials_never_mix_chips_and_are_stamped_with_theirs(ray_cluster, tmp_path):
    """An "auto" executor (one per job) pins its "auto" trials to one family, the one with the most free
    GPUs (MI300X: 3 against the H100's 1), even when they are submitted at once; the results name that
    chip although the evaluator echoes "auto", as the vLLM runner does."""
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=0.5, echo_hardware=True), hardware="auto")
    try:
        # any GPU node counts until the first "auto" trial pins a family (once earlier tests' tasks are gone)
        wait_for(lambda: ex.free_slots(1) == 4, 30, "the cluster's four GPUs to be free")
        futures = [ex.submit(make_spec(i, hardware="auto"), TrialContext()) for i in range(5)]
        results = [f.result(timeout=120) for f in futures]
        wait_for(lambda: ex.free_slots(1) == 3, 30, "the pinned family's three GPUs to be free")
    finally:
        ex.close()
    assert [r.status for r in results] == [TrialStatus.SUCCEEDED] * 5
    assert {r.hardware for r in results} == {"mi300x"}
    mi300x = {ray_cluster.node_id("mi300x-oam"), ray_cluster.node_id("mi300x-hf")}
    assert {s["node_id"] for s in read_records(tmp_path, "start")} <= mi300x


def test_cluster_families_and_report(ray_cluster):
    from tuner.workers.executors.ray_cluster import ClusterHardware, cluster_families, cluster_report

    assert {"mi300x", "h100"} <= set(cluster_families())
    assert {"mi300x", "h100"} <= set(ClusterHardware(None))
    report = cluster_report(timeout_s=60)
    nodes = {n["node_id"]: n for n in report["nodes"]}
    oam = nodes[ray_cluster.node_id("mi300x-oam")]
    assert oam["hardware"] == "mi300x" and oam["gpu_count"] == 2 and oam["accelerator_types"] == [MI300X_OAM]
    assert nodes[ray_cluster.node_id("h100")]["hardware"] == "h100"
    assert ray_cluster.node_id("mi300x-hf") in nodes and len(report["nodes"]) >= 3  # the head has no GPUs
    assert report["executor"] == "ray" and report["hardware"] is None  # two chips: no single family
    assert {"mi300x", "h100"} <= set(report["families"]) and report["gpu_count"] >= 4
    # What each node detected itself (no amd-smi here: memory unknown, still reported as such)
    assert all({"memory_mib", "driver", "vllm_version"} <= set(n) for n in report["nodes"])


def test_node_types_and_labels_are_read(ray_cluster):
    from tuner.workers.executors.ray_cluster import cluster_nodes

    by_id = {n.node_id: n for n in cluster_nodes()}
    oam = by_id[ray_cluster.node_id("mi300x-oam")]
    hf = by_id[ray_cluster.node_id("mi300x-hf")]
    assert oam.accelerator_types == (MI300X_OAM,) and oam.gpus_total == 2 and oam.family == "mi300x"
    assert hf.accelerator_types == (MI300X_HF,) and hf.family == "mi300x"


def test_the_pgid_registry_lives_on_the_head_node(ray_cluster, tmp_path):
    """Not on a GPU node that may die with the process groups it records (a soft affinity let Ray put it
    elsewhere most of the time)."""
    import ray

    executors = [RayExecutor(sleep_recipe(tmp_path, duration_s=0.1), hardware="mi300x") for _ in range(5)]
    try:
        homes = {ray.get(ex._registry.node_id.remote(), timeout=30) for ex in executors}
    finally:
        for ex in executors:
            ex.close()
    assert homes == {ray_cluster.cluster.head_node.node_id}


def test_node_lost_mid_trial_is_retried_on_another_node(ray_cluster, tmp_path):
    """Two temporary MI325X nodes: the node the trial starts on dies; the retry runs on the other one.
    (The lost node's processes cannot be reached through Ray; on a real node they die with it, here the
    test kills the orphaned stand-in itself.)"""
    cluster = ray_cluster.cluster
    mi325x = {"num_cpus": 2, "num_gpus": 1, "resources": {"accelerator_type:AMD-Instinct-MI325X-OAM": 1}}
    nodes = {n.node_id: n for n in (cluster.add_node(**mi325x, **ray_cluster.node_args) for _ in range(2))}
    ex = RayExecutor(sleep_recipe(tmp_path, duration_s=5.0), hardware="mi325x")
    orphan = None
    removed = set()
    try:
        wait_for(lambda: ex.free_slots(1) == 2, 30, "both MI325X nodes to join")
        future = ex.submit(make_spec(12, hardware="mi325x"), TrialContext())
        (start,) = wait_for(lambda: read_records(tmp_path, "start"), 60, "the trial to start")
        orphan, lost = start["pgid"], start["node_id"]
        cluster.remove_node(nodes[lost], allow_graceful=False)
        removed.add(lost)
        result = future.result(timeout=120)
        assert result.status is TrialStatus.SUCCEEDED
        (other,) = set(nodes) - {lost}
        assert result.worker.endswith(other[:12])
        assert [(h.attempt, h.outcome) for h in ex.history] == [(0, "lost"), (1, "result")]
        assert ex.history[0].where == lost
        assert len(read_records(tmp_path, "done")) == 1
    finally:
        ex.close()
        if orphan is not None and not group_gone(orphan):
            os.killpg(orphan, signal.SIGKILL)
        for node_id, node in nodes.items():
            if node_id not in removed:
                cluster.remove_node(node)


_DRIVER = """
import sys, time
import ray
from tuner.domain import TrialContext
from tuner.workers.executors import EvaluatorRecipe
from tuner.workers.executors.ray_executor import RayExecutor
from tuner.workers.executors.testing import make_spec
address, records, ledger, job = sys.argv[1:5]
ray.init(address=address, log_to_driver=False, _node_ip_address="127.0.0.1")
recipe = EvaluatorRecipe(
    "simulated", {"record_dir": records, "duration_s": 3600}, factory="tuner.workers.executors.testing:SleepEvaluator"
)
ex = RayExecutor(recipe, hardware="mi300x", ledger_dir=ledger)
ex.submit(make_spec(3, hardware="mi300x", job_id=job), TrialContext())
time.sleep(3600)
"""


def test_a_dead_drivers_trial_is_reclaimed_on_its_node(ray_cluster, tmp_path):
    """The runner (the Ray driver) and its task's worker die mid-trial (SIGKILL: nothing cleans up), the
    trial's server group lives on, and a fresh executor's reclaim finds it in the node's trial record and kills
    it. (Ray ends a dead driver's tasks gracefully when it can, and the evaluator then stops its server itself;
    the worker is frozen first so that this test is about the case it cannot.)"""
    records, ledger = tmp_path / "records", tmp_path / "ledger"
    records.mkdir()
    job = "0123456789abcdef"
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, ray_cluster.cluster.address, str(records), str(ledger), job]
    )
    try:
        (start,) = wait_for(lambda: read_records(records, "start"), 120, "the driver's trial to start")
        os.kill(start["pid"], signal.SIGSTOP)
        driver.kill()
        driver.wait(timeout=30)
        os.kill(start["pid"], signal.SIGKILL)
        wait_for(lambda: not _alive(start["pid"]), 60, "the task's worker to be gone")
        assert not group_gone(start["pgid"])  # the trial's "server" outlived its runner
        ex = RayExecutor(sleep_recipe(tmp_path), hardware="mi300x", ledger_dir=ledger)
        try:
            assert ex.reclaim("0123456789abcde").killed == ()  # another job's id, a prefix of this one
            reclaimed = ex.reclaim(job)
        finally:
            ex.close()
        assert reclaimed.killed == (start["pgid"],) and reclaimed.held == () and reclaimed.unreachable == ()
        wait_for(lambda: group_gone(start["pgid"]), 30, "the trial's process group to be killed")
        assert not any(ledger.rglob("*.lock"))  # the reclaimed record is gone too
    finally:
        if driver.poll() is None:
            driver.kill()
        for start in read_records(records, "start"):
            kill_process_group(start["pgid"], grace_s=1.0)


def _alive(pid: int) -> bool:
    """A live, non-zombie process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
