"""The GPU lease across threads and real processes: disjoint groups, released on close and on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from tuner.workers.gpu_lease import GpuLease, held_by_live_holder, left_running, trial_record
from tuner.workers.process_group import group_alive

# A child process that takes a group and reports it, then holds it until killed or told to exit.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from tuner.workers.gpu_lease import GpuLease
    lease = GpuLease(sys.argv[1])
    group = lease.acquire(int(sys.argv[2]), range(int(sys.argv[3])), timeout=float(sys.argv[4]), label="child")
    print("GOT", ",".join(map(str, group.gpus)) if group else "NONE", flush=True)
    sys.stdin.readline()
    """
)


def _spawn(lease_dir, n, total, timeout):
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lease_dir), str(n), str(total), str(timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _got(proc) -> tuple[int, ...] | None:
    line = proc.stdout.readline().split()
    assert line and line[0] == "GOT", line
    return None if line[1] == "NONE" else tuple(int(x) for x in line[1].split(","))


def test_aligned_groups_and_release(tmp_path):
    lease = GpuLease(tmp_path)
    a = lease.acquire(2, range(8), timeout=0)
    b = lease.acquire(4, range(8), timeout=0)
    assert a.gpus == (0, 1) and b.gpus == (4, 5, 6, 7)
    assert lease.free(range(8)) == (2, 3)
    assert lease.acquire(4, range(8), timeout=0) is None
    assert "pid=" in lease.holders(range(8))[0]
    a.close()
    c = lease.acquire(4, range(8), timeout=0)
    assert c.gpus == (0, 1, 2, 3)
    b.close()
    c.close()
    assert lease.free(range(8)) == tuple(range(8))


def test_non_adjacent_group_still_forms(tmp_path):
    lease = GpuLease(tmp_path)
    held = [lease.acquire(1, [g], timeout=0) for g in (1, 3)]
    group = lease.acquire(2, range(4), timeout=0)
    assert group.gpus == (0, 2)
    for g in [*held, group]:
        g.close()


def test_threads_never_share_a_gpu(tmp_path):
    lease = GpuLease(tmp_path)
    in_use: set[int] = set()
    guard = threading.Lock()
    errors: list[str] = []

    def worker():
        for _ in range(20):
            group = lease.acquire(2, range(4), timeout=10)
            with guard:
                if in_use & set(group.gpus):
                    errors.append(f"overlap {group.gpus} {in_use}")
                in_use.update(group.gpus)
            time.sleep(0.002)
            with guard:
                in_use.difference_update(group.gpus)
            group.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors


def test_processes_get_disjoint_groups_and_death_releases(tmp_path):
    procs = [_spawn(tmp_path, 2, 4, 10) for _ in range(2)]
    try:
        groups = [_got(p) for p in procs]
        assert groups[0] and groups[1] and not set(groups[0]) & set(groups[1])
        # The host is full: a third process gets nothing within its timeout ...
        third = _spawn(tmp_path, 1, 4, 0.3)
        assert _got(third) is None
        third.communicate("\n", timeout=10)
        # ... and this process neither.
        lease = GpuLease(tmp_path)
        assert lease.free(range(4)) == ()
        # SIGKILL one holder: its flocks die with it, no cleanup code runs.
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=10)
        group = lease.acquire(2, range(4), timeout=5)
        assert group is not None and set(group.gpus) == set(groups[0])
        group.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.communicate("\n", timeout=10)


def test_waiter_gets_group_when_released(tmp_path):
    lease = GpuLease(tmp_path)
    held = lease.acquire(2, range(2), timeout=0)
    waiter = _spawn(tmp_path, 2, 2, 20)
    try:
        time.sleep(0.2)  # let the child start waiting (it cannot get the group while we hold it)
        held.close()
        assert _got(waiter) == (0, 1)
    finally:
        waiter.communicate("\n", timeout=10)


# A worker that takes a GPU, starts a "server" in its own session (as vLLM runs), records its process group
# in the lease, reports both, and waits to be killed.
CRASHING_HOLDER = textwrap.dedent(
    """
    import subprocess, sys
    from tuner.workers.gpu_lease import GpuLease
    group = GpuLease(sys.argv[1]).acquire(1, range(2), timeout=5, label="crashing worker")
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    group.record_pgid(server.pid)
    print("GOT", group.gpus[0], server.pid, flush=True)
    sys.stdin.readline()
    """
)


def test_a_dead_workers_live_server_is_killed_by_the_next_taker(tmp_path, caplog):
    """The worker died after its server's group was recorded in the lease (maybe before the store knew it):
    the lease's record is enough; the next process to lock that GPU kills the group, then uses the GPU."""
    holder = subprocess.Popen(
        [sys.executable, "-c", CRASHING_HOLDER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    _, gpu, pgid = holder.stdout.readline().split()
    gpu, pgid = int(gpu), int(pgid)
    lease = GpuLease(tmp_path)
    try:
        assert held_by_live_holder([tmp_path], pgid)  # its worker is alive: nobody may kill it
        assert lease.free(range(2)) == (1 - gpu,)
        os.kill(holder.pid, signal.SIGKILL)  # the worker crashes: its flock goes, its server stays
        holder.wait(timeout=10)
        assert f"pgid={pgid}" in (tmp_path / f"gpu-{gpu}.lock").read_text()
        assert group_alive(pgid) and not held_by_live_holder([tmp_path], pgid)
        with caplog.at_level("WARNING", logger="tuner.workers.gpu_lease"):
            group = lease.acquire(2, range(2), timeout=10)
        assert group is not None and group.gpus == (0, 1)
        assert not group_alive(pgid), "the orphan server was left running"
        assert any(str(pgid) in r.getMessage() and "killing" in r.getMessage() for r in caplog.records)
        assert "pgid=" not in (tmp_path / f"gpu-{gpu}.lock").read_text()
        group.close()
    finally:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_a_reused_pid_is_not_taken_for_the_recorded_group(tmp_path):
    """A lease file naming a pgid whose leader started at another time: a new process took the pid."""
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (tmp_path / "gpu-0.lock").write_text(f"pid=1 gpu=0\npgid={bystander.pid} start=1\n")
        group = GpuLease(tmp_path).acquire(1, range(1), timeout=0)
        assert group is not None, "a reused pid kept the GPU busy"
        group.close()
        assert group_alive(bystander.pid), "an unrelated process was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_clean_release_forgets_the_recorded_group(tmp_path):
    lease = GpuLease(tmp_path)
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        group = lease.acquire(1, range(1), timeout=0)
        group.record_pgid(server.pid)
        assert lease.free(range(1)) == ()
        group.close()  # the worker stopped its trial normally; the group is no concern of the lease any more
        assert lease.free(range(1)) == (0,)
    finally:
        server.kill()
        server.wait()


def test_left_running_reads_a_jobs_unheld_and_held_groups_by_exact_job_id(tmp_path):
    """A job's groups in lease files whose holder died, and those a live holder has; other jobs', whose ids
    the job's id only begins, and reused pids are not the job's."""
    servers = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(4)]
    a, b, c, reused = (s.pid for s in servers)
    try:
        (tmp_path / "gpu-0.lock").write_text(f"pid=1 gpu=0 job=abc trial=0\npgid={a}\n")  # holder gone
        (tmp_path / "gpu-1.lock").write_text(f"pid=1 gpu=1 job=abcd trial=1\npgid={b}\n")  # another job
        (tmp_path / "gpu-2.lock").write_text(f"pid=1 gpu=2 job=abc trial=2\npgid={reused} start=1\n")
        held = GpuLease(tmp_path).acquire(1, [3], timeout=0, label="job=abc trial=3")
        held.record_pgid(c)
        try:
            found = GpuLease(tmp_path).left_running("abc")
            assert found.orphaned == (a,) and found.held == (c,)
            assert [p.name for p in found.unheld_files] == ["gpu-0.lock", "gpu-2.lock"]
            assert left_running([tmp_path], "ab") == left_running([tmp_path], "other")
            assert left_running([tmp_path], "ab").orphaned == ()
        finally:
            held.close()
        assert GpuLease(tmp_path).left_running("abc").held == ()  # a clean release forgets it
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_a_trial_record_is_a_lease_file_without_a_gpu_removed_on_close(tmp_path):
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        record = trial_record(tmp_path / "host", "ray-1-0-a0-x", "node=n1 job=j1 trial=4")
        record.record_pgid(server.pid)
        text = (tmp_path / "host" / "ray-1-0-a0-x.lock").read_text()
        assert text.startswith(f"pid={os.getpid()} node=n1 job=j1 trial=4\n") and f"pgid={server.pid}" in text
        assert left_running([tmp_path / "host"], "j1").held == (server.pid,)
        record.close()
        assert not any((tmp_path / "host").iterdir())
    finally:
        server.kill()
        server.wait()
