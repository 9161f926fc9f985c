"""What Ray cluster fedtune runs on: joining one or starting one, and which nodes it has or can get.

**Joining or starting** (:func:`connect_ray`). fedtune joins an existing cluster when it is told
to (``--address``/``address``), when ``RAY_ADDRESS`` is set (Ray Jobs sets it for the job's
driver) or when a ``ray start --head`` on this machine left its address behind; it then passes
no ``num_cpus``/``num_gpus`` (the cluster has its own). Otherwise it starts a local Ray with
``num_cpus``/``num_gpus`` and no dashboard. Setting ``num_cpus``/``num_gpus`` while joining is an
error that names them, not Ray's traceback.

**Nodes** (:func:`cluster_view`). The nodes alive now, plus, when the cluster has an autoscaler,
the nodes it may still launch: ``max_workers`` of each worker node type minus those up, within
the cluster's ``max_workers``. Planning on both tells a request that can never fit this cluster's
node types (fail fast) from one that fits once the autoscaler adds nodes (Tune's pending
placement groups are the autoscaler's demand; the sweep waits for them with a visible status and
``--scale-up-timeout``). The node types come from the autoscaler: the cluster config it reports
to the GCS (autoscaler v2), else the ``--autoscaling-config`` file of the autoscaler running on
this machine (the head, where fedtune's driver runs; ``ray up`` writes it to
``~/ray_bootstrap_config.yaml``), else that file. No autoscaler found: the alive nodes only.

>>> launchable_nodes({"max_workers": 3, "available_node_types": {
...     "head": {"resources": {"CPU": 2}, "max_workers": 0},
...     "gpu": {"resources": {"CPU": 2, "GPU": 1}, "min_workers": 0, "max_workers": 2}},
...     "head_node_type": "head"}, alive_types={"head": 1, "gpu": 1})
[{'CPU': 2.0, 'GPU': 1.0}]
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError, ResourceError
from fedtune.plugins import plugin_runtime_env, plugin_worker_paths

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

__all__ = ["RAY_START_HINT", "ClusterView", "cluster_address", "cluster_nodes", "cluster_view", "connect_ray",
           "launchable_nodes", "node_types_of_autoscaler", "ray_start_failed"]

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
"""Where ``ray up`` leaves the autoscaler's config on the head node."""


def cluster_address(address: str | None) -> str | None:
    """The address of the Ray cluster ``ray.init(address=address)`` would join, or None when it
    would start a new local Ray: ``address`` itself, else ``RAY_ADDRESS``, else the cluster a
    ``ray start --head`` on this machine recorded (Ray's own lookup)."""
    if address == "local":
        return None
    if address and address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    try:
        # lazy: keeps ray out of this module's import
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address)
    except ConnectionError:
        if address == "auto":
            raise ConfigError("field 'address': 'auto' joins a running Ray cluster, but none was found on this "
                              "machine (no RAY_ADDRESS, no `ray start --head`); start one, give its host:port, or "
                              "leave address unset to start a local Ray") from None
        return None
    except ImportError:  # pragma: no cover - Ray moved its lookup: only explicit addresses join
        return address


def connect_ray(cfg: FederatedRunConfig, *, verbose: bool = False) -> bool:
    """Join the cluster :func:`cluster_address` finds, or start a local Ray with ``num_cpus``/
    ``num_gpus`` and no dashboard.

    Returns True when this call started Ray (so the caller shuts it down). Never called inside a trial.
    """
    import ray  # lazy: keeps ray out of this module's import

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = dict(log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.WARNING)
    target = cluster_address(cfg.address)
    if target is None:
        with _worker_path(plugin_worker_paths()):  # plugins that are not installed: their folders
            try:
                ray.init(address="local", num_cpus=cfg.num_cpus or os.cpu_count(), num_gpus=cfg.num_gpus,
                         include_dashboard=False, **kwargs)
            except Exception as exc:  # noqa: BLE001 - Ray's start-up errors are plain Exception/RuntimeError
                try:
                    ray.shutdown()  # whatever of it did start
                except Exception:  # noqa: BLE001, S110 - nothing more to stop
                    pass
                raise ResourceError(ray_start_failed(exc)) from None
        return True
    shipped = plugin_runtime_env()  # plugins that are not installed travel to every node with the job
    if shipped is not None:
        kwargs["runtime_env"] = shipped
    given = [name for name in ("num_cpus", "num_gpus") if getattr(cfg, name) is not None]
    if given:
        why = "RAY_ADDRESS is set" if not cfg.address and os.environ.get("RAY_ADDRESS") else f"address {target}"
        raise ConfigError(f"field{'s' if len(given) > 1 else ''} {', '.join(repr(g) for g in given)}: "
                          f"{'they size' if len(given) > 1 else 'it sizes'} the local Ray that fedtune starts, but "
                          f"this run joins the Ray cluster at {target} ({why}), whose nodes bring their own "
                          f"resources; remove {' and '.join(given)} (or unset RAY_ADDRESS to start a local Ray)")
    unreachable = _unreachable(target)
    if unreachable is not None:  # at once, not after Ray's retries and warnings (about 20 s)
        raise ResourceError(f"could not join the Ray cluster at {target}: {unreachable}; check `ray status`, the "
                            "address (--address, RAY_ADDRESS) and that the cluster is up")
    try:
        ray.init(address=cfg.address or target, **kwargs)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, or a GCS that did not answer in time
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ResourceError(f"could not join the Ray cluster at {target}: {text}; check `ray status`, the "
                            "address (--address, RAY_ADDRESS), and RAY_AUTH_MODE/RAY_AUTH_TOKEN when the cluster "
                            "uses token authentication; a busy head may need a retry") from None
    return True


RAY_START_HINT = ("the machine may be too busy for Ray's start-up time limits (its GCS gets "
                  "RAY_gcs_server_port_wait_time_s seconds, default 30; its raylet 30 s, fixed in Ray): retry when "
                  "it is less loaded, give the GCS longer (RAY_gcs_server_port_wait_time_s=120), or start Ray once "
                  "yourself (ray start --head --num-cpus N) and join it with --address auto")
"""What to try when a local Ray does not start (:func:`ray_start_failed`)."""


def ray_start_failed(exc: BaseException) -> str:
    """The one line for a local Ray that did not start (``ray.init`` raised ``exc``: a raylet or GCS
    that did not come up in time on a loaded machine, most often).

    >>> print(ray_start_failed(Exception("The current node timed out during startup. It could be")))  # doctest: +ELLIPSIS
    Ray did not start on this machine: The current node timed out during startup; the machine may be ...
    """
    text = " ".join(str(exc).split()) or type(exc).__name__
    first = text.split(". ")[0].rstrip(".")
    return f"Ray did not start on this machine: {first[:300]}; {RAY_START_HINT}"


@contextlib.contextmanager
def _worker_path(folders: list[str]) -> Iterator[None]:
    """``PYTHONPATH`` with ``folders`` first while a local Ray starts: its raylet, and so every worker
    it starts, inherits them (the plugins' folders); this process's own environment is restored."""
    if not folders:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


CONNECT_PROBE_S = 5.0
"""How long :func:`connect_ray` waits for a TCP answer from a cluster's address before it gives up."""


def _unreachable(address: str) -> str | None:
    """Why nothing answers at ``address`` (``host:port`` or ``ray://host:port``), in words; None when
    something does, or when the address has no port to try (Ray then says what is wrong).

    >>> _unreachable("127.0.0.1:1")  # doctest: +ELLIPSIS
    'nothing answers at 127.0.0.1:1 (...)'
    """
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_PROBE_S).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or type(exc).__name__})"
    return None


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterView:
    """The nodes of the connected cluster: ``alive`` now and ``launchable`` by its autoscaler."""

    alive: list[dict[str, float]]
    launchable: list[dict[str, float]] = field(default_factory=list)
    autoscaler: str | None = None  # where the node types came from; None: no autoscaler found

    @property
    def nodes(self) -> list[dict[str, float]]:
        """Every node a plan may use: alive ones first, then those the autoscaler may add."""
        return [*self.alive, *self.launchable]

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for node in self.nodes:
            for k, v in node.items():
                out[k] = out.get(k, 0.0) + float(v)
        return out

    def describe(self) -> str:
        """``"1 node alive, up to 2 more from the autoscaler's node types"``, for messages."""
        text = f"{len(self.alive)} node{'s' if len(self.alive) != 1 else ''} alive"
        if self.autoscaler is not None:
            text += f", up to {len(self.launchable)} more from the autoscaler's node types ({self.autoscaler})"
        return text


def cluster_nodes() -> list[dict[str, float]]:
    """Resources of every node of the connected cluster that may run a trial: alive ones and
    those the autoscaler may add (:func:`cluster_view`)."""
    return cluster_view().nodes


_CACHE: dict[str, Any] = {}
_CACHE_S = 5.0  # Tune asks for every trial's resources; the autoscaler's config is read at most this often


def cluster_view(*, fresh: bool = False) -> ClusterView:
    """The connected cluster's :class:`ClusterView` (cached for a few seconds unless ``fresh``)."""
    import ray  # lazy: keeps ray out of this module's import

    now = time.monotonic()
    if not fresh and _CACHE.get("at", -1e9) > now - _CACHE_S:
        return _CACHE["view"]
    alive_nodes = [n for n in ray.nodes() if n.get("Alive", n.get("alive", False))]
    alive = [{k: float(v) for k, v in n["Resources"].items()} for n in alive_nodes]
    types, source = node_types_of_autoscaler()
    view = ClusterView(alive)
    if types is not None:
        mapping = _autoscaler_node_types_by_id()
        counts: dict[str, int] = {}
        for n, res in zip(alive_nodes, alive):
            name = mapping.get(n.get("NodeID", "")) or _type_by_resources(res, types)
            if name:
                counts[name] = counts.get(name, 0) + 1
        view = ClusterView(alive, launchable_nodes(types, counts), source)
    _CACHE.update(at=now, view=view)
    return view


def _autoscaler_node_types_by_id() -> dict[str, str]:
    """Node id -> node type, from the status the (v1) autoscaler publishes in the GCS."""
    try:
        # lazy: keeps ray out of this module's import
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        return dict((json.loads(raw).get("autoscaler_report") or {}).get("node_type_mapping") or {}) if raw else {}
    except Exception:  # noqa: BLE001 - no autoscaler status: fall back to matching resources
        return {}


def _type_by_resources(res: Mapping[str, float], config: Mapping[str, Any]) -> str | None:
    """The node type whose CPU/GPU match ``res`` (the head: the node with Ray's head marker)."""
    if "node:__internal_head__" in res:
        return config.get("head_node_type")
    for name, spec in (config.get("available_node_types") or {}).items():
        want = (spec or {}).get("resources") or {}
        if want and all(abs(float(want.get(k, 0)) - float(res.get(k, 0))) < 1e-9 for k in ("CPU", "GPU")):
            return name
    return None


def launchable_nodes(config: Mapping[str, Any], alive_types: Mapping[str, int]) -> list[dict[str, float]]:
    """The nodes an autoscaler with ``config`` (a cluster YAML's ``max_workers``,
    ``available_node_types``, ``head_node_type``) may still add, given how many nodes of each
    type are up (``alive_types``). Node types without known resources are left out."""
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    room = int(config.get("max_workers", 10**6)) - sum(n for t, n in alive_types.items() if t != head)
    out: list[dict[str, float]] = []
    for name, spec in types.items():
        if name == head or not (spec or {}).get("resources"):
            continue
        more = int(spec.get("max_workers", config.get("max_workers", 0))) - int(alive_types.get(name, 0))
        for _ in range(max(0, min(more, room - len(out)))):
            out.append({k: float(v) for k, v in spec["resources"].items() if k != "object_store_memory"})
    return out


def node_types_of_autoscaler() -> tuple[dict[str, Any] | None, str | None]:
    """The autoscaler's node types as a cluster-config mapping, and where they were read; (None,
    None) when the cluster has no autoscaler fedtune can see."""
    try:
        from ray._private.state import state  # lazy: keeps ray out of this module's import

        reported = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - older Ray or no GCS config: try the files below
        reported = None
    if reported is not None and len(reported.node_group_configs):
        types = {g.name: {"resources": dict(g.resources), "max_workers": int(g.max_count)}
                 for g in reported.node_group_configs}
        return {"available_node_types": types}, "reported by the autoscaler"
    for path in (_running_autoscaler_config(), Path(BOOTSTRAP_CONFIG).expanduser()):
        if path is not None and path.is_file():
            # lazy: keeps yaml out of this module's import
            import yaml

            from fedtune import yaml_safe

            try:
                doc = yaml_safe.load_file(path)
            except (OSError, ConfigError, yaml.YAMLError):
                continue
            if isinstance(doc, dict) and doc.get("available_node_types"):
                return doc, str(path)
    return None, None


def _running_autoscaler_config() -> Path | None:
    """The ``--autoscaling-config`` of the Ray autoscaler (``monitor.py``) of the connected cluster
    when it runs on this machine (the head node)."""
    import ray  # lazy: keeps ray out of this module's import

    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001
        return None
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            args = (pid / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(a.endswith(b"autoscaler/_private/monitor.py") for a in args):
            continue
        text = [a.decode(errors="replace") for a in args]
        if not any(a.startswith("--gcs-address=") and a.split("=", 1)[1] == gcs for a in text):
            continue
        for a in text:
            if a.startswith("--autoscaling-config="):
                return Path(a.split("=", 1)[1]).expanduser()
    return None
