"""One federated run = one Ray Tune trial: :class:`FedtuneTrainable` and its resources.

A trial's config is a flat dict of :class:`~fedtune.config.FederatedRunConfig` fields and component
hyperparameters, e.g. ``{"algorithm": "fedomg", "rounds": 5, "omg_kappa": 0.3}``. One
:meth:`FedtuneTrainable.step` runs one federated round and returns a flat metrics dict (see
:data:`RESULT_KEYS`); ``training_iteration`` equals the round.

**Placement.** :func:`resources_for` gives Tune a :class:`~ray.tune.PlacementGroupFactory` of
``[{}] + bundles``: an *empty head bundle* for the trainable, then exactly the bundles
``fedtune run`` would reserve (:func:`fedtune.runtime.resources.plan_resources`): the
coordinator's bundle when ``coordinator_cpus``/``coordinator_gpus`` > 0, then one
``{CPU: client_cpus, GPU: client_gpus}`` bundle per client actor, ``min(num clients,
max_client_actors or what the cluster fits)`` of them. Tune drops an empty head bundle from
the placement group and runs the trainable actor with no resources on bundle 0, so the
group's bundles are laid out exactly as :class:`~fedtune.runtime.resources.ResourcePlan`
says, and the coordinator and every client actor are created inside it at those indices. The
trainable is the driver of the run: it only waits on the coordinator, like the coordinator
waits on clients, so it reserves nothing (the same choice the runtime makes for the
coordinator by default). A trial therefore reserves exactly what the same ``fedtune run``
would, e.g. 3 clients at ``client_cpus=0.5``: ``[{}, {CPU: .5}, {CPU: .5}, {CPU: .5}]``.

**Checkpoints** (``checkpoint_every`` rounds, or whenever Tune asks): the global weights
(``weights.npy``, float32), the server rule's ``state_dict()``, the last global move, every
client's persistent ``ctx.state`` and the round. Participant sampling and every client's data
order and initial RNG derive from (seed, client, round), so this is all the state there is: a
run restored from round ``r`` computes rounds ``r+1, ...`` exactly as an uninterrupted run.
Loading a checkpoint keeps the trial's own config (PBT-style exploitation loads another
trial's weights into a new config); the model must have the same size. A damaged checkpoint (cut by
a SIGKILL or a full disk) falls back to the newest readable one beside it, else to round 1, and
the next result's ``fedtune_warning`` names it. Checkpoints are NumPy and
JSON files only (no pickle; :mod:`fedtune.runtime.checkpoint`), so server-rule and client state
must consist of arrays, tensors, numbers, strings, lists, tuples and dicts; anything else (e.g. a
live ``nn.Module`` kept in ``ctx.state``) fails the checkpoint with a TypeError naming where it sits.

**Actor reuse** (``TuneConfig(reuse_actors=True)``): Tune hands a finished trial's actor only
to a trial whose :func:`resources_for` is equal, i.e. the same bundle shapes. ``reset_config``
then keeps the placement group, the coordinator and every client actor and re-configures them
in place (:meth:`fedtune.runtime.worker.ClientWorker.reconfigure` re-runs the worker's
constructor in the same process: no process start, no torch import). Equal bundles with a
different layout (a coordinator bundle in one config, a client bundle in the other) restart
the actors inside the kept placement group instead. ``reset_config`` never returns False:
in Ray 2.60 False makes Tune *fail* the trial ("Could not re-use actor"), it does not restart it.
A reused trial computes exactly what a fresh trial of the same config computes.

The trainable never calls ``ray.init`` and never writes results: the single writer of the
Arrow store is :class:`fedtune.tune.trial.callback.ArrowCallback` on the driver.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.tune import PlacementGroupFactory

from fedtune.config import ROLES, FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.plugins import load_plugins, loaded_plugin_entries
from fedtune.results import status
from fedtune.results.schema import IDENTITY_COLUMNS
from fedtune.runtime.checkpoint import newest_readable_checkpoint, write_checkpoint
from fedtune.runtime.cluster import cluster_nodes
from fedtune.runtime.driver import FederatedRun, build_plan, hp_columns, round_row
from fedtune.runtime.resources import ResourcePlan, resource_plan_of
from fedtune.spaces.model import strip_switches
from fedtune.tune.common.searches import SEARCH_FIELD

__all__ = ["RESULT_KEYS", "FedtuneTrainable", "fedtune_trainable", "plan_from_bundles", "resources_for",
           "trial_resource_plan", "trial_run_config"]

RESULT_KEYS = ("round", "val_acc", "target_acc", "target_val_acc", "ood_val_acc", "val_macro_f1",
               "ood_val_macro_f1", "oracle_acc", "train_loss", "server_s", "status", "trial_id",
               "fedtune_trial_id", "algorithm", "fedtune_row", "done", "training_iteration",
               "startup_s", "actors_reused", "actors_in_trial_pg")
"""Keys every result of :meth:`FedtuneTrainable.step` has. Besides them: every numeric column
of the round row (``val_acc.<domain>``, ``wall_s``, ``diag.<name>``, ...; ``hp.*`` stay in
``config``), and, in the first result after a restore that met a damaged checkpoint, ``fedtune_warning``. ``trial_id`` is overwritten by Ray Tune with *its* trial id (Tune fills that key
itself), so fedtune's id (:meth:`FederatedRunConfig.trial_id`) is ``fedtune_trial_id`` and
``fedtune_row["trial_id"]``. ``val_acc``/``target_acc`` and the selection scores
``target_val_acc`` (fda only) / ``ood_val_acc``, ``val_macro_f1``, ``ood_val_macro_f1`` (a split
file's) / ``oracle_acc`` (not in fl) are NaN in rounds without evaluation
(``eval_every``), after divergence and where the setting has none, so schedulers always find the
metric. ``startup_s`` is the
trainable's own start-up time of the trial (entering ``setup``/``reset_config`` to the coordinator
and every client actor being ready), ``actors_reused`` whether that kept live actors, and
``actors_in_trial_pg`` whether the coordinator and every client actor run in the placement group
Tune gave the trial (False for a trainable used outside Tune, whose run reserves its own)."""


# ------------------------------------------------------------------------------------------------
def trial_run_config(config: Mapping[str, Any]) -> FederatedRunConfig:
    """The :class:`FederatedRunConfig` of a trial's flat config dict, with ``backend`` forced to ``"ray"``
    and a search space's ``switch.*`` keys (:func:`fedtune.spaces.model.strip_switches`) left out:
    switches steer sampling, they are not fields of a run; nor is the name of the trial's search
    (:data:`fedtune.tune.common.searches.SEARCH_FIELD`). Validating it reads the components'
    declarations only, so the trial actor imports no torch.

    >>> cfg = trial_run_config({"rounds": 2, "backend": "local", "local_lr": 0.1})
    >>> cfg.backend, cfg.rounds, cfg.local_lr
    ('ray', 2, 0.1)
    """
    fields = {k: v for k, v in strip_switches(config).items() if k != SEARCH_FIELD}
    return FederatedRunConfig.from_dict({**fields, "backend": "ray"})


@functools.lru_cache(maxsize=128)
def _num_clients(plan_key: str) -> int:
    return build_plan(FederatedRunConfig.from_dict(json.loads(plan_key))).num_clients


def num_clients_of(cfg: FederatedRunConfig) -> int:
    """Logical clients of ``cfg``'s data plan (cached on the fields that decide it, declared ``plan=True``:
    Tune asks for every trial's resources on the driver, and a sweep's trials mostly share one plan)."""
    values = cfg.to_dict()
    return _num_clients(json.dumps({k: values[k] for k in ROLES.plan_fields}, sort_keys=True))


def trial_resource_plan(cfg: FederatedRunConfig, nodes: list[dict[str, float]] | None = None) -> ResourcePlan:
    """:func:`~fedtune.runtime.resources.resource_plan_of` for ``cfg`` on ``nodes`` (default: the
    connected Ray cluster's nodes, or this machine's CPUs when Ray is not initialised). Fails fast
    with :class:`~fedtune.errors.ResourceError` when no node can hold the trial."""
    if nodes is None:
        nodes = cluster_nodes() if ray.is_initialized() else [{"CPU": float(os.cpu_count() or 1)}]
    return resource_plan_of(cfg, num_clients_of(cfg), nodes)


def resources_for(config: Mapping[str, Any], nodes: list[dict[str, float]] | None = None) -> PlacementGroupFactory:
    """The trial's :class:`~ray.tune.PlacementGroupFactory`: an empty head bundle for the
    trainable, then the run's bundles (coordinator bundle if it reserves anything, then one per
    client actor); see the module docstring.

    >>> pgf = resources_for({"dataset": "rect4", "client_cpus": 0.5}, nodes=[{"CPU": 2.0}])
    >>> pgf.head_bundle_is_empty, pgf.bundles
    (True, [{'CPU': 0.5}, {'CPU': 0.5}, {'CPU': 0.5}])
    """
    plan = trial_resource_plan(trial_run_config(config), nodes)
    return PlacementGroupFactory([{}] + [dict(b) for b in plan.bundles], strategy="PACK")


def plan_from_bundles(cfg: FederatedRunConfig, bundles: list[dict[str, float]]) -> ResourcePlan:
    """The :class:`ResourcePlan` of a placement group laid out by :func:`resources_for` (Tune
    drops the empty head bundle): bundle 0 is the coordinator's when ``cfg`` reserves anything
    for it, every other bundle hosts one client actor.

    >>> cfg = FederatedRunConfig.from_dict({"client_cpus": 0.5})
    >>> p = plan_from_bundles(cfg, [{"CPU": 0.5}, {"CPU": 0.5}])
    >>> p.num_workers, p.coordinator_bundle, p.worker_bundles
    (2, 0, [0, 1])
    """
    own_coordinator = cfg.coordinator_cpus > 0 or cfg.coordinator_gpus > 0
    offset = 1 if own_coordinator else 0
    clients = [dict(b) for b in bundles[offset:]]
    want = {"CPU": float(cfg.client_cpus), "GPU": float(cfg.client_gpus)}
    for b in clients:
        got = {"CPU": float(b.get("CPU", 0.0)), "GPU": float(b.get("GPU", 0.0))}
        if any(abs(got[k] - want[k]) > 1e-9 for k in want):
            raise ConfigError(f"fields 'client_cpus'/'client_gpus': the trial's placement group has client bundle "
                              f"{b}, not {cfg.client_cpus:g} CPU, {cfg.client_gpus:g} GPU; give the trainable its "
                              f"resources with fedtune.tune.trial.trainable.resources_for")
    if not clients:
        raise ConfigError("the trial's placement group has no client bundle; give the trainable its resources "
                          "with fedtune.tune.trial.trainable.resources_for")
    return ResourcePlan(len(clients), [dict(b) for b in bundles], 0, list(range(offset, offset + len(clients))),
                        cfg.client_cpus, cfg.client_gpus, cfg.coordinator_cpus, cfg.coordinator_gpus)


@contextlib.contextmanager
def _driver_cwd() -> Iterator[None]:
    """Run in the directory the Tune driver was started from: Tune changes the trainable's working
    directory to the trial's folder, which would break relative ``data_root``/``pretrained_path``
    (client actors are separate processes: absolute paths are safest on a cluster)."""
    base = os.environ.get("TUNE_ORIG_WORKING_DIR")
    here = os.getcwd()
    if not base or not os.path.isdir(base) or base == here:
        yield
        return
    os.chdir(base)
    try:
        yield
    finally:
        os.chdir(here)


# ------------------------------------------------------------------------------------------------
class FedtuneTrainable(tune.Trainable):
    """A Ray Tune trainable running one federated run, one round per :meth:`step`.

    Use it through :func:`fedtune_trainable` (which attaches :func:`resources_for`); see the
    module docstring for placement, checkpoints and actor reuse. ``self.startup`` holds the
    trainable's own start-up stamps: ``startup_s`` (from entering ``setup``/``reset_config`` to
    the coordinator and every client actor being ready) and ``actors_reused``.
    """

    run: FederatedRun | None = None
    _warning: str | None = None  # a damaged checkpoint, said with the next result
    restored_meta: dict[str, Any] = {}  # ``meta`` of the checkpoint the last restore read
    # Plugin entries (fedtune.plugins) this trainable imports before it reads a trial's config: those
    # of the process that made it (fedtune_trainable), so a trial process registers the same components.
    plugins: tuple[str, ...] = ()

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
        return resources_for(config)

    def setup(self, config: dict[str, Any]) -> None:
        self._begin(config, reuse=False)

    def _begin(self, config: Mapping[str, Any], *, reuse: bool) -> None:
        """Start (or, with ``reuse``, re-configure) the run of ``config`` in this trial's placement group."""
        t0 = time.time()
        load_plugins(self.plugins, source="the trainable's plugins")
        cfg = trial_run_config(config)  # validated from the declarations: no torch import here
        pg = ray.util.get_current_placement_group()
        resources = plan_from_bundles(cfg, pg.bundle_specs) if pg is not None else None
        kept = False
        try:
            with _driver_cwd():
                if reuse and self.run is not None:
                    kept = self.run.reconfigure(cfg, resources)
                else:
                    self.run = FederatedRun(cfg, placement_group=pg, resources=resources)
                    self.run.start()
                info = self.run.describe()  # returns once the coordinator and every client actor are ready
        except BaseException:
            self.cleanup()
            raise
        t_ready = time.time()
        self.cfg = cfg
        self.fedtune_trial_id = cfg.trial_id()
        trial_pg = pg.id.hex() if pg is not None else None
        client_pgs = [c["placement_group_id"] for c in ray.get([h.info.remote() for h in self.run.client_handles()])]
        self.startup = {
            "started_at": t0, "ready_at": t_ready, "startup_s": t_ready - t0, "actors_reused": kept,
            "num_client_actors": info["num_workers"], "placement_group_id": trial_pg,
            # False outside Tune (no trial placement group: the run reserved its own).
            "actors_in_trial_pg": trial_pg is not None and info["placement_group_id"] == trial_pg
            and all(c == trial_pg for c in client_pgs),
        }

    def step(self) -> dict[str, Any]:
        run = self.run
        if run.round >= self.cfg.rounds:
            raise RuntimeError(f"trial {self.fedtune_trial_id} has run all {self.cfg.rounds} rounds")
        result = run.step()
        if getattr(self, "_hp_of", (None,))[0] is not self.cfg:  # once per configuration, not per round
            self._hp_of = (self.cfg, hp_columns(self.cfg))
        row = round_row(self.cfg, run, self.fedtune_trial_id, result, self._hp_of[1])
        out: dict[str, Any] = {k: v for k, v in row.items()
                               if k not in IDENTITY_COLUMNS and not k.startswith("hp.")
                               and isinstance(v, (bool, int, float, str, np.generic))}
        diverged = row["status"] == status.DIVERGED
        done = diverged or row["round"] >= self.cfg.rounds
        out.update({
            "round": row["round"], "status": row["status"],
            "val_acc": float(row.get("val_acc", math.nan)), "target_acc": float(row.get("target_acc", math.nan)),
            # the selection protocols' scores (fedtune.results.selection): NaN where the setting has none
            "target_val_acc": float(row.get("target_val_acc", math.nan)),
            "ood_val_acc": float(row.get("ood_val_acc", math.nan)),
            "val_macro_f1": float(row.get("val_macro_f1", math.nan)),
            "ood_val_macro_f1": float(row.get("ood_val_macro_f1", math.nan)),
            "oracle_acc": float(row.get("oracle_acc", math.nan)),
            "train_loss": float(row["train_loss"]), "server_s": float(row["server_s"]),
            "trial_id": self.fedtune_trial_id, "fedtune_trial_id": self.fedtune_trial_id,
            "algorithm": self.cfg.algorithm, "fedtune_row": row, "training_iteration": row["round"],
            "done": done, "startup_s": self.startup["startup_s"], "actors_reused": self.startup["actors_reused"],
            "actors_in_trial_pg": self.startup["actors_in_trial_pg"],
        })
        if self._warning is not None:  # said on the driver (fedtune.tune.trial.callback.ArrowCallback)
            out["fedtune_warning"], self._warning = self._warning, None
        every = self.cfg.checkpoint_every
        if every and not done and row["round"] % every == 0:
            out["should_checkpoint"] = True
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        try:
            write_checkpoint(checkpoint_dir, self.run.get_state(),
                             {"trial_id": self.fedtune_trial_id, "algorithm": self.cfg.algorithm})
        except TypeError as exc:
            raise TypeError(f"{exc} (client method {self.run.resolved.client_method.name}, server rule "
                            f"{self.run.resolved.server_rule.name}); set checkpoint_every: 0 to run it without "
                            "checkpoints") from None

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        """Load ``checkpoint``; a damaged one (a SIGKILL or a full disk mid-write) falls back to the
        newest readable checkpoint before it, and with none readable the trial starts again from
        round 1 (its rounds come back the same: a run is deterministic). Either way the next
        result's ``fedtune_warning`` names the damaged checkpoints."""
        if isinstance(checkpoint, dict):  # pragma: no cover - we only ever save directories
            raise TypeError("FedtuneTrainable checkpoints are directories written by write_checkpoint")
        state, read, damaged = newest_readable_checkpoint(checkpoint)
        self.restored_meta = dict((state or {}).get("meta") or {})
        if damaged:
            then = (f"it continues from the readable checkpoint '{read}' (round {state['round']})" if state
                    else "no readable checkpoint is left: it starts again from round 1")
            self._warning = f"trial {self.fedtune_trial_id}: {'; '.join(damaged)}; {then}"
        if state is None:
            self._iteration = 0
            return
        self.run.set_state(state)
        self._iteration = int(state["round"])

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Re-use this actor, its placement group and (same layout) its client actors for a new
        trial; see the module docstring. Always True: an error fails the trial instead."""
        self._begin(new_config, reuse=True)
        return True

    def cleanup(self) -> None:
        if self.run is not None:
            try:
                self.run.close()
            finally:
                self.run = None


def with_plugins(cls: type[FedtuneTrainable]) -> type[FedtuneTrainable]:
    """``cls``, or a subclass of it that carries this process's plugin entries (:mod:`fedtune.plugins`:
    every one imported or registered from so far) to the trial processes, which import them first."""
    entries = tuple(loaded_plugin_entries())
    if not entries:
        return cls
    return type(cls.__name__, (cls,), {"plugins": entries, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def fedtune_trainable():
    """:class:`FedtuneTrainable` with its per-trial resources: ``tune.with_resources(FedtuneTrainable,
    resources_for)``, carrying the plugins registered so far (:func:`with_plugins`): call it after
    ``fedtune.register``. Pass it to :class:`ray.tune.Tuner`."""
    return tune.with_resources(with_plugins(FedtuneTrainable), resources_for)
