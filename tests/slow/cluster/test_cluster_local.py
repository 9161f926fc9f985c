"""``fedtune sweep --address`` on a real two-node Ray cluster started on this machine.

The test does by hand what ``ray up cluster.yaml`` does on a cloud (docs/cluster.md): a head
node (``ray start --head``, 1 CPU) and a second node (``ray start --address=...``, 1 CPU and a
custom resource ``node2``), then ``fedtune sweep --address 127.0.0.1:<port>`` as a separate
driver process, with a tiny study (2 trials of 2 rounds of an 8-unit mlp, one client actor each, 2 at
a time).
Each trial reserves 1 CPU (its client actor; the coordinator shares that bundle), so with 1 CPU
per node the two trials can only run side by side on *different* nodes. It checks:

* the CLI exits 0, ``study.json`` marks the search done;
* the trials run a plugin's client method whose module only the driver can import (on its
  ``PYTHONPATH`` alone): ``study.json`` records it, and the nodes imported Ray's shipped copy
  (``runtime_env`` ``py_modules``) — a user's method reaches a cluster with no file copied by hand;
* every (trial, round) is in the Arrow store exactly once, and ``trials.parquet`` says completed;
* a monitor driver connected to the cluster saw 2 alive nodes before the sweep and at every
  poll (every 0.5 s) while it ran, and again after it;
* the GCS actor table (dead actors included) shows one trial's ``ClientWorker`` and
  ``Coordinator`` on the head node and the other's on the ``node2`` node: actors ran on both.

Choices (the brief left room):

* Not the session fixture ``ray_session``: that is an in-process single-node Ray; a cluster of
  two raylets needs ``ray start`` processes, and every Ray client here (the sweep, the monitor)
  is a subprocess, so the test process itself never connects to this cluster.
* **Isolation from other Rays on the machine.** A dedicated short ``--temp-dir`` (the session
  directory, its sockets and ``ray_current_cluster`` live there, so a plain ``ray.init()``
  elsewhere does not find this cluster), free ports for the GCS and for every per-node agent
  port (two raylets on one host cannot share the default 52365 etc.), a small object store, and
  a fresh **auth token**: Ray 2.60 turns token authentication on when ``~/.ray/auth_token``
  exists; every process of this test gets ``RAY_AUTH_MODE=token`` and its own
  ``RAY_AUTH_TOKEN`` (it takes precedence over the file; ``~/.ray/auth_token`` is neither read
  nor written), so nodes and drivers of this cluster authenticate to each other and nothing
  else can join it (a driver with another token gets ``ConnectionError``).
* **Stopping.** Never ``ray stop``: it kills every Ray process of the machine, including other
  engineers' test clusters. Each ``ray start`` runs in a new session, so its daemons (GCS,
  raylet, agents, log monitor, autoscaler monitor) keep its process group; Ray's workers move
  to groups of their own, so the finaliser takes every process of those two groups, every
  process whose command line names the temp dir, and all their descendants (``/proc``),
  SIGKILLs them (and whatever they started meanwhile), then removes the temp dir. No SIGTERM
  first: Ray's GCS and raylets, signalled together, wait for each other and outlast any grace.
* **Starting.** Node 2's ``ray start`` begins as soon as the head's GCS port answers, while the
  head's own ``ray start`` still brings up its raylet and agents; both must return 0.
* **No hang.** Every subprocess has a timeout (generous, for a loaded 2-core machine); output
  goes to files, not pipes, because Ray's daemons inherit and keep the starter's descriptors.
* The node of an actor comes from ``ray._private.state.actors()`` (the GCS actor table, which
  keeps dead actors). The public state API (``ray.util.state``) needs the dashboard's HTTP
  server, which this cluster does not run, and the trainable records no node ids (both nodes
  also have the same IP, so Tune's ``node_ip`` cannot tell them apart).
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import subprocess
import sys

import pytest

from tests.slow.cluster.cluster_harness import LocalCluster, cluster_env, free_ports, kill_group, short_temp_dir, tail

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the cluster's processes are found through /proc (Linux)")]

JOIN_TIMEOUT_S = 120.0  # until the monitor sees both nodes alive
SWEEP_TIMEOUT_S = 420.0  # the sweep (about 35 s when idle)
MONITOR_TIMEOUT_S = 120.0  # the monitor's final report


@pytest.fixture
def local_cluster():
    """A 2-node Ray cluster (head: 1 CPU; node 2: 1 CPU + resource ``node2``), always stopped."""
    temp_dir = short_temp_dir("fedtune-cluster-")
    env = cluster_env()
    cluster = LocalCluster(temp_dir, env)
    try:
        cluster.port = free_ports(1)[0]
        head = cluster.launch_node("head", ["--head", f"--port={cluster.port}", "--num-cpus=1", "--num-gpus=0",
                                            "--include-dashboard=false"])
        cluster.wait_for_gcs(head)  # node 2 starts while the head still starts its raylet and agents
        node2 = cluster.launch_node("node2", [f"--address={cluster.address}", "--num-cpus=1", "--num-gpus=0",
                                              '--resources={"node2": 1}'])
        cluster.wait_node(head)
        cluster.wait_node(node2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


# A driver connected to the cluster for the whole sweep: waits for both nodes, prints
# {"ready": n}, polls ray.nodes() every 0.5 s until its stdin closes, then prints the nodes,
# the fewest alive nodes seen and the GCS actor table (dead actors included).
MONITOR = r"""
import json, select, sys, time
import ray
from ray._private import state

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
alive = lambda: [n for n in ray.nodes() if n["Alive"]]
deadline = time.time() + float(sys.argv[2])
while len(alive()) < 2 and time.time() < deadline:
    time.sleep(0.25)
print(json.dumps({"ready": len(alive())}), flush=True)
counts = []
stop_at = time.time() + float(sys.argv[3])
while time.time() < stop_at:
    counts.append(len(alive()))
    readable, _, _ = select.select([sys.stdin], [], [], 0.5)
    if readable and not sys.stdin.readline():
        break
nodes = [{"node_id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]
actors = [{"class": a["ActorClassName"], "node_id": a["Address"]["NodeID"], "state": a["State"]}
          for a in state.actors().values()]
print(json.dumps({"polls": len(counts), "min_alive": min(counts), "nodes": nodes, "actors": actors}), flush=True)
"""


CLUSTER_PLUGIN = '''
import os
import fedtune

MARKER = {marker!r}  # written into the file: the nodes' processes do not have the driver's environment
with open(MARKER, "a") as f:
    f.write(f"{{os.getpid()}} {{__file__}}\\n")


class ClusterSgd(fedtune.SGD):
    spec = fedtune.ClientMethodSpec("cluster-sgd", description="local SGD, a plugin not installed on the nodes")


fedtune.register(ClusterSgd)
'''


def test_sweep_runs_on_a_two_node_local_cluster(local_cluster, tmp_path):
    from fedtune.results.store import load

    cluster = local_cluster
    monitor_err = tmp_path / "monitor.err"
    sweep_log = tmp_path / "sweep.log"
    monitor = sweep = None
    try:
        with open(monitor_err, "w") as err:
            monitor = subprocess.Popen(
                [sys.executable, "-c", MONITOR, cluster.address, str(JOIN_TIMEOUT_S), str(SWEEP_TIMEOUT_S + 60)],
                env=cluster.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True)
        readable, _, _ = select.select([monitor.stdout], [], [], JOIN_TIMEOUT_S + 60)
        line = monitor.stdout.readline() if readable else ""
        assert line, f"the monitor driver did not connect:\n{tail(monitor_err)}"
        assert json.loads(line) == {"ready": 2}, (line, tail(cluster.temp_dir / "ray-start-node2.log"))

        # The trials run a plugin's client method (local SGD under another name) whose module only the
        # driver can import (its folder is on the driver's PYTHONPATH alone): the nodes get Ray's shipped copy.
        plugin_src = tmp_path / "plugin_src"
        plugin_src.mkdir()
        (plugin_src / "cluster_sgd.py").write_text(CLUSTER_PLUGIN.format(marker=str(tmp_path / "imported_from.txt")))
        env = {**cluster.env,
               "PYTHONPATH": os.pathsep.join(p for p in (str(plugin_src), cluster.env.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--address", cluster.address,
               "--plugin", "cluster_sgd", "--algorithm", "cluster-sgd", "--dataset", "rotated-digits", "--rounds", "2", "--num-samples", "2",
               "--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]",
               "--set", "max_client_actors=1", "--max-concurrent", "2",
               "--output", str(tmp_path), "--name", "cluster", "--no-report"]
        with open(sweep_log, "w") as out:
            sweep = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = sweep.wait(timeout=SWEEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"fedtune sweep did not finish in {SWEEP_TIMEOUT_S:.0f} s:\n{tail(sweep_log)}")

        try:  # closing its stdin asks the monitor for its last report
            out, _ = monitor.communicate(timeout=MONITOR_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the monitor driver did not report:\n{tail(monitor_err)}")
    finally:
        kill_group(sweep)
        kill_group(monitor)

    # The CLI succeeded and wrote the study.
    assert rc == 0, tail(sweep_log)
    study_dir = tmp_path / "cluster"
    study = json.loads((study_dir / "study.json").read_text())
    assert study["searches"]["cluster-sgd"]["status"] == "done"
    assert [p["module"] for p in study["plugins"]] == ["cluster_sgd"]
    imported = {line.split(" ", 1)[1] for line in (tmp_path / "imported_from.txt").read_text().splitlines()}
    assert str(tmp_path / "plugin_src" / "cluster_sgd.py") in imported  # the driver
    assert any("runtime_resources" in path for path in imported), imported  # the nodes: Ray's shipped copy
    assert study["options"]["address"] == cluster.address

    # Every (trial, round) exactly once; both trials completed their 2 rounds.
    trials = load(study_dir, "trials").to_pylist()
    trial_ids = sorted(t["trial_id"] for t in trials)
    assert len(trial_ids) == 2 == len(set(trial_ids))
    assert [t["status"] for t in trials] == ["completed", "completed"]
    assert [t["rounds_done"] for t in trials] == [2, 2]
    rows = load(study_dir).to_pylist()
    seen = collections.Counter((r["trial_id"], r["round"]) for r in rows)
    assert seen == {(t, r): 1 for t in trial_ids for r in (1, 2)}
    assert all(r["status"] == "ok" for r in rows)

    # The cluster had both nodes alive before, during (every poll) and after the sweep.
    report = json.loads(out.strip().splitlines()[-1])
    assert report["polls"] >= 1 and report["min_alive"] == 2, report
    alive = [n for n in report["nodes"] if n["alive"]]
    assert len(alive) == 2 and all(n["resources"].get("CPU") == 1.0 for n in alive), alive
    (node2,) = [n["node_id"] for n in alive if n["resources"].get("node2") == 1.0]
    (head,) = [n["node_id"] for n in alive if n["node_id"] != node2]

    # Actors ran on both nodes: one trial's client actor and coordinator on each (1 CPU per node,
    # each trial needs 1 CPU, so the two concurrent trials cannot share a node).
    by_class = collections.defaultdict(collections.Counter)
    for a in report["actors"]:
        by_class[a["class"]][a["node_id"]] += 1
    assert by_class["ClientWorker"] == {head: 1, node2: 1}, report["actors"]
    assert by_class["Coordinator"] == {head: 1, node2: 1}, report["actors"]
