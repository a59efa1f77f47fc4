"""Fixtures for the executor tests: trial specs, and one local Ray cluster (several raylets on this CPU,
with declared GPUs and accelerator types) shared by every Ray test of the package."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

MI300X_OAM = "AMD-Instinct-MI300X-OAM"
MI300X_HF = "AMD-Instinct-MI300X-HF"


class RayCluster:
    """Handles on the nodes of the test cluster, by role."""

    def __init__(self, cluster, nodes: dict[str, object], node_args: dict[str, object]):
        self.cluster = cluster
        self.nodes = nodes
        self.node_args = node_args  # what every node of the cluster is started with

    def node_id(self, role: str) -> str:
        return self.nodes[role].node_id  # type: ignore[attr-defined]


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayCluster]:
    """A head (no GPUs), two MI300X nodes (an OAM with 2 GPUs, an HF with 1) and an H100 node (1 GPU)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    env = {
        "RAY_AUTH_MODE": "disabled",  # Ray 2.60 enables token auth by default and writes under ~/.ray
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray resolves 127.0.0.1 to the machine's address unless told this is a single-machine cluster:
        # keep every node, and the driver, on loopback.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    saved = {k: os.environ.get(k) for k in (*env, "RAY_TMPDIR")}
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: raylet socket paths must fit 107 bytes
    os.environ.update(env, RAY_TMPDIR=tmp)
    from ray._private import ray_constants

    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; the env var above covers the raylets
    os.makedirs(os.path.join(tmp, "ray"))
    common = {
        "temp_dir": os.path.join(tmp, "ray"),
        "include_dashboard": False,
        "node_ip_address": "127.0.0.1",
        "object_store_memory": 80 * 1024 * 1024,
    }
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 0, **common})
    try:
        nodes = {
            "mi300x-oam": cluster.add_node(
                num_cpus=4,
                num_gpus=2,
                resources={f"accelerator_type:{MI300X_OAM}": 1},
                labels={"ray.io/accelerator-type": MI300X_OAM},
                **common,
            ),
            "mi300x-hf": cluster.add_node(
                num_cpus=2,
                num_gpus=1,
                resources={f"accelerator_type:{MI300X_HF}": 1},
                **common,
            ),
            "h100": cluster.add_node(
                num_cpus=2,
                num_gpus=1,
                resources={"accelerator_type:H100": 1},
                labels={"ray.io/accelerator-type": "H100"},
                **common,
            ),
        }
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address="127.0.0.1")
        yield RayCluster(cluster, nodes, common)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
