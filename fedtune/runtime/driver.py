"""One federated run, end to end: plan the data, place the actors, loop the rounds, store results.

>>> from fedtune.config import FederatedRunConfig
>>> cfg = FederatedRunConfig.from_dict({"rounds": 1, "backend": "local", "output": "/tmp/fedtune-doctest",
...                            "local_steps": 1})
>>> result = run(cfg, progress=False)          # doctest: +SKIP
>>> result.status, result.rows[-1]["round"]     # doctest: +SKIP
('completed', 1)
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from fedtune.config import FederatedRunConfig
from fedtune.data.base import FederatedPlan
from fedtune.data.partition import make_plan
from fedtune.data.registry import get_dataset
from fedtune.data.split_file import read_split_file
from fedtune.errors import ConfigError, ResourceError, shown
from fedtune.plugins import parse_model_factory
from fedtune.results.atomic import ResultsWriteError
from fedtune.results.status import COMPLETED, DIVERGED, FAILED, INTERRUPTED, RUNNING
from fedtune.runtime.cluster import cluster_nodes, cluster_view, connect_ray
from fedtune.runtime.coordinator import LOSS_EXPLOSION_FACTOR, Coordinator
from fedtune.runtime.placement import check_placement
from fedtune.runtime.actor_factory import ActorFactory
from fedtune.runtime.progress import RunProgress
from fedtune.runtime.remote_errors import ray_get
from fedtune.runtime.resources import ResourcePlan, resource_plan_of
from fedtune.runtime.run_notes import print_run_notes
from fedtune.runtime.signals import SigtermSeen, Terminated, sigterm_as_interrupt


def build_plan(cfg: FederatedRunConfig) -> FederatedPlan:
    """The data partition of a run, from labels only (no pixels decoded, no torch), after checking
    that the algorithm runs in the setting (from the components' declarations)."""
    dataset = get_dataset(cfg.dataset, root=cfg.data_root, image_size=cfg.image_size, data_seed=cfg.data_seed)
    info = dataset.info
    setting = cfg.setting or info.default_setting
    resolved = cfg.resolved
    if setting not in resolved.settings:
        raise ConfigError(
            f"field 'setting': algorithm '{cfg.algorithm}' (client method {resolved.client_method_name}, server rule "
            f"{resolved.server_rule_name}) does not run in setting '{setting}'; allowed: {', '.join(resolved.settings)}")
    model = cfg.model or info.default_model
    factory = parse_model_factory(model) is not None  # your own model: checked on the dataset's input below
    if model != "mlp" and not factory and not info.is_image:
        raise ConfigError(f"field 'model': '{model}' needs image input but dataset '{cfg.dataset}' gives vectors of "
                          f"shape {info.input_shape}; allowed here: mlp")
    if resolved.client_spec.needs_images and not info.is_image:
        raise ConfigError(f"field 'client_method': {resolved.client_method_name} needs images (C, H, W) but dataset "
                          f"'{cfg.dataset}' gives vectors of shape {info.input_shape}; use an image dataset")

    check_placement(cfg)
    if cfg.pretrained_path:
        # lazy: keeps torch out of this module's import
        from fedtune.weight_files import check_pretrained_file

        check_pretrained_file(cfg.pretrained_path)
    if model not in ("cnn", "mlp"):  # a torchvision or factory model: one forward on the meta device, before launch
        # lazy: keeps torch out of this module's import
        from fedtune.model_check import check_model_runs

        spec = resolved.client_spec
        check_model_runs(model, info.input_shape, info.num_classes, spec.head(cfg), weights=cfg.weights,
                         pretrained_path=cfg.pretrained_path, method=spec.name, reads_features=spec.reads_features)
    labels = {d: dataset.labels(d) for d in info.domains}
    split = None
    if cfg.split_scheme is not None and hasattr(dataset, "split_pieces"):  # a WILDS dataset's own splits
        split = dataset.split_pieces(cfg.split_scheme)
    elif cfg.split_scheme is not None:
        split = read_split_file(dataset.root, cfg.split_scheme, info.domains,
                                {d: dataset.files(d) for d in info.domains})
    return make_plan(info, labels, setting=setting, target_domain=cfg.target_domain,
                     clients_per_domain=cfg.clients_per_domain, num_clients=cfg.num_clients,
                     dirichlet_alpha=cfg.dirichlet_alpha, participation=cfg.participation,
                     target_fraction=cfg.target_fraction, val_fraction=cfg.val_fraction,
                     test_fraction=cfg.test_fraction, probe_fraction=cfg.probe_fraction, seed=cfg.seed,
                     oracle_fraction=cfg.oracle_fraction, data_seed=cfg.data_seed,
                     domain_homogeneity=cfg.domain_homogeneity,
                     domain_homogeneity_rounding=cfg.domain_homogeneity_rounding,
                     split=split, split_scheme=cfg.split_scheme)


class FederatedRun:
    """A run that can be stepped round by round (``fedtune run`` and Tune trials use this).

    ``backend="local"`` runs everything in this process. ``backend="ray"`` needs Ray to be
    initialised; it reserves a placement group (or uses ``placement_group`` with bundles laid
    out as :func:`~fedtune.runtime.resources.resource_plan_of` says) and creates the coordinator
    and every client actor in it.
    """

    def __init__(self, cfg: FederatedRunConfig, *, placement_group=None, resources: ResourcePlan | None = None):
        self.cfg = cfg
        self.plan = build_plan(cfg)
        self.resolved = cfg.resolved
        self.setting = self.plan.setting
        self.resources = resources
        self._pg = placement_group
        self._own_pg = placement_group is None
        self.coordinator = None
        self.round = 0

    # ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.cfg.backend == "local":
            self.coordinator = Coordinator(self.cfg.to_dict(), self.plan, {"kind": "local"})
            self._call = lambda name, *a: getattr(self.coordinator, name)(*a)
            return
        # lazy: keeps ray out of this module's import
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            raise RuntimeError("backend 'ray' needs a connected Ray (fedtune.runtime.cluster.connect_ray); "
                               "fedtune never calls ray.init inside a trial")
        if self.resources is None:
            self.resources = resource_plan_of(self.cfg, self.plan.num_clients, cluster_nodes())
        res = self.resources
        if self._pg is None:
            self._pg = placement_group(res.bundles, strategy="PACK", name="")
            if not self._pg.wait(self.cfg.placement_timeout_s):
                remove_placement_group(self._pg)
                self._pg = None
                raise ResourceError(
                    f"the cluster could not reserve {res.total} for this run within placement_timeout_s="
                    f"{self.cfg.placement_timeout_s:g}s (available now: {_avail()}); other work holds the resources"
                    + ("" if not cluster_view().launchable else ", or the autoscaler has not added the nodes yet "
                       "(raise placement_timeout_s to wait for it)"))
        cfg_dict = self.cfg.to_dict()
        factory = ActorFactory.of(cfg_dict, self.plan, self._pg, res)
        # Client actors start first and together (each imports torch); the NumPy-only coordinator
        # starts beside them and waits for worker 0's initial weights.
        actors = [factory(w) for w in range(res.num_workers)]
        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=res.coordinator_bundle,
                                                    placement_group_capture_child_tasks=True)
        coord_cls = ray.remote(max_restarts=0)(Coordinator)
        self.coordinator = coord_cls.options(num_cpus=res.coordinator_cpus, num_gpus=res.coordinator_gpus,
                                             scheduling_strategy=strategy).remote(
            cfg_dict, self.plan, factory.pool_spec(actors))
        self._call = lambda name, *a: ray_get(getattr(self.coordinator, name).remote(*a))

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    def client_handles(self) -> list:
        return self._call("client_handles")

    def step(self):
        """Run the next round; returns the coordinator's :class:`RoundResult`.

        The new model is evaluated every ``eval_every`` rounds and on the last round."""
        self.round += 1
        evaluate = self.round % self.cfg.eval_every == 0 or self.round >= self.cfg.rounds
        return self._call("run_round", self.round, evaluate)

    # --- Tune support: checkpoints and actor reuse (fedtune.tune.trial.trainable) -----------------------
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue after round ``self.round`` with the same results: the
        coordinator's state (weights, server-rule state, the client method's server-side state) and every client's
        persistent ``ctx.state``. Sampling and seeds derive from (seed, round): no RNG state."""
        state = dict(self._call("get_state"))
        state["round"] = self.round
        if self.cfg.backend == "ray":
            import ray  # lazy: keeps ray out of this module's import

            parts = ray.get([h.get_client_state.remote() for h in self.client_handles()])
        else:
            parts = [self.coordinator.pool.worker.get_client_state()]
        state["clients"] = {cid: s for part in parts for cid, s in part.items()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Load :meth:`get_state`'s output into this started run; the next :meth:`step` runs
        round ``state["round"] + 1``."""
        self._call("set_state", {k: state.get(k) for k in ("weights", "rule", "side", "optimizer",
                                                            "first_loss", "identity", "tuner")})
        clients = state.get("clients") or {}
        if self.cfg.backend == "ray":
            import ray  # lazy: keeps ray out of this module's import

            ray.get([h.set_client_state.remote(clients) for h in self.client_handles()])
        else:
            self.coordinator.pool.worker.set_client_state(clients)
        self.round = int(state["round"])

    def reconfigure(self, cfg: FederatedRunConfig, resources: ResourcePlan | None = None) -> bool:
        """Turn this started run into a fresh run of ``cfg`` (Tune ``reuse_actors``).

        ``resources`` is the new run's layout: by default, in a placement group given to this run,
        the current one; in a group of its own, the plan for ``cfg`` on the cluster. With the Ray
        backend and the same layout as now, the placement group, the coordinator and every client
        actor are kept and re-configured in place (:meth:`ClientWorker.reconfigure`,
        :meth:`Coordinator.reconfigure`): no process starts, so no torch import. Otherwise the
        run's actors are closed and started again (inside the same placement group when it was
        given). Returns True when the actors were kept. Either way the run then computes exactly
        what a fresh ``FederatedRun(cfg)`` would.
        """

        plan = build_plan(cfg)
        if resources is None:
            if not self._own_pg:
                resources = self.resources
            elif cfg.backend == "ray" and self.coordinator is not None:
                resources = resource_plan_of(cfg, plan.num_clients, cluster_nodes())
        keep = (cfg.backend == "ray" and self.cfg.backend == "ray" and self.coordinator is not None
                and resources is not None and resources == self.resources)
        if keep:
            # lazy: keeps ray out of this module's import
            import ray
            from ray.exceptions import RayActorError

            cfg_dict = cfg.to_dict()
            factory = ActorFactory.of(cfg_dict, plan, self._pg, self.resources)
            try:
                actors = self.client_handles()  # the live ones (a restarted actor has a new handle)
                bank = plan.source_train_pieces()
                ray.get([a.reconfigure.remote(cfg_dict, [plan.clients[c] for c in factory.held(w)], w,
                                              factory.shards[w], source_bank=bank, owned=factory.assignment[w])
                         for w, a in enumerate(actors)])
                ray.get(self.coordinator.reconfigure.remote(cfg_dict, plan, factory.pool_spec(actors)))
            except RayActorError:
                keep = False  # an actor died meanwhile: start over below
        if keep:
            self.cfg, self.plan, self.resolved = cfg, plan, cfg.resolved
            self.setting, self.round = plan.setting, 0
            return True
        pg, own = self._pg, self._own_pg
        self.close()
        self.__init__(cfg, placement_group=None if own else pg, resources=resources)
        self.start()
        return False

    def close(self) -> None:
        if self.coordinator is not None:
            try:
                self._call("shutdown")
            except Exception:  # the coordinator may be gone already
                pass
            if self.cfg.backend == "ray":
                import ray  # lazy: keeps ray out of this module's import

                ray.kill(self.coordinator, no_restart=True)
            self.coordinator = None
        if self._own_pg and self._pg is not None:
            # lazy: keeps ray out of this module's import
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None

    def __enter__(self) -> "FederatedRun":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _avail() -> str:
    import ray  # lazy: keeps ray out of this module's import

    a = ray.available_resources()
    return ", ".join(f"{a.get(k, 0):g} {k}" for k in ("CPU", "GPU"))


# ------------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    trial_id: str
    status: str  # COMPLETED | DIVERGED | FAILED | INTERRUPTED (fedtune.results.status)
    rows: list[dict[str, Any]]
    study_dir: Path
    rounds_path: Path
    error: str | None = None
    time_to_first_round_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


def round_row(cfg: FederatedRunConfig, run: FederatedRun, trial_id: str, result,
              hp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One row of the rounds table: identity, metrics, hyperparameters (``hp``: :func:`hp_columns`
    of ``cfg``, given once a run by a caller that writes many rows), status."""
    row: dict[str, Any] = {
        "study": cfg.name, "trial_id": trial_id, "algorithm": cfg.algorithm,
        "client_method": run.resolved.client_method_name, "server_rule": run.resolved.server_rule_name,
        "dataset": cfg.dataset, "setting": run.setting,
        "target_domain": ",".join(run.plan.target_domains) or None, "seed": cfg.seed,
        "round": result.round, "status": result.status,
    }
    if cfg.split_scheme is not None:  # the WILDS protocol's trials: the report gives them their own column
        row["split_scheme"] = cfg.split_scheme
    row.update(result.metrics)
    row.update(hp_columns(cfg) if hp is None else hp)
    return row


def hp_columns(cfg: FederatedRunConfig) -> dict[str, Any]:
    """The ``hp.<name>`` columns of ``cfg``'s rows (:meth:`FederatedRunConfig.hyperparameters`)."""
    return {f"hp.{k}": v for k, v in cfg.hyperparameters().items()}


def diverged_error(round: int) -> str:
    """The trial row's ``error`` of a run that diverged in ``round``."""
    return (f"non-finite loss or weights, or a loss over {LOSS_EXPLOSION_FACTOR:g} times the first round's, "
            f"in round {round}")


def config_of(cfg: FederatedRunConfig | Mapping[str, Any], where: str = "fedtune.run") -> FederatedRunConfig:
    """``cfg`` as a run's config: a :class:`FederatedRunConfig` as it is; a mapping of field: value
    (what a config file, ``--set`` and a Tune trial's config hold) built and validated by
    :meth:`FederatedRunConfig.from_dict`; anything else one line saying what is accepted.

    >>> config_of({"rounds": 2}).rounds
    2
    """
    if isinstance(cfg, FederatedRunConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return FederatedRunConfig.from_dict(dict(cfg), source=where)
    raise ConfigError(f"{where}: expected a FederatedRunConfig or a mapping of field: value, got "
                      f"{type(cfg).__name__} {shown(cfg, 60)}; allowed: {where}(FederatedRunConfig.from_yaml(path)) "
                      f"for a config file, or {where}({{'rounds': 3, ...}})")


def run(cfg: FederatedRunConfig | Mapping[str, Any], *, progress: bool = True, verbose: bool = False,
        on_round: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Run ``cfg`` to the end (or divergence), writing every round to the results store.

    ``cfg``: a :class:`FederatedRunConfig`, or a mapping of field: value, validated as a config
    file is (:func:`config_of`: ``fedtune.run({"rounds": 3, "local_lr": 0.1})``).

    An output folder that cannot be written is refused before anything starts (ConfigError). A
    write the disk refuses (full, permissions) ends the run with the trial row written when it
    fits (status ``failed``, its rounds those on disk) and raises a
    :class:`~fedtune.results.atomic.ResultsWriteError` whose one line names the file and where the
    finished rounds are."""
    # lazy: keeps pyarrow out of this module's import
    from fedtune.results.store import ResultsStore, check_output_dir

    cfg = config_of(cfg)
    t_start = time.perf_counter()
    started_at = datetime.now(timezone.utc)
    trial_id = cfg.trial_id()
    rows: list[dict[str, Any]] = []
    written = 0  # rows[:written] are on disk
    status, error = FAILED, None
    started_ray = False
    bar = RunProgress(cfg, enabled=progress)
    first_round_s = None
    info: dict[str, Any] = {}
    # Bad input (unknown names, missing data, impossible setting, an output folder that cannot be
    # written) raises here, before anything starts and before anything is written.
    check_output_dir(cfg.output, "field 'output' (--output)", study=cfg.name)
    store = ResultsStore(cfg.output, cfg.name)
    fr = FederatedRun(cfg)
    print_run_notes(cfg)  # the augmentation that runs; the image cache reused or decoded
    signals = contextlib.ExitStack()
    sigterm: SigtermSeen | None = None
    failure: BaseException | None = None
    try:
        if cfg.backend == "ray":
            started_ray = connect_ray(cfg, verbose=verbose)
        # After ray.init (which installs a SIGTERM -> sys.exit handler): SIGTERM ends the run as
        # "interrupted", with its trial row written, like Ctrl-C.
        sigterm = signals.enter_context(sigterm_as_interrupt())
        startup = {"ray_init_s": time.perf_counter() - t_start}
        fr.start()
        info = fr.describe()  # returns once the coordinator and every client actor are ready
        startup["actors_ready_s"] = time.perf_counter() - t_start
        info.update(startup)
        bar.start(fr, info)
        status = RUNNING
        hp = hp_columns(cfg)  # once a run, not every round (0.07 ms)
        for _ in range(cfg.rounds):
            result = fr.step()
            row = round_row(cfg, fr, trial_id, result, hp)
            rows.append(row)
            if first_round_s is None:
                first_round_s = time.perf_counter() - t_start
            store.write_rounds(trial_id, rows)
            written = len(rows)
            bar.update(row)
            if on_round is not None:
                on_round(row)
            if result.status == DIVERGED:
                status, error = DIVERGED, diverged_error(result.round)
                break
        if status == RUNNING:
            status = COMPLETED
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, SIGTERM (also Ray's sys.exit on SIGTERM)
        status = INTERRUPTED
        # A SIGTERM inside a blocking ray.get comes back from Ray as a plain KeyboardInterrupt.
        by_sigterm = isinstance(exc, (Terminated, SystemExit)) or (sigterm is not None and sigterm.received)
        error = "interrupted by SIGTERM" if by_sigterm else "interrupted by the user"
        failure = exc
    except BaseException as exc:
        status, error = FAILED, f"{type(exc).__name__}: {exc}"
        failure = exc
    finally:
        signals.close()
        bar.stop()
        try:
            fr.close()
        except Exception:
            pass
        if started_ray:
            import ray  # lazy: keeps ray out of this module's import

            ray.shutdown()
    _end_run(cfg, store, trial_id, rows[:written], status, error, started_at, failure)
    return RunResult(trial_id, status, rows, store.study_dir, store.rounds_dir / f"{trial_id}.parquet",
                     error, first_round_s, info)

def _end_run(cfg: FederatedRunConfig, store: Any, trial_id: str, rows: list[dict[str, Any]], status: str,
             error: str | None, started_at: datetime, failure: BaseException | None) -> None:
    """After a run: write its trial row from the ``rows`` on disk (not for a refused launch, which
    ran nothing), then raise what ended it, a refused write first as one line naming what was
    kept; return when it ended normally."""
    from fedtune.results.summary import summarize_trial  # lazy: keeps pyarrow out of this module's import

    written = len(rows)
    row_failure: ResultsWriteError | None = None
    refused = isinstance(failure, ResourceError) and not isinstance(failure, ResultsWriteError)
    if not refused:  # a refused launch ran nothing: no trial row
        cfg_json = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
        summary = summarize_trial(rows, config=json.loads(cfg_json), status=status, error=error,
                                  started_at=started_at, ended_at=datetime.now(timezone.utc))
        summary.update({"study": cfg.name, "trial_id": trial_id, "algorithm": cfg.algorithm,
                        "dataset": cfg.dataset, "seed": cfg.seed})
        try:
            store.write_trial(summary)
        except ResultsWriteError as exc:
            row_failure = exc
        except Exception as exc:  # e.g. a trials.parquet that is not fedtune's: the run's own error comes first
            if failure is None:
                raise
            failure.add_note(f"the trial row could not be written: {exc}")
    storage = failure if isinstance(failure, ResultsWriteError) else row_failure
    if storage is not None and (failure is None or failure is storage):
        raise storage.with_context(_kept(store, trial_id, written, row_failure, storage)) from None
    if failure is not None:
        if row_failure is not None:
            failure.add_note(f"the trial row could not be written: {row_failure}")
        raise failure


def _kept(store: Any, trial_id: str, written: int, row_failure: BaseException | None,
          failure: BaseException) -> str:
    """What a run stopped by a refused write left, for its one-line error."""
    rounds_file = store.rounds_path(trial_id)
    if written == 0:
        kept = f"no round is stored ({rounds_file} was not written)"
    else:
        which = "round 1" if written == 1 else f"rounds 1-{written}"
        kept = f"finished rounds are intact in '{rounds_file}' ({which})"
    if row_failure is None:
        row = f"its row in '{store.trials_path}' says status failed"
    elif row_failure is failure:
        row = "the trial row was not written"
    else:
        row = "the trial row could not be written either"
    return (f"{kept}; {row}; free space (or make the folder writable), then run the same command again "
            "(it replaces this trial's rows)")
