"""``ray up`` / ``ray exec`` / ``ray down`` with ``examples/cluster-onprem.yaml`` over SSH on loopback.

Ray's ``local`` provider drives a lab's own boxes over SSH. This test makes this machine such a box
and runs the whole cycle a lab would run, with the shipped file's own setup and start commands:

* a **throwaway unix user** (home in a temp dir) is the SSH user: the setup commands build its venv
  (``--system-site-packages`` on top of this machine's Python: at most setuptools is fetched, for
  the editable build) and ``pip install -e ~/fedtune`` from the checkout that ``ray up`` synced
  there, so the root user's editable fedtune is never touched;
* **its own sshd** (``sshd -D`` on a free loopback port, throwaway host and user keys, only that
  user allowed). Ray's SSH runner has no port setting, so the test config reaches the port through
  ``auth.ssh_proxy_command`` (the knob a lab uses for a gateway) with a 10-line TCP relay;
* ``ray up -y`` (rsync of the checkout and of a fresh auth token, setup commands, ``ray stop`` +
  ``ray start --head`` as that user), then ``ray exec`` of a real ``fedtune run --address auto`` (1
  round of a tiny mlp) and, beside it, of a check that the driver *and a Ray worker process* of the
  cluster import fedtune from the user's ``~/fedtune`` with the venv's Python, under token
  authentication; then ``ray down -y``, after which no process of that user is left.

The test config is the shipped file loaded with ``yaml.safe_load`` with only what a loopback box
needs changed: head_ip 127.0.0.1, no workers (a second raylet on the same host would need its own
agent ports), the SSH user/key/proxy, the token file, free ports for the head (never 6379, 8265...),
a unique cluster name, and the untracked-but-ignored folders of this checkout kept out of the rsync.
The three commands run from a copy of the checkout's files that the sync sends, ``.git`` included
(``_checkout_copy``): ``ray up`` first hashes every file under the mount's local path, and this
checkout's ignored virtualenv alone is gigabytes.

Isolation from the shared machine: ``ray stop`` runs only as the throwaway user (a root process named
``raylet`` started by the test checks it survives), the user's ``RAY_TMPDIR`` and the launcher's are
private temp dirs, nothing is installed into the system Python. Run from a venv (as CI runs), the
box's packages are this venv's, on ``PYTHONPATH`` (fedtune's own editable install left out). If this machine's Python lies below
a directory other users cannot enter (pyenv under /root), a read-only bind mount of its prefix lets
the user run it. Teardown (also on failure): the user's processes, the sshd, the SSH control-master
processes of this cluster, the mount, the user, the temp dir.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster-onprem.yaml"
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this Python
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)

UP_TIMEOUT_S = 300  # `ray up`: about 25 s when idle (the editable build is most of it)
EXEC_TIMEOUT_S = 300  # `ray exec`: the 1-round fedtune run and the import check
DOWN_TIMEOUT_S = 120  # `ray down`: a few seconds
GONE_TIMEOUT_S = 30  # until the user's last process has exited after `ray down`

RELAY = """\
import os, socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while (b := os.read(0, 65536)):
        s.sendall(b)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while (b := s.recv(65536)):
    os.write(1, b)
"""

CHECK = """\
import json, os, sys
import fedtune, ray
from ray._raylet import AuthenticationMode, get_authentication_mode
ray.init(address="auto", log_to_driver=False)

@ray.remote(num_cpus=0)
def where():
    import sys
    import fedtune.runtime.driver
    return fedtune.__file__, fedtune.runtime.driver.__file__, sys.executable

print("ONPREM_CHECK " + json.dumps({
    "driver": [fedtune.__file__, sys.executable],
    "cwd": os.getcwd(),
    "worker": list(ray.get(where.remote(), timeout=120)),
    "token_auth": get_authentication_mode() == AuthenticationMode.TOKEN,
    "nodes": sum(1 for n in ray.nodes() if n["Alive"]),
}))
"""


def _skip_reason() -> str | None:
    env = "(environment, not a missing feature)"
    if not sys.platform.startswith("linux"):
        return f"Linux only: a throwaway unix user, an sshd and /proc {env}"
    if os.geteuid() != 0:
        return f"needs root: it creates a throwaway unix user and runs its own sshd {env}"
    if SSHD is None:
        return (f"sshd is not installed on this machine {env}: `apt-get install openssh-server` "
                "(.ci/run tries it)")
    for tool in ("ssh", "ssh-keygen", "rsync", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed on this machine {env} (.ci/run installs openssh-server and rsync)"
    return None


needs_sshd = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


# ------------------------------------------------------------------------------------------------
def test_shipped_onprem_config_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load(EXAMPLE.read_text())
    prepared = prepare_config(copy.deepcopy(cfg))  # the local provider's own preparation, as `ray up` does
    validate_config(prepared)
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert node_type["min_workers"] == node_type["max_workers"] == len(cfg["provider"]["worker_ips"])
    assert any("pip install" in c and '-e "$HOME/fedtune[cluster]"' in c for c in cfg["setup_commands"])
    assert any("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"])
