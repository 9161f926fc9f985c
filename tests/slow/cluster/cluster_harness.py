"""Real multi-process Ray clusters on this machine for tests, and stopping exactly their processes.

Used by ``test_cluster_local.py`` (a head and a second node by ``ray start``) and
``test_autoscaling.py`` (Ray's fake multi-node autoscaler launching worker nodes). Rules (see
``test_cluster_local.py``'s docstring for why): a private short ``--temp-dir`` per cluster, free
ports, a fresh auth token per cluster (``RAY_AUTH_MODE=token`` + ``RAY_AUTH_TOKEN``), every
subprocess with a timeout and its output in a file, and never ``ray stop``: :func:`stop_cluster`
SIGKILLs the process groups of the ``ray start`` calls, every process naming the temp dir, and their
descendants.
"""

from __future__ import annotations

import collections
import os
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

START_TIMEOUT_S = 180.0  # one `ray start` (a few seconds when idle)
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this Python


# ------------------------------------------------------------------------------------------------
# Processes, from /proc (no psutil here).
def _proc_table() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgid, start time in ticks, command line) of every visible process that has
    not exited (a zombie waiting for its parent to reap it counts as gone)."""
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
        if rest[0] in ("Z", "X"):
            continue
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


def stop_cluster(pgids: set[int], marker: str, grace_s: float = 0.0) -> None:
    """Stop exactly this test's Ray processes (see the module docstring): SIGKILL, then again for
    anything started meanwhile, until none is left.

    No SIGTERM first by default (``grace_s`` > 0 asks for one): Ray's GCS, raylet, runtime-env
    agent and autoscaler monitor do not exit on a SIGTERM sent to all of them at once (each waits
    for the others), so a grace period was always waited out in full; a test's cluster keeps
    nothing worth a graceful stop (its temp dir is removed next)."""
    procs = _cluster_processes(pgids, marker)
    if grace_s > 0:
        _signal_all(procs, signal.SIGTERM)
        deadline = time.time() + grace_s
        while _alive(procs) and time.time() < deadline:
            time.sleep(0.1)
    deadline = time.time() + 20.0
    while True:
        _signal_all(procs, signal.SIGKILL)
        while _alive(procs) and time.time() < deadline:
            time.sleep(0.05)
        # A process forked meanwhile (a worker, a fake node's daemon) is in the groups, names the
        # temp dir or descends from one still listed; killed in the next pass.
        more = _alive(procs) | _cluster_processes(pgids, marker)
        if not more or time.time() >= deadline:
            return
        procs = more


def kill_group(proc: subprocess.Popen | None) -> None:
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


def tail(path: Path, n: int = 4000) -> str:
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
        """``ray start`` a node and wait until it has returned."""
        self.wait_node(self.launch_node(name, args))

    def launch_node(self, name: str, args: list[str]) -> tuple[str, subprocess.Popen, Path]:
        """``ray start`` a node without waiting; :meth:`wait_node` waits for it."""
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
        return name, proc, log

    def wait_node(self, launched: tuple[str, subprocess.Popen, Path]) -> None:
        name, proc, log = launched
        try:
            rc = proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            pytest.fail(f"`ray start` ({name}) did not return in {START_TIMEOUT_S:.0f} s:\n{tail(log)}")
        assert rc == 0, f"`ray start` ({name}) exited {rc}:\n{tail(log)}"

    def wait_for_gcs(self, head: tuple[str, subprocess.Popen, Path]) -> None:
        """Until the head's GCS accepts connections (what another node's ``ray start`` needs; the
        head's own ``ray start`` goes on with its raylet and agents meanwhile), or its ``ray start``
        has returned (:meth:`wait_node` then says how)."""
        deadline = time.time() + START_TIMEOUT_S
        while head[1].poll() is None and time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)

    def processes(self) -> set[tuple[int, str]]:
        """(pid, start time) of every process of this cluster now (worker nodes that its autoscaler
        launched included: they descend from its head's processes)."""
        return _cluster_processes(self.pgids, str(self.temp_dir))

    def stop(self) -> None:
        stop_cluster(self.pgids, str(self.temp_dir))


def cluster_env() -> dict[str, str]:
    """This process's environment for a private cluster: no inherited address, a fresh token."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
                "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
    return env


def short_temp_dir(prefix: str) -> Path:
    """A temp dir with a short path: Ray's Unix sockets live under it (~107 characters at most)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def processes_with_env(name: str, value: str) -> set[tuple[int, str]]:
    """(pid, start time) of every process whose environment has ``name=value``, whoever started
    it: intersect with :meth:`LocalCluster.processes` (Ray's fake provider gives the worker nodes
    of every fake cluster the same node ids, ``fff...00001`` first)."""
    want = f"{name}={value}".encode()
    out = set()
    for pid, (_, _, start, _) in _proc_table().items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.add((pid, start))
        except OSError:
            continue
    return out


def kill_processes(procs: set[tuple[int, str]]) -> None:
    """SIGKILL ``procs`` (as a lost machine would vanish) and wait until they are gone."""
    _signal_all(procs, signal.SIGKILL)
    deadline = time.time() + 10.0
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.05)
