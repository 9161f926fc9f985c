"""``fedtune sweep --address`` on a real two-node Ray cluster started on this machine.

The test does by hand what ``ray up cluster.yaml`` does on a cloud (docs/cluster.md): a head
node (``ray start --head``, 1 CPU) and a second node (``ray start --address=...``, 1 CPU and a
custom resource ``node2``), then ``fedtune sweep --address 127.0.0.1:<port>`` as a separate
driver process, with a tiny study (2 trials of 2 rounds, one client actor each, 2 at a time).
Each trial reserves 1 CPU (its client actor; the coordinator shares that bundle), so with 1 CPU
per node the two trials can only run side by side on *different* nodes. It checks:

* the CLI exits 0, ``study.json`` marks the search done;
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
  sends SIGTERM, waits up to 5 s and SIGKILLs what is left, then removes the temp dir.
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the cluster's processes are found through /proc (Linux)")]

START_TIMEOUT_S = 180.0  # one `ray start` (a few seconds when idle)
JOIN_TIMEOUT_S = 120.0  # until the monitor sees both nodes alive
SWEEP_TIMEOUT_S = 420.0  # the sweep (about 35 s when idle)
MONITOR_TIMEOUT_S = 120.0  # the monitor's final report
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this Python


# ------------------------------------------------------------------------------------------------
# Processes, from /proc (no psutil here).
def _proc_table() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgid, start time in ticks, command line) of every visible process."""
    table: dict[int, tuple[int, int, str, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ... starttime
        table[int(name)] = (int(rest[1]), int(rest[2]), rest[19], cmd)
    return table


def _cluster_processes(pgids: set[int], marker: str) -> set[tuple[int, str]]:
    """(pid, start time) of every process in the groups ``pgids`` or naming ``marker`` on its
    command line, and of all their descendants; never this process or its ancestors."""
    table = _proc_table()
    keep_out = {os.getpid()}
    pid = os.getpid()
    while pid in table and pid > 1:
        pid = table[pid][0]
        keep_out.add(pid)
    children: dict[int, list[int]] = collections.defaultdict(list)
    for p, (ppid, _, _, _) in table.items():
        children[ppid].append(p)
    todo = [p for p, (_, pgid, _, cmd) in table.items() if pgid in pgids or marker in cmd]
    found: set[int] = set()
    while todo:
        p = todo.pop()
        if p in found or p in keep_out:
            continue
        found.add(p)
        todo.extend(children.get(p, ()))
    return {(p, table[p][2]) for p in found}


def _alive(procs: set[tuple[int, str]]) -> set[tuple[int, str]]:
    table = _proc_table()
    return {(p, t) for p, t in procs if p in table and table[p][2] == t}


def _signal_all(procs: set[tuple[int, str]], sig: int) -> None:
    for pid, _ in _alive(procs):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_cluster(pgids: set[int], marker: str, grace_s: float = 5.0) -> None:
    """Stop exactly this test's Ray processes (see the module docstring): SIGTERM, then SIGKILL."""
    procs = _cluster_processes(pgids, marker)
    _signal_all(procs, signal.SIGTERM)
    deadline = time.time() + grace_s
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    procs = _alive(procs) | _cluster_processes(pgids, marker)  # and anything started meanwhile
    _signal_all(procs, signal.SIGKILL)
    deadline = time.time() + 10.0
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.1)


def _kill_group(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports (held open together while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return f"(no {path})"


# ------------------------------------------------------------------------------------------------
@dataclass
class LocalCluster:
    """A head and a second node started with ``ray start`` under ``temp_dir``."""

    temp_dir: Path
    env: dict[str, str]
    port: int = 0
    pgids: set[int] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_node(self, name: str, args: list[str]) -> None:
        listen, grpc, runtime_env, metrics = free_ports(4)
        log = self.temp_dir / f"ray-start-{name}.log"
        cmd = [*RAY, "start", *args, "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
               "--disable-usage-stats", "--object-store-memory=100000000", "--log-style=record",
               f"--dashboard-agent-listen-port={listen}", f"--dashboard-agent-grpc-port={grpc}",
               f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}"]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.pgids.add(proc.pid)  # its daemons stay in this process group
            try:
                rc = proc.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                pytest.fail(f"`ray start` ({name}) did not return in {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        assert rc == 0, f"`ray start` ({name}) exited {rc}:\n{_tail(log)}"

    def stop(self) -> None:
        stop_cluster(self.pgids, str(self.temp_dir))


@pytest.fixture
def local_cluster():
    """A 2-node Ray cluster (head: 1 CPU; node 2: 1 CPU + resource ``node2``), always stopped."""
    # Short path: Ray's Unix sockets live under it (and must stay within ~107 characters).
    temp_dir = Path(tempfile.mkdtemp(prefix="fedtune-cluster-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
                "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
    cluster = LocalCluster(temp_dir, env)
    try:
        cluster.port = free_ports(1)[0]
        cluster.start_node("head", ["--head", f"--port={cluster.port}", "--num-cpus=1", "--num-gpus=0",
                                    "--include-dashboard=false"])
        cluster.start_node("node2", [f"--address={cluster.address}", "--num-cpus=1", "--num-gpus=0",
                                     '--resources={"node2": 1}'])
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


def test_sweep_runs_on_a_two_node_local_cluster(local_cluster, tmp_path):
    from fedtune import results

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
        assert line, f"the monitor driver did not connect:\n{_tail(monitor_err)}"
        assert json.loads(line) == {"ready": 2}, (line, _tail(cluster.temp_dir / "ray-start-node2.log"))

        cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--address", cluster.address,
               "--algorithm", "fedavg", "--dataset", "rotated-digits", "--rounds", "2", "--num-samples", "2",
               "--set", "local_steps=1", "--set", "max_client_actors=1", "--max-concurrent", "2",
               "--output", str(tmp_path), "--name", "cluster", "--no-report"]
        with open(sweep_log, "w") as out:
            sweep = subprocess.Popen(cmd, cwd=tmp_path, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = sweep.wait(timeout=SWEEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"fedtune sweep did not finish in {SWEEP_TIMEOUT_S:.0f} s:\n{_tail(sweep_log)}")

        try:  # closing its stdin asks the monitor for its last report
            out, _ = monitor.communicate(timeout=MONITOR_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the monitor driver did not report:\n{_tail(monitor_err)}")
    finally:
        _kill_group(sweep)
        _kill_group(monitor)

    # The CLI succeeded and wrote the study.
    assert rc == 0, _tail(sweep_log)
    study_dir = tmp_path / "cluster"
    study = json.loads((study_dir / "study.json").read_text())
    assert study["searches"]["fedavg"]["status"] == "done"
    assert study["options"]["address"] == cluster.address

    # Every (trial, round) exactly once; both trials completed their 2 rounds.
    trials = results.load(study_dir, "trials").to_pylist()
    trial_ids = sorted(t["trial_id"] for t in trials)
    assert len(trial_ids) == 2 == len(set(trial_ids))
    assert [t["status"] for t in trials] == ["completed", "completed"]
    assert [t["rounds_done"] for t in trials] == [2, 2]
    rows = results.load(study_dir).to_pylist()
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
