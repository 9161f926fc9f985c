"""``ray up`` / ``ray exec`` / ``ray down`` with ``examples/cluster-onprem.yaml`` over SSH on loopback.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/cluster/test_cluster_onprem.py."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from getpass import getuser
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_cluster_onprem import (CHECK, DOWN_TIMEOUT_S, EXAMPLE, EXEC_TIMEOUT_S, GONE_TIMEOUT_S, RAY,
                                               RELAY, REPO, SSHD, UP_TIMEOUT_S, needs_sshd)


# ------------------------------------------------------------------------------------------------
# Helpers
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except FileNotFoundError:
                pass
    return pids


def _pids_with_cmdline(text: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                pids.append(int(name))
    return pids


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _run(cmd: list[str], log: Path, timeout: float, **kw) -> tuple[int, str, float]:
    """Run ``cmd`` with output to ``log`` (a file: daemons may inherit it); kill its group on timeout."""
    t0 = time.monotonic()
    with open(log, "wb") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, **kw)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            rc = -9
    text = log.read_text(errors="replace")
    if rc == -9:
        raise AssertionError(f"timed out after {timeout} s: {shlex.join(cmd)}\n{text[-4000:]}")
    return rc, text, time.monotonic() - t0


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _root_pip_env() -> dict[str, str]:
    """This machine's pip settings (config files of root and PIP_* variables) as PIP_* variables."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, timeout=60).stdout
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        if key.startswith(("global.", "install.")) and name and value:
            env.setdefault("PIP_" + name.upper().replace("-", "_"), value.strip("'\""))
    return env


def _control_dir(cluster_name: str) -> str:
    """Where Ray's SSH runner keeps this cluster's control-master sockets (command_runner.py)."""
    return "/tmp/ray_ssh_{}/{}".format(hashlib.sha256(getuser().encode()).hexdigest()[:10],
                                       hashlib.sha256(cluster_name.encode()).hexdigest()[:10])


def _venv_packages_without_fedtune(tmp: Path, mounts: list[Path]) -> Path:
    """A folder of links to this venv's installed packages, fedtune's own editable install left out.

    The box's venv is built ``--system-site-packages`` on the base Python, which in a venv run (CI
    makes a fresh venv) holds none of fedtune's dependencies; on ``PYTHONPATH`` this folder gives
    them to the box as its system packages would, while the box's own ``pip install -e ~/fedtune``
    stays the fedtune it imports (this venv's ``__editable__`` finder is not linked: its module
    name is the same as the box's and would shadow it). A venv the user cannot enter is reached
    through a read-only bind mount, as the base Python is."""
    site = _reachable(next(Path(p) for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages")),
                      tmp / "venv-site", mounts)
    out = tmp / "venv-packages"
    out.mkdir(mode=0o755)
    for entry in site.iterdir():
        if entry.name.startswith(("__editable__", "fedtune-", "fedtune.")) or entry.suffix == ".pth":
            continue
        (out / entry.name).symlink_to(entry)
    return out


def _reachable(path: Path, mount_at: Path, mounts: list[Path]) -> Path:
    """``path`` when another user can enter it, else a read-only bind mount of it at ``mount_at``
    (added to ``mounts``, unmounted at teardown); a machine that can do neither skips the test."""
    if _traversable_by_others(path):
        return path
    mount_at.mkdir()
    r = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(mount_at)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        mount_at.rmdir()
        pytest.skip(f"{path} is not reachable by another user and cannot be bind-mounted: {r.stderr.strip()} "
                    "(environment, not a missing feature)")
    mounts.append(mount_at)
    return mount_at


def _traversable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def _checkout_copy(dest: Path) -> Path:
    """A copy of what ``ray up`` syncs of this checkout: its files that git tracks or would track
    (``git ls-files -co --exclude-standard``: ignored ones left out, as the config's
    ``rsync_filter: [.gitignore]`` and the test's excludes leave them out of the sync), as they are
    in the work tree, and its ``.git`` (which the config's ``rsync_exclude`` must keep off the box).

    ``ray up`` runs from this copy instead of the checkout itself because before syncing anything it
    hashes every file under each local ``file_mounts`` path (``hash_runtime_conf``), rsync's excludes
    not applying: in a checkout holding its virtualenv that is gigabytes read (tens of seconds)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=REPO,
                            capture_output=True, timeout=60, check=True).stdout.split(b"\0")
    for name in filter(None, listed):
        src, dst = REPO / os.fsdecode(name), dest / os.fsdecode(name)
        if src.is_file() or src.is_symlink():  # not one deleted from the work tree
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    git = REPO / ".git"
    try:
        if git.is_dir():
            shutil.copytree(git, dest / ".git", symlinks=True)
        else:
            shutil.copy2(git, dest / ".git")
    except (shutil.Error, OSError):  # a file git replaced meanwhile: what matters is that .git exists
        pass
    assert (dest / "pyproject.toml").is_file() and (dest / ".git").exists(), sorted(dest.iterdir())
    return dest


# ------------------------------------------------------------------------------------------------
# The loopback "lab box"
@dataclass
class Box:
    tmp: Path
    user: str
    uid: int
    home: Path
    config: Path
    cluster_name: str
    checkout: Path  # what `ray up` runs from: see _checkout_copy
    env: dict[str, str]
    sentinel: subprocess.Popen


def _write_user_env(box_home: Path, lines: list[str], uid: int, gid: int) -> None:
    """Put this machine's environment at the top of the user's ~/.bashrc (before its interactive check)."""
    bashrc = box_home / ".bashrc"
    old = bashrc.read_text() if bashrc.exists() else ""
    bashrc.write_text("# this machine's environment (written by tests/slow/cluster/test_cluster_onprem.py)\n"
                      + "\n".join(lines) + "\n" + old)
    os.chown(bashrc, uid, gid)


def _test_config(user: str, key: Path, token: Path, relay: Path, sshd_port: int) -> dict:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    assert cfg["provider"]["type"] == "local" and cfg["file_mounts"]["~/fedtune"] == "."
    cfg = copy.deepcopy(cfg)
    cfg["cluster_name"] = f"fedtune-onprem-test-{uuid.uuid4().hex[:8]}"
    cfg["provider"]["head_ip"] = "127.0.0.1"
    cfg["provider"]["worker_ips"] = []
    cfg["auth"] = {"ssh_user": user, "ssh_private_key": str(key),
                   "ssh_proxy_command": f"{sys.executable} {relay} %h {sshd_port}"}
    cfg["file_mounts"]["~/.ray/auth_token"] = str(token)
    # Folders git ignores (not only .gitignore: also .git/info/exclude) stay out of the sync.
    ignored = subprocess.run(["git", "ls-files", "-o", "-i", "--exclude-standard", "--directory"],
                             cwd=REPO, capture_output=True, text=True, timeout=60).stdout.split()
    cfg["rsync_exclude"] = cfg["rsync_exclude"] + ["/" + p.rstrip("/") for p in ignored if "/" not in p.rstrip("/")]
    gcs, dash, agent, agent_grpc, runtime_env, metrics = _free_ports(6)
    head = cfg["head_start_ray_commands"]
    start = [i for i, c in enumerate(head) if "ray start --head" in c]
    assert len(start) == 1 and "--port=6379" in head[start[0]]
    head[start[0]] = (head[start[0]].replace("--port=6379", f"--port={gcs}")
                      + f" --node-ip-address=127.0.0.1 --dashboard-port={dash}"
                      f" --dashboard-agent-listen-port={agent} --dashboard-agent-grpc-port={agent_grpc}"
                      f" --runtime-env-agent-port={runtime_env} --metrics-export-port={metrics}"
                      " --object-store-memory=200000000")
    return cfg


@pytest.fixture
def box():
    tmp = Path(tempfile.mkdtemp(prefix="ftop-", dir="/tmp"))
    tmp.chmod(0o755)
    user = "ftop" + uuid.uuid4().hex[:8]
    home = tmp / "home"
    mounts: list[Path] = []
    sshd: subprocess.Popen | None = None
    sentinel: subprocess.Popen | None = None
    made_run_sshd = False
    uid = -1
    cluster_name = ""
    try:
        _sh("useradd", "-m", "-d", str(home), "-s", "/bin/bash", "-p", "*", user)
        pw = pwd.getpwnam(user)
        uid, gid = pw.pw_uid, pw.pw_gid

        keys = tmp / "keys"
        keys.mkdir(mode=0o700)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "host"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(keys / "user"))
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(keys / "user.pub", ssh_dir / "authorized_keys")
        (ssh_dir / "authorized_keys").chmod(0o600)
        for p in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(p, uid, gid)
        token = keys / "auth_token"
        token.write_text(uuid.uuid4().hex)
        token.chmod(0o600)
        relay = tmp / "relay.py"
        relay.write_text(RELAY)
        (tmp / "check.py").write_text(CHECK)

        # This machine's Python, reachable by the user (a read-only bind mount if it is not).
        prefix = _reachable(Path(sys.base_prefix), tmp / "python", mounts)
        lines = []
        if prefix != Path(sys.base_prefix):
            lines.append(f"export LD_LIBRARY_PATH={prefix / 'lib'}")  # its libpython (rpath under /root)
        rt = home / "rt"
        rt.mkdir()
        os.chown(rt, uid, gid)
        lines += [f"export PATH={prefix / 'bin'}:$PATH", f"export RAY_TMPDIR={rt}", f"export TMPDIR={rt}",
                  "export RAY_USAGE_STATS_ENABLED=0"]  # TMPDIR: multiprocessing's pymp-* folders, removed with rt
        if sys.prefix != sys.base_prefix:  # run from a venv (CI's): the box's "system" packages are this venv's
            lines.append(f"export PYTHONPATH={_venv_packages_without_fedtune(tmp, mounts)}")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(_root_pip_env().items())]
        _write_user_env(home, lines, uid, gid)

        # Our own sshd on a free loopback port.
        port = _free_ports(1)[0]
        (tmp / "sshd_config").write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {keys / 'host'}", "PidFile none",
            "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", f"AllowUsers {user}", "PermitRootLogin no",
            "AuthorizedKeysFile .ssh/authorized_keys", "Subsystem sftp internal-sftp", ""]))
        if not os.path.isdir("/run/sshd"):  # sshd's privilege-separation directory
            os.makedirs("/run/sshd", mode=0o755)
            made_run_sshd = True
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(tmp / "sshd_config")],
                                stdout=open(tmp / "sshd.log", "wb"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sshd.poll() is None, (tmp / "sshd.log").read_text()
                assert time.monotonic() < deadline, "sshd did not listen within 30 s"
                time.sleep(0.2)

        # A root process named `raylet`: the user's `ray stop` must not reach it.
        fake_raylet = tmp / "raylet"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", fake_raylet)
        sentinel = subprocess.Popen([str(fake_raylet), "900"], start_new_session=True)

        cfg = _test_config(user, keys / "user", token, relay, port)
        cluster_name = cfg["cluster_name"]
        config = tmp / "cluster.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
        launcher = tmp / "launcher"
        launcher.mkdir()
        # The local provider's state file (RAY_TMPDIR) and `ray down`'s config cache (TMPDIR) go here.
        env.update(RAY_TMPDIR=str(launcher), TMPDIR=str(launcher), RAY_USAGE_STATS_ENABLED="0")
        checkout = _checkout_copy(tmp / "checkout")
        yield Box(tmp, user, uid, home, config, cluster_name, checkout, env, sentinel)
    finally:
        if uid >= 0:
            for _ in range(50):
                pids = _pids_of_uid(uid)
                if not pids:
                    break
                _kill(pids)
                time.sleep(0.1)
        if sshd is not None:
            sshd.kill()
            sshd.wait(timeout=30)
        if sentinel is not None:
            sentinel.kill()
            sentinel.wait(timeout=30)
        if cluster_name:  # Ray's SSH control masters (ControlPersist) for this cluster, then their dir
            control = _control_dir(cluster_name)
            _kill(_pids_with_cmdline(control))
            shutil.rmtree(control, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(control))  # only if no other cluster of this user uses it
            except OSError:
                pass
        _kill(_pids_with_cmdline(str(tmp)))  # relays (ProxyCommand) left by a killed ssh
        for mounted in reversed(mounts):
            r = subprocess.run(["umount", str(mounted)], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:  # never rmtree through a mount
                raise RuntimeError(f"umount {mounted} failed: {r.stderr}; left {tmp} in place")
        if uid >= 0:
            subprocess.run(["userdel", user], capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
        if made_run_sshd:
            try:
                os.rmdir("/run/sshd")
            except OSError:
                pass


@pytest.mark.ray
@needs_sshd
def test_ray_up_exec_down_over_ssh_on_loopback(box: Box, tmp_path: Path):
    times = {}  # the commands' logs stay in tmp_path
    rc, up, times["up"] = _run([*RAY, "up", "-y", "--no-config-cache", str(box.config)], tmp_path / "up.log",
                               UP_TIMEOUT_S, cwd=box.checkout, env=box.env)
    assert rc == 0, up[-6000:]
    # The checkout was synced (without .git) and fedtune installed editable from it into the venv.
    assert (box.home / "fedtune" / "pyproject.toml").is_file() and not (box.home / "fedtune" / ".git").exists()
    assert (box.home / ".ray" / "auth_token").read_text() == (box.tmp / "keys" / "auth_token").read_text()
    assert (box.home / "fedtune-venv" / "bin" / "fedtune").is_file()

    # As docs/cluster.md says: from ~/fedtune (Ray puts the driver's cwd on its workers' sys.path; from ~,
    # the checkout folder ~/fedtune would shadow the package as a namespace package there).
    # The import check runs beside the fedtune run (two drivers of the cluster at once, each starting
    # its own worker processes): its output goes to a file, printed once both have exited; the
    # command exits with the fedtune run's status, the check's is printed after it.
    run = ("fedtune run --address auto --rounds 1 --no-progress --output ~/onprem-out --name onprem"
           " --set local_steps=1 --set model=mlp --set 'mlp_hidden=[8]' --set max_client_actors=1")
    check_cmd = f"python {box.tmp / 'check.py'} > ~/check.log 2>&1; echo ONPREM_CHECK_RC $? >> ~/check.log"
    cmd = f"cd ~/fedtune && {{ {check_cmd}; }} & cd ~/fedtune && {run}; rc=$?; wait; cat ~/check.log; exit $rc"
    rc, out, times["exec"] = _run([*RAY, "exec", "--no-config-cache", str(box.config), cmd],
                                  tmp_path / "exec.log", EXEC_TIMEOUT_S, cwd=box.checkout, env=box.env)
    assert rc == 0, out[-6000:]
    assert "ONPREM_CHECK_RC 0" in out, out[-6000:]
    line = next((ln for ln in out.splitlines() if ln.startswith("ONPREM_CHECK ")), None)
    assert line is not None, out[-6000:]
    check = json.loads(line.split(" ", 1)[1])
    venv_python = str(box.home / "fedtune-venv" / "bin" / "python")
    own = box.home / "fedtune" / "fedtune"
    assert check["cwd"] == str(box.home / "fedtune"), check
    assert check["driver"] == [str(own / "__init__.py"), venv_python], check  # not /work/main, not the system Python
    # Ray's worker processes too: the venv's Python (the `ray` shim of the setup commands) and this copy.
    assert check["worker"] == [str(own / "__init__.py"), str(own / "runtime" / "driver.py"), venv_python], check
    assert check["token_auth"] is True and check["nodes"] == 1, check
    assert list((box.home / "onprem-out").rglob("*.parquet")), "the fedtune run wrote no Arrow store"

    rc, down, times["down"] = _run([*RAY, "down", "-y", str(box.config)],
                                   tmp_path / "down.log", DOWN_TIMEOUT_S, cwd=box.checkout, env=box.env)
    assert rc == 0, down[-6000:]
    _kill(_pids_with_cmdline(_control_dir(box.cluster_name)))  # SSH sessions kept open by ControlPersist
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while _pids_of_uid(box.uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in _pids_of_uid(box.uid) if _alive(p)]
    assert not left, f"processes of {box.user} left after `ray down`: {left}"
    # The user's `ray stop` (in head_start_ray_commands and in `ray down`) did not reach root's `raylet`.
    assert _alive(box.sentinel.pid)
    print("\nray up/exec/down over SSH on loopback: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
