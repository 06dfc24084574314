"""`--executor ray` joined to a cluster of two Ray nodes (two raylets, one CPU each) on this host, as
docs/inputs.md's multi-node recipe runs it from the head node: the bytes and the certificate of one
local run. A module of its own: the cluster's processes are this module's, apart from test_ray's
in-process instance."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _helpers import corpus, manifest, pretrain

pytestmark = pytest.mark.slow  # Ray: the slow tier

cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture(scope="module")
def two_nodes():
    cluster = cluster_utils.Cluster(initialize_head=True, connect=False,
                                    head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def test_two_nodes_give_one_local_runs_bytes(tmp_path, two_nodes):
    data = corpus(tmp_path / "c.jsonl", 17, 1500, 120)
    local = pretrain([data], tmp_path / "local")
    done = subprocess.run([sys.executable, "-m", "qwen_data", "pretrain", data, "-o", str(tmp_path / "ray"),
                           "--executor", "ray", "--ray-address", two_nodes.address, "--ray-shards", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"joined the cluster at {two_nodes.address}" in done.stderr
    assert "2 shards on 2 CPUs" in done.stderr  # one a node: both raylets' CPUs
    for suffix in (".bin", ".idx"):
        with open(f"{local}{suffix}", "rb") as a, open(f"{tmp_path / 'ray'}{suffix}", "rb") as b:
            assert a.read() == b.read()
    ours, theirs = manifest(tmp_path / "ray"), manifest(local)
    assert ours["fingerprint"] == theirs["fingerprint"] and ours["certificate"]["certified"]
    assert ours["certificate"]["records_checked"] == theirs["certificate"]["records_checked"]


def test_a_run_given_no_address_starts_its_own_instance_beside_a_running_cluster(tmp_path, two_nodes):
    """Without --ray-address (nor RAY_ADDRESS), a run starts a Ray instance of its own, as it says, even where a
    cluster runs on this host (Ray's plain `init` would join it: a test beside this module's cluster once ran its
    tasks there, and lost them when the cluster ended)."""
    import os

    data = corpus(tmp_path / "c.jsonl", 17, 300, 120)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_OVERRIDE_RESOURCES": '{"CPU": 3}'}
    done = subprocess.run([sys.executable, "-m", "qwen_data", "pretrain", data, "-o", str(tmp_path / "ray"),
                           "--executor", "ray", "--ray-shards", "2"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert "started a local instance" in done.stderr and "2 shards on 3 CPUs" in done.stderr, done.stderr
