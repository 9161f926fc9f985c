"""fedtune on a real Ray autoscaler: Ray's fake multi-node provider, started from
``examples/cluster-local.yaml`` (docs/cluster.md, "Try autoscaling on one machine").

``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=<copy of the example>`` starts a head
with 2 CPUs and no GPU and an autoscaler whose ``gpu_worker`` node type (2 CPUs, 1 fake GPU,
``min_workers: 0``) it launches as local processes when work asks for a GPU. Three tests:

1. **Scale up from zero.** ``fedtune sweep --address ... --set client_gpus=0.5``: the study
   starts with no GPU anywhere, is not refused (the GPU fits the autoscaler's node types), the
   autoscaler adds a GPU worker node and the trials' client actors run there (one trial at a
   time; a study no node type can hold is refused at once).
2. **Ray Jobs.** The same sweep (of one trial) through ``ray job submit`` (no ``--address``: the job's driver
   finds the cluster through ``RAY_ADDRESS``, which Ray Jobs sets); the job succeeds and the
   study is on the driver's disk.
3. **Preemption.** Mid-trial, every process of the GPU worker node running the trial is killed
   (SIGKILL: the machine vanishes, as a spot preemption does; the cluster runs Ray's fake
   provider with the one change ``preemptible_provider.py`` explains: a killed node stops being
   listed, as a cloud stops listing a preempted instance). With ``--max-failures 2
   --storage-path <shared dir> --set checkpoint_every=1`` the trial restarts on a new node from
   its last checkpoint, the study completes with no failed trial, and every (trial, round) is in
   the Arrow store once.

Tests 1 and 2 share one cluster (started once for the module; test 1 gets it while nothing has run
on it, else a cluster of its own), whose copy of the example keeps an idle worker node for 10
minutes instead of 12 s: test 2's trial then runs on the GPU node test 1 added, never on one the
autoscaler is removing. Test 3 needs its own cluster (the preemptible provider); it is defined
first, so the shared cluster does not idle beside it.

A monitor driver connected to the cluster polls every 0.25 s and writes timestamped events
(first pending placement group, GPU node up, node dead, client actor alive on a node), from
which the tests print "trial pending -> worker node up" and "node killed -> trial running
again". The cluster's processes are stopped as ``tests/slow/cluster/cluster_harness.py`` says (never
``ray stop``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from tests.slow.cluster.cluster_harness import (
    LocalCluster,
    cluster_env,
    free_ports,
    kill_group,
    kill_processes,
    processes_with_env,
    short_temp_dir,
    tail,
)

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the cluster's processes are found through /proc (Linux)")]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cluster-local.yaml"
SWEEP_TIMEOUT_S = float(os.environ.get("FEDTUNE_TEST_SWEEP_TIMEOUT_S", 420.0))
# What these tests check is placement, scaling and recovery, not learning: a tiny model keeps every
# round (training, evaluation, checkpoint) a fraction of a second on a busy 2-core machine.
TINY_MODEL = ["--set", "model=mlp", "--set", "mlp_hidden=[8]"]

# A driver that watches the cluster until its stdin closes; one JSON event per line on stdout.
MONITOR = r"""
import json, select, sys, time
import ray
from ray._private import state

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
def emit(event, **kw):
    print(json.dumps({"t": time.time(), "event": event, **kw}), flush=True)
emit("ready")
alive_before, pending_seen, client_nodes = {}, False, set()
while True:
    nodes = {n["NodeID"]: n for n in ray.nodes()}
    for nid, n in nodes.items():
        was = alive_before.get(nid)
        if n["Alive"] and not was:
            emit("node_up", node=nid, gpus=n["Resources"].get("GPU", 0.0))
        if was and not n["Alive"]:
            emit("node_dead", node=nid)
        alive_before[nid] = n["Alive"]
    if not pending_seen and any(pg["state"] == "PENDING" for pg in ray.util.placement_group_table().values()):
        pending_seen = True
        emit("pg_pending")
    for a in state.actors().values():
        node = a["Address"]["NodeID"]
        if a["ActorClassName"] == "ClientWorker" and a["State"] == "ALIVE" and node not in client_nodes:
            client_nodes.add(node)
            emit("client_alive", node=node)
    readable, _, _ = select.select([sys.stdin], [], [], 0.25)
    if readable and not sys.stdin.readline():
        break
actors = [{"class": a["ActorClassName"], "node_id": a["Address"]["NodeID"], "state": a["State"]}
          for a in state.actors().values()]
nodes = [{"node_id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]
emit("final", actors=actors, nodes=nodes)
"""


@dataclass
class FakeCluster:
    cluster: LocalCluster
    dashboard_port: int
    tmp: Path
    users: list[str] = field(default_factory=list)  # the tests that ran on it (shared with its copies)

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def env(self) -> dict[str, str]:
        return self.cluster.env

    def for_test(self, request: pytest.FixtureRequest, tmp_path: Path) -> FakeCluster:
        """This cluster with ``tmp_path`` as the test's folder, recorded as used by the test."""
        self.users.append(request.node.name)
        return dataclasses.replace(self, tmp=tmp_path)


def start_fake_cluster(tmp_path: Path, preemptible: bool = False, keep_idle_nodes: bool = False):
    """The example's fake autoscaling cluster on private ports and a private temp dir; stopped after.
    ``preemptible``: with :mod:`preemptible_provider` (a killed node vanishes, as on a cloud), and
    without the dashboard (only Ray Jobs needs it; its process and its nine module processes take
    CPU from a 2-core machine).
    ``keep_idle_nodes``: a cluster shared by several tests keeps an idle worker node
    (``idle_timeout_minutes`` 10 instead of the example's 0.2) so that the autoscaler never removes
    the node that the next test's first trial is being placed on."""
    temp_dir = short_temp_dir("fedtune-fake-")
    # RAY_prestart_worker_first_driver=0: the first driver to connect (the monitor) would make the
    # head start one idle worker process per CPU, which nothing here uses (the trials run on the GPU
    # worker nodes): CPU taken from the processes the tests wait for.
    env = {**cluster_env(), "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_prestart_worker_first_driver": "0"}
    if preemptible:
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        # The GCS declares a node dead after this many failed health checks this far apart (Ray's
        # defaults: 5 every 3 s). A killed raylet fails each check at once (connection refused);
        # a live but busy one still has the default 10 s per check to answer.
        env.update(RAY_health_check_period_ms="500", RAY_health_check_failure_threshold="3")
    cluster = LocalCluster(temp_dir, env)
    try:
        cluster.port, dashboard_port = free_ports(2)
        config = yaml.safe_load(EXAMPLE.read_text())
        config["provider"]["gcs_address"] = cluster.address  # worker nodes join this head, not :6379
        if preemptible:
            config["provider"].update(type="external", module="preemptible_provider.PreemptibleFakeProvider")
        if keep_idle_nodes:
            config["idle_timeout_minutes"] = 10
        config_path = temp_dir / "cluster-local.yaml"
        config_path.write_text(yaml.safe_dump(config))
        dashboard = (["--include-dashboard=false"] if preemptible else
                     ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"])
        cluster.start_node("head", ["--head", f"--port={cluster.port}", "--num-cpus=2", "--num-gpus=0",
                                    f"--autoscaling-config={config_path}", *dashboard])
        yield FakeCluster(cluster, dashboard_port, tmp_path)
    finally:
        cluster.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_fake_cluster(tmp_path_factory):
    """One fake cluster for the tests of this module that can share it (their own output folders;
    see :func:`fake_cluster` and :func:`fresh_fake_cluster`): a cluster's start and stop once."""
    yield from start_fake_cluster(tmp_path_factory.mktemp("fake-cluster"), keep_idle_nodes=True)


@pytest.fixture
def fake_cluster(shared_fake_cluster, request, tmp_path):
    """The shared fake cluster, whatever ran on it before (a GPU worker node may be up already)."""
    return shared_fake_cluster.for_test(request, tmp_path)


@pytest.fixture
def fresh_fake_cluster(request, tmp_path):
    """A fake cluster nothing has run on yet: only its head, no GPU worker node, an actor table
    holding no other test's actors. The shared one while no test has used it (the usual order:
    this test first), else a cluster of its own."""
    shared = request.getfixturevalue("shared_fake_cluster")
    if not shared.users:
        yield shared.for_test(request, tmp_path)
    else:
        yield from start_fake_cluster(tmp_path)


@pytest.fixture
def preemptible_cluster(tmp_path):
    yield from start_fake_cluster(tmp_path, preemptible=True)


class Monitor:
    """The MONITOR driver as a subprocess; :meth:`events` after :meth:`stop`."""

    def __init__(self, fc: FakeCluster):
        self.out_path, self.err_path = fc.tmp / "monitor.jsonl", fc.tmp / "monitor.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", MONITOR, fc.address], env=fc.env,
                                         stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        deadline = time.time() + 120
        while not self.events() and time.time() < deadline:
            assert self.proc.poll() is None, tail(self.err_path)
            time.sleep(0.2)
        assert self.events(), f"the monitor did not connect:\n{tail(self.err_path)}"

    def events(self, name: str | None = None) -> list[dict]:
        lines = self.out_path.read_text().splitlines() if self.out_path.exists() else []
        evs = [json.loads(ln) for ln in lines if ln.startswith("{")]
        return [e for e in evs if name is None or e["event"] == name]

    def stop(self) -> dict:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            pytest.fail(f"the monitor did not stop:\n{tail(self.err_path)}")
        final = self.events("final")
        assert final, tail(self.err_path)
        return final[-1]


def sweep_args(out: Path, name: str, *extra: str, samples: int = 2, concurrent: int = 2) -> list[str]:
    return ["sweep", "--algorithm", "fedavg", "--dataset", "rotated-digits", "--num-samples", str(samples),
            "--set", "local_steps=1", *TINY_MODEL, "--set", "max_client_actors=1", "--set", "client_gpus=0.5",
            "--max-concurrent", str(concurrent), "--output", str(out), "--name", name, "--no-report", *extra]


def run_driver(cmd: list[str], fc: FakeCluster, log: Path, timeout: float = SWEEP_TIMEOUT_S) -> int:
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=fc.tmp, env=fc.env, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            pytest.fail(f"{' '.join(cmd[:4])} did not finish in {timeout:.0f} s:\n{tail(log)}")
        finally:
            kill_group(proc)


def check_store(study_dir: Path, rounds: int, trials: int) -> tuple[list[dict], list[dict]]:
    """Every trial completed; every (trial, round) once. Returns (trial rows, round rows)."""
    from fedtune.results.store import load

    trial_rows = load(study_dir, "trials").to_pylist()
    ids = sorted(t["trial_id"] for t in trial_rows)
    assert len(ids) == trials == len(set(ids)), trial_rows
    assert all(t["status"] == "completed" for t in trial_rows), [(t["status"], t["error"]) for t in trial_rows]
    rows = load(study_dir).to_pylist()
    seen = collections.Counter((r["trial_id"], r["round"]) for r in rows)
    assert seen == {(t, r): 1 for t in ids for r in range(1, rounds + 1)}
    return trial_rows, rows


def ray_status(fc: FakeCluster) -> str:
    """``ray status`` of the cluster (nodes, pending demands: what a failure message needs)."""
    try:
        done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", "--address", fc.address],
                              env=fc.env, capture_output=True, text=True, timeout=60)
        return done.stdout[-3000:] + done.stderr[-1000:]
    except subprocess.TimeoutExpired:
        return "(ray status timed out)"


def gpu_nodes(final: dict) -> set[str]:
    return {n["node_id"] for n in final["nodes"] if n["resources"].get("GPU", 0) > 0}


def clients_on(final: dict) -> collections.Counter:
    return collections.Counter(a["node_id"] for a in final["actors"] if a["class"] == "ClientWorker")


# ------------------------------------------------------------------------------------------------
def test_preempted_trial_restarts_on_a_new_node_from_its_checkpoint(preemptible_cluster):
    from fedtune.results.store import load

    fc = preemptible_cluster
    # The kill comes once 2 rounds are stored; it must land before the last one. A round of the tiny
    # model takes about 0.1 s (under load, more, and so does everything here): 28 rounds of margin.
    rounds = 30
    shared = fc.tmp / "shared"
    monitor = Monitor(fc)
    log = fc.tmp / "sweep.log"
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--dataset", "rotated-digits",
           "--num-samples", "1", "--rounds", str(rounds), "--set", "local_steps=3", *TINY_MODEL,
           "--set", "max_client_actors=1", "--set", "client_gpus=0.5", "--set", "checkpoint_every=1",
           "--max-failures", "2", "--storage-path", str(shared), "--address", fc.address, "--output", str(fc.tmp),
           "--name", "spot", "--no-report"]
    killed_at = stored_at_kill = None
    with open(log, "w") as f:
        sweep = subprocess.Popen(cmd, cwd=fc.tmp, env=fc.env, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + SWEEP_TIMEOUT_S
            rounds_dir = fc.tmp / "spot" / "rounds"
            while killed_at is None and time.time() < deadline and sweep.poll() is None:
                files = list(rounds_dir.glob("*.parquet")) if rounds_dir.is_dir() else []
                done = len(load(files[0]).to_pylist()) if files else 0
                if done >= 2:  # mid-trial, with checkpoints written: the GPU node vanishes
                    # (the monitor polls every 0.25 s: a round of the tiny model may be stored first)
                    seen_by = time.time() + 30
                    while not monitor.events("client_alive") and time.time() < seen_by:
                        time.sleep(0.02)
                    (node,) = [e["node"] for e in monitor.events("client_alive")]
                    # This cluster's node only: every fake cluster on the machine (another test's,
                    # another pytest-xdist worker's, someone else's) numbers its nodes alike.
                    procs = processes_with_env("RAY_OVERRIDE_NODE_ID_FOR_TESTING", node) & fc.cluster.processes()
                    assert procs, f"no process of node {node}"
                    kill_processes(procs)
                    killed_at, stored_at_kill, killed_node = time.time(), done, node
                time.sleep(0.1)
            assert killed_at is not None, f"the trial never reached round 2:\n{tail(log)}"
            rc = sweep.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"fedtune sweep did not finish:\n{tail(log)}\n{ray_status(fc)}")
        finally:
            kill_group(sweep)
            final = monitor.stop()
    assert rc == 0, tail(log)
    assert stored_at_kill < rounds, "the trial ended before its node was killed"

    # The study completed with no failed trial; every (trial, round) once.
    (trial,), rows = check_store(fc.tmp / "spot", rounds=rounds, trials=1)
    assert trial["restarts"] == 1
    # It continued from a checkpoint: rounds before it kept attempt 0, the rest ran after the restart.
    attempts = {r["round"]: r["attempt"] for r in rows}
    first_run = sorted(r for r, a in attempts.items() if a == 0)
    after = sorted(r for r, a in attempts.items() if a == 1)
    assert first_run and after and first_run == list(range(1, len(first_run) + 1)), attempts
    assert max(first_run) < min(after) and set(first_run) | set(after) == set(range(1, rounds + 1)), attempts
    assert len(first_run) >= stored_at_kill - 1, (attempts, stored_at_kill)  # at most the round in flight re-ran
    # Checkpoints went to the shared storage path.
    assert list(shared.glob("spot/fedavg/*/checkpoint_*")), sorted(p.name for p in shared.rglob("*"))[:20]

    # The trial ran again on another (new) GPU node.
    dead = [e for e in monitor.events("node_dead") if e["node"] == killed_node]
    assert dead, monitor.events()
    clients = monitor.events("client_alive")
    assert [e["node"] for e in clients][0] == killed_node and len(clients) == 2, clients
    new_node = clients[1]["node"]
    assert new_node != killed_node and new_node in gpu_nodes(final), final["nodes"]
    print(f"\nnode killed -> trial running again on a new node: {clients[1]['t'] - killed_at:.1f} s "
          f"(killed with {stored_at_kill} of {rounds} rounds stored; rounds {after} ran after the restart)")


def test_sweep_scales_up_a_gpu_worker_from_zero(fresh_fake_cluster):
    fc = fresh_fake_cluster
    monitor = Monitor(fc)
    assert [e["gpus"] for e in monitor.events("node_up")] == [0.0]  # the head only: no GPU node yet
    log = fc.tmp / "sweep.log"
    try:
        # A trial no node type can hold (2 GPUs; gpu_worker has 1) is refused at once, not waited for.
        t0 = time.time()
        refused = run_driver([sys.executable, "-m", "fedtune.cli", *sweep_args(fc.tmp, "never", "--rounds", "1"),
                              "--set", "client_gpus=2", "--address", fc.address], fc, fc.tmp / "never.log", 120)
        assert refused == 2, tail(fc.tmp / "never.log")
        text = " ".join(tail(fc.tmp / "never.log").split())
        assert "client_gpus=2" in text and "no node has room" in text, text
        assert "up to 2 more from the autoscaler's node types" in text, text
        assert [e["gpus"] for e in monitor.events("node_up")] == [0.0], "a node was added for a refused study"
        print(f"\nrefused in {time.time() - t0:.1f} s")
        # One trial at a time: the second reuses the first one's actors (Tune's reuse_actors) instead
        # of starting three more worker processes on the new node beside them (about 10 s of a busy
        # 2-core machine); what is checked (a GPU node added from zero, every client actor on it)
        # is the same for each trial.
        rc = run_driver([sys.executable, "-m", "fedtune.cli",
                         *sweep_args(fc.tmp, "auto", "--rounds", "2", concurrent=1), "--address", fc.address],
                        fc, log)
    finally:
        final = monitor.stop()
    assert rc == 0, tail(log)
    check_store(fc.tmp / "auto", rounds=2, trials=2)

    gpu_up = [e for e in monitor.events("node_up") if e["gpus"] > 0]
    assert gpu_up, "the autoscaler added no GPU worker node"
    pending = monitor.events("pg_pending")
    assert pending and pending[0]["t"] <= gpu_up[0]["t"], (pending, gpu_up)
    # Every client actor ran on a GPU worker node the autoscaler added, none on the head.
    assert set(clients_on(final)) and set(clients_on(final)) <= gpu_nodes(final), final["actors"]
    print(f"\ntrial pending -> GPU worker node up: {gpu_up[0]['t'] - pending[0]['t']:.1f} s")


def test_sweep_submitted_as_a_ray_job(fake_cluster):
    fc = fake_cluster
    log = fc.tmp / "job.log"
    # One trial: what this test checks is the Ray Jobs path (the driver finds the cluster through
    # RAY_ADDRESS, the job succeeds, the study is on disk); several trials are the tests above's.
    entry = [sys.executable, "-m", "fedtune.cli", *sweep_args(fc.tmp, "job", "--rounds", "2", samples=1)]
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address",
           f"http://127.0.0.1:{fc.dashboard_port}", "--submission-id", "fedtune-job", "--", *entry]
    rc = run_driver(cmd, fc, log)
    assert rc == 0, tail(log)
    # Once the job has exited, `ray job submit` asks the Jobs API for its status and prints it with
    # the function `ray job status` uses (ray.dashboard.modules.job.cli._log_job_status): the same
    # query and line, without starting the `ray` CLI a second time.
    out = tail(log, 100000)
    assert "Job 'fedtune-job' succeeded" in out, out[-4000:]
    assert "connecting to an existing cluster, num_cpus" not in out
    study = json.loads((fc.tmp / "job" / "study.json").read_text())
    assert study["searches"]["fedavg"]["status"] == "done"
    assert study["options"]["address"] is None  # found through RAY_ADDRESS, set by Ray Jobs
    check_store(fc.tmp / "job", rounds=2, trials=1)
