"""``fedtune sweep``'s options (:class:`SweepOptions`), their allowed values and their checks.

Each bounded option declares its allowed values once, as a :class:`~fedtune.bounds.Bounds` in its
field's metadata (the same declaration as a run field of
:class:`~fedtune.config.FederatedRunConfig` and a component's
:class:`~fedtune.algorithms.base.HParam`), so ``--num-samples 0`` reads like ``--set rounds=0``.
Checks across options (the metrics against the selection protocol, the storages) follow.
No Ray, no Optuna.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from fedtune.algorithms import in_run_tuner_spec
from fedtune.algorithms import own_knobs
from fedtune.bounds import Bounds
from fedtune.config import ROLES
from fedtune.errors import ConfigError, shown
from fedtune.results import selection as _protocol
from fedtune.results.optuna_url import check_optuna_storage
from fedtune.results.study_dir import NAME_RULE, name_problem
from fedtune.tune.common.searches import SAMPLERS
from fedtune.tune.tuner.storage import check_storage_path, local_storage_dir

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

SCHEDULERS = ("fifo", "asha", "hyperband", "pbt", "pb2")
POPULATION_SCHEDULERS = ("pbt", "pb2")  # Ray Tune's population-based training: a population, no searcher
KNOBS = ("all", "own")
"""``--knobs``: ``all`` searches every parameter; ``own`` each algorithm's own (:func:`fedtune.algorithms.own_knobs`),
every shared one fixed at one value for every method (:func:`fedtune.tune.study.study_start.own_knob_spaces`)."""
LOGGERS: dict[str, tuple[str, str] | None] = {"csv": None, "tensorboard": ("tensorboardX", "tensorboard"),
                                              "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
"""``--logger`` names (:mod:`fedtune.tune.trial.loggers`): the module each needs and fedtune's pip extra
that installs it (csv needs nothing more than Ray Tune)."""
SELECTIONS = _protocol.PROTOCOLS
SEED_MAX = 2**32 - 1
"""The largest seed NumPy's generators (and so Optuna's samplers and Tune's random search) take."""

METRICS: dict[str, str] = {
    "val_acc": "max", "val_loss": "min", "target_val_acc": "max", "target_val_loss": "min",
    "ood_val_acc": "max", "ood_val_loss": "min", "val_macro_f1": "max", "ood_val_macro_f1": "max", "oracle_acc": "max", "oracle_loss": "min", "train_loss": "min",
    "server_s": "min", "client_s": "min", "wall_s": "min", "bytes_moved": "min",
}
"""Metrics a study may optimise, with their direction. The first (selection) metric is the
protocol's score or loss (:data:`fedtune.results.selection.SCORE` / ``LOSS``): ``val_acc``/``val_loss``
(``val``), ``target_val_acc``/``target_val_loss`` (``target-val``), ``ood_val_acc``/``ood_val_loss``
(``ood-val``, a split file's), ``val_macro_f1``/``val_loss`` (``val-f1``), ``ood_val_macro_f1``/``ood_val_loss``
(``ood-val-f1``), ``oracle_acc``/``oracle_loss``
(``oracle``); further objectives (multi-objective) may be any cost metric. ``target_acc`` is
what is reported and never an objective."""

_SELECTION_METRICS = {p: (_protocol.SCORE[p], _protocol.LOSS[p]) for p in _protocol.PROTOCOLS}
_COST_METRICS = ("train_loss", "server_s", "client_s", "wall_s", "bytes_moved")
_REPORTED = ("target_acc", "target_loss")


SCHEDULER_NAMES = {"asha": "ASHA", "hyperband": "HyperBand", "pbt": "PBT", "pb2": "PB2"}
RUNG_SCHEDULERS = ("asha", "hyperband")  # the schedulers with rungs: --grace-period, --reduction-factor


def _opt(default: Any, flag: str, *, kind: type | None = None, lo: float | None = None, lo_open: bool = False,
         hi: float | None = None, choices: Sequence[str] = (), note: str = "", factory: Any = None,
         schedulers: Sequence[str] = (), resume_fixed: bool = False, dest: str | None = None) -> Any:
    """An option: its default, its ``--flag``, and (when bounded) its type and allowed values;
    ``schedulers``: the only ``--scheduler`` values that read it (another value than its default
    is refused with any other scheduler); ``resume_fixed``: :func:`_kept`'s."""
    meta = {"flag": flag, "kind": kind,
            "bounds": Bounds(lo=lo, lo_open=lo_open, hi=hi, choices=tuple(choices), note=note),
            "schedulers": tuple(schedulers), "resume_fixed": resume_fixed, "dest": dest}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _kept(default: Any = None, *, factory: Any = None, dest: str | None = None) -> Any:
    """An option a study keeps from its start (``resume_fixed``): given with ``--resume`` at another
    value than the saved one, it is refused (:data:`fedtune.tune.study.resume.RESUME_FIXED`);
    ``dest``: its command-line dest where that is not the attribute's name. The options that are run
    fields (``--dataset``, ...) say so at the run field (:mod:`fedtune.config_roles`)."""
    meta = {"resume_fixed": True, "dest": dest}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def resume_fixed_dests() -> dict[str, tuple[str, ...]]:
    """The ``fedtune sweep`` options a study keeps from its start, in :class:`SweepOptions`' order:
    command-line dest -> the attributes that hold it. Those declared ``resume_fixed`` here, and the
    options of the run fields declared ``resume_fixed`` (:data:`fedtune.config.ROLES`)."""
    from_run = {ROLES.sweep_options[k] for k in ROLES.resume_fixed}
    return {f.metadata.get("dest") or f.name: (f.name,) for f in fields(SweepOptions)
            if f.metadata.get("resume_fixed") or f.name in from_run}


@dataclass
class SweepOptions:
    """Everything ``fedtune sweep`` takes (the CLI flags, one to one).

    ``target_domain``: a domain, ``"all"`` (leave-one-domain-out over every domain) or None
    (the dataset's default target). ``metric``: the objective metric(s), first = selection
    metric; None = ``val_acc`` (``target_acc`` under oracle), plus ``server_s`` with nsga2.
    ``overrides``: ``--set`` fields, applied to every trial (a field the space samples is an
    error). ``max_concurrent``: None = as many as the cluster fits.

    >>> SweepOptions(algorithms=["fedavg"]).metrics()
    ['val_acc']
    >>> SweepOptions(sampler="nsga2", selection="oracle").metrics()
    ['oracle_acc', 'server_s']
    >>> SweepOptions(metric=["target_val_acc"]).protocol()
    'target-val'
    >>> SweepOptions(num_samples=0).validate()
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--num-samples': 0 is out of range; allowed: >= 1
    """

    spaces: list[str] = _kept(factory=list)
    algorithms: list[str] = field(default_factory=list)
    dataset: str | None = None
    data_root: str | None = None
    target_domain: str | None = None
    rounds: int | None = _opt(None, "rounds", kind=int, lo=1)
    num_samples: int = _opt(8, "num-samples", kind=int, lo=1, resume_fixed=True)
    seeds: int = _opt(1, "seeds", kind=int, lo=1, resume_fixed=True)
    max_concurrent: int | None = _opt(None, "max-concurrent", kind=int, lo=1, resume_fixed=True)
    scheduler: str = _opt("fifo", "scheduler", choices=SCHEDULERS, resume_fixed=True)
    sampler: str = _opt("tpe", "sampler", choices=SAMPLERS, resume_fixed=True)
    metric: list[str] | None = _kept()
    selection: str | None = _kept()  # None: the protocol of --metric's first metric, else val
    trial_seeds: int = _opt(1, "trial-seeds", kind=int, lo=1, resume_fixed=True)
    address: str | None = None
    output: str = "fedtune_results"
    name: str | None = None
    verbose: bool = False
    overrides: dict[str, Any] = _kept(factory=dict, dest="set")
    # --sampler-seed: the Optuna samplers' (NumPy's) seed, plus each --trial-seeds replicate's index
    sampler_seed: int = _opt(0, "sampler-seed", kind=int, lo=0, hi=SEED_MAX, note="NumPy's seed range",
                             resume_fixed=True)
    grace_period: int = _opt(1, "grace-period", kind=int, lo=1, schedulers=RUNG_SCHEDULERS, resume_fixed=True)
    reduction_factor: float = _opt(2.0, "reduction-factor", kind=float, lo=1, lo_open=True, schedulers=RUNG_SCHEDULERS,
                                   resume_fixed=True)
    # --perturbation-interval N: PBT/PB2 exploit and explore every N rounds (None: a quarter of the rounds)
    perturbation_interval: int | None = _opt(None, "perturbation-interval", kind=int, lo=1,
                                             schedulers=POPULATION_SCHEDULERS, resume_fixed=True)
    # --client-fidelity P: ASHA's rungs raise the participation too (from P, x reduction factor per rung)
    client_fidelity: float | None = _opt(None, "client-fidelity", kind=float, lo=0, lo_open=True,
                                         note="the first rung's participation, at most 1", resume_fixed=True)
    report: bool = True
    # --max-failures: restarts of a failed trial (from its last checkpoint); -1: unlimited
    max_failures: int = _opt(0, "max-failures", kind=int, lo=-1, note="restarts of a failed trial; -1: unlimited",
                             resume_fixed=True)
    storage_path: str | None = _kept()  # --storage-path: Tune's storage (shared dir or URI); None: <study>/tune
    # --scale-up-timeout: how long trials may wait for the autoscaler
    scale_up_timeout_s: float = _opt(900.0, "scale-up-timeout", kind=float, lo=0, lo_open=True, note="seconds",
                                     resume_fixed=True, dest="scale_up_timeout")
    optuna_storage: str | None = _kept()  # --optuna-storage: a shared Optuna storage URL (fedtune.results.optuna_url)
    loggers: tuple[str, ...] = _kept(())  # --logger: Ray Tune logger callbacks (csv, tensorboard, mlflow, wandb)
    config: str | None = None  # --config FILE.yaml: where config_fields came from (messages, study.json)
    config_fields: dict[str, Any] = _kept(factory=dict, dest="config")  # its run fields; overrides (--set) win
    # --knobs: None/"all": every parameter; "own": each algorithm's own, shared ones fixed
    knobs: str | None = _opt(None, "knobs", choices=KNOBS, resume_fixed=True)

    def metrics(self) -> list[str]:
        """The objective metrics, first = the selection metric."""
        if self.metric:
            return list(self.metric)
        first = _protocol.SCORE.get(self.protocol(), "val_acc")
        return [first, "server_s"] if self.sampler == "nsga2" else [first]

    def protocol(self) -> str:
        """The selection protocol: ``selection``, else the one ``--metric``'s first metric belongs
        to, else ``val``."""
        if self.selection is not None:
            return self.selection
        if self.metric:
            return _protocol.protocol_of_metric(self.metric[0]) or _protocol.DEFAULT
        return _protocol.DEFAULT

    def modes(self) -> list[str]:
        """``max``/``min`` per objective metric."""
        return [METRICS[m] for m in self.metrics()]

    def validate(self, *, started: bool = False) -> None:
        """Raise ConfigError naming the option and the allowed values: each bounded option, then
        the objective metrics against the selection protocol, then the sampler, the scheduler's
        options against the scheduler and the rounds, storages and names. ``started``: the
        options of a study that has started (``--resume``): a scheduler option it started with
        that has no effect is not refused then, so the study continues as it ran."""
        self._check_bounded()
        self._check_metrics()
        self._check_sampler()
        self._check_scheduler()
        if not started:
            self.check_scheduler_options()
            self._check_last_round()
        self._check_fidelity()
        self._check_places()

    def check_scheduler_options(self, given: Sequence[str] = ()) -> None:
        """Refuse an option of another scheduler (declared ``schedulers``), given (``given``: the
        command line's flags, by field name) or set to another value than its default."""
        for f in fields(self):
            readers = f.metadata.get("schedulers")
            if readers and self.scheduler not in readers and (f.name in given or getattr(self, f.name) != f.default):
                owners = " and ".join(f"{SCHEDULER_NAMES[r]}'s" for r in readers)
                raise ConfigError(f"option '--{f.metadata['flag']}': {owners}; allowed with --scheduler "
                                  f"{' or '.join(readers)}, not {self.scheduler}")

    def _check_last_round(self) -> None:
        """A scheduler whose first rung or first perturbation comes no earlier than the last round
        (it would stop or perturb nothing) is refused, with the numbers."""
        # lazy: keeps numpy out of this module's import
        from fedtune.config import FederatedRunConfig

        rounds = int(self.rounds or FederatedRunConfig.rounds)
        said = f"--rounds {rounds}" if self.rounds else f"rounds {rounds}, the default"
        name = SCHEDULER_NAMES.get(self.scheduler)
        if self.scheduler in RUNG_SCHEDULERS and self.grace_period >= rounds:
            allowed = f"1 to {rounds - 1}" if rounds > 1 else f"--rounds >= 2 with --scheduler {self.scheduler}"
            raise ConfigError(f"option '--grace-period': {self.grace_period} is not before the last round ({said}): "
                              f"{name}'s first rung would stop no trial early; allowed: {allowed}")
        if self.scheduler in POPULATION_SCHEDULERS and self.population_interval(rounds) >= rounds:
            if self.perturbation_interval is None:  # only at 1 round: a quarter of it is 1
                raise ConfigError(f"option '--rounds': {rounds} round ({said}) leaves {name} no round to exploit or "
                                  f"explore in; allowed: --rounds >= 2 with --scheduler {self.scheduler}")
            allowed = f"1 to {rounds - 1}" if rounds > 1 else f"--rounds >= 2 with --scheduler {self.scheduler}"
            raise ConfigError(f"option '--perturbation-interval': {self.perturbation_interval} is not before the last "
                              f"round ({said}): {name} would never exploit or explore; allowed: {allowed}")

    def check_run(self, cfg: FederatedRunConfig, spaces: Sequence[Any] = ()) -> None:
        """The options against the run every trial shares (``cfg``, a
        :class:`~fedtune.config.FederatedRunConfig` of the ``--set``/``--config`` fields) and the
        search ``spaces``: ``--target-domain`` has no effect under a ``split_scheme``; PBT and PB2
        refuse an in-run tuner (FedEx) when they explore one of its knobs (:meth:`explored`). A
        member restarts from the donor's checkpoint with the donor's knobs, explored; FedEx's
        configurations are built from the member's own values of ``fedex_knobs`` (configuration 0
        is them), so an explored FedEx knob leaves the donor's FedEx state describing other
        configurations (the restore is refused). With every FedEx knob fixed (``--knobs own`` fixes
        the shared ones) the member continues the donor's FedEx exactly."""
        if self.target_domain is not None and cfg.split_scheme is not None:
            raise ConfigError(f"option '--target-domain': {shown(self.target_domain, 60)} has no effect with "
                              f"split_scheme {cfg.split_scheme!r}, whose split file names the test domains (its "
                              "'test' rows); allowed: leave --target-domain out")
        tuner = in_run_tuner_spec(cfg) if self.scheduler in POPULATION_SCHEDULERS else None
        if tuner is None:
            return
        for space in spaces:
            clash = [k for k in tuner.tuned_knobs(cfg) if k in self.explored(space)]
            if clash:
                t, on = tuner.title, f"{tuner.switch} {getattr(cfg, tuner.switch)}"
                raise ConfigError(f"option '--scheduler': {self.scheduler} explores {clash[0]} (sampled by search "
                                  f"space '{space.source}'), a knob {t} ({on}) builds its configurations from, so a "
                                  f"member restored from another's checkpoint would hold a {t} state of other "
                                  f"configurations; allowed: {clash[0]} fixed (a space that fixes it, or --knobs own "
                                  f"for a shared knob), {tuner.knobs} without it, {tuner.switch} 0, or --scheduler "
                                  "fifo, asha or hyperband")

    def explored(self, space: Any) -> set[str]:
        """The parameters of ``space`` a PBT/PB2 member may take changed at an exploit: the sampled
        unconditional ones (conditional ones follow the donor), with ``--knobs own`` only the
        algorithm's own (the shared ones are fixed for every member)."""
        own = None
        if self.knobs == "own":
            own = set(own_knobs(space.algorithm))
        return {n for n, p in space.params.items() if p.sampled and not p.when and (own is None or n in own)}

    def _check_bounded(self) -> None:
        for f in fields(self):
            bounds = f.metadata.get("bounds")
            value = getattr(self, f.name)
            if bounds is None or value is None:
                continue
            where, kind = f"option '--{f.metadata['flag']}'", f.metadata["kind"]
            if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{where}: expected an integer, got {shown(value)}")
            if kind is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ConfigError(f"{where}: expected a number, got {shown(value)}")
            bounds.check(where, value)
        Bounds(choices=SELECTIONS).check("option '--selection'", self.protocol())
        if self.sampler_seed + self.trial_seeds - 1 > SEED_MAX:  # replicate k samples with sampler_seed + k
            raise ConfigError(f"option '--sampler-seed': {self.sampler_seed} with --trial-seeds {self.trial_seeds} "
                              f"seeds the last search's sampler with {self.sampler_seed + self.trial_seeds - 1}; "
                              f"allowed: --sampler-seed + --trial-seeds - 1 <= {SEED_MAX} (NumPy's seed range)")
        if self.seeds > 1 and self.trial_seeds > 1:
            raise ConfigError(f"options '--seeds {self.seeds}' and '--trial-seeds {self.trial_seeds}' cannot be "
                              "combined; allowed: --trial-seeds K (K whole searches: ± includes selection variance) "
                              "or --seeds K (K re-runs of each selected configuration)")

    def _check_metrics(self) -> None:
        metrics = self.metrics()
        for m in metrics:
            if m in _REPORTED and m == metrics[0]:
                raise ConfigError(f"option '--metric': '{m}' is the reported target accuracy and never chooses "
                                  "(honest selection never chooses by the target domain's reported examples); "
                                  f"allowed first metrics: {', '.join(v for p in SELECTIONS for v in _SELECTION_METRICS[p])} "
                                  "(--selection oracle chooses by a held-out slice of the target: oracle_acc)")
            if m not in _REPORTED:
                Bounds(choices=tuple(METRICS)).check("option '--metric'", m)
        if len(set(metrics)) != len(metrics):
            raise ConfigError(f"option '--metric': {','.join(metrics)} names a metric twice")
        allowed_first = _SELECTION_METRICS[self.protocol()]
        if metrics[0] not in allowed_first:
            raise ConfigError(f"option '--metric': '{metrics[0]}' cannot be the selection metric under --selection "
                              f"{self.protocol()} (it chooses by {_protocol.SCORE[self.protocol()]}); allowed: "
                              f"{', '.join(allowed_first)}")
        for m in metrics[1:]:
            if m not in _COST_METRICS:
                raise ConfigError(f"option '--metric': a further objective must be a cost metric, not '{m}'; "
                                  f"allowed: {', '.join(_COST_METRICS)}")

    def _check_sampler(self) -> None:
        if self.sampler != "cmaes":
            return

        if len(self.metrics()) > 1:
            raise ConfigError("option '--sampler': cmaes optimises one objective; use nsga2 or tpe for "
                              f"{', '.join(self.metrics())}")
        if importlib.util.find_spec("cmaes") is None:
            raise ConfigError("option '--sampler': cmaes needs the 'cmaes' package (pip install cmaes); "
                              "allowed without it: tpe, random, nsga2")

    def _check_scheduler(self) -> None:
        if self.scheduler in POPULATION_SCHEDULERS:
            self._check_population()
            return
        if self.scheduler != "hyperband":
            return
        if len(self.metrics()) > 1:
            raise ConfigError("option '--scheduler': hyperband prunes by one objective (Optuna's pruners); allowed "
                              f"for {', '.join(self.metrics())}: fifo, asha")
        if float(self.reduction_factor) != int(self.reduction_factor):
            raise ConfigError(f"option '--reduction-factor': {self.reduction_factor} with --scheduler hyperband; "
                              "allowed: an integer >= 2 (Optuna's HyperbandPruner)")

    def _check_population(self) -> None:
        """PBT and PB2 (Ray Tune's): one objective, a population drawn at random, PB2's GPy."""
        if len(self.metrics()) > 1:
            raise ConfigError(f"option '--scheduler': {self.scheduler} exploits by one objective; allowed for "
                              f"{', '.join(self.metrics())}: fifo, asha")
        if self.sampler not in ("tpe", "random"):  # tpe is the default (unset): the population is random either way
            raise ConfigError(f"option '--sampler': --scheduler {self.scheduler} draws its population at random (Ray "
                              f"Tune's PBT takes no searcher); allowed: random, or leave --sampler unset")
        if self.seeds > 1:
            raise ConfigError(f"option '--seeds': a {self.scheduler} member's configuration changes along its run, so "
                              "there is no one configuration to re-run; allowed: --trial-seeds K")
        if self.scheduler == "pb2" and (importlib.util.find_spec("GPy") is None
                                        or importlib.util.find_spec("sklearn") is None):
            raise ConfigError("option '--scheduler': pb2 needs the 'GPy' and 'scikit-learn' packages (pip install 'fedtune[pb2]' or GPy "
                              "scikit-learn); allowed without them: fifo, asha, hyperband, pbt")

    def population_interval(self, rounds: int) -> int:
        """PBT's and PB2's perturbation interval in rounds: ``--perturbation-interval``, else a quarter
        of the rounds (at least 1)."""
        return int(self.perturbation_interval) if self.perturbation_interval else max(1, rounds // 4)

    def _check_fidelity(self) -> None:
        if self.client_fidelity is None:
            return
        if self.scheduler != "asha":
            raise ConfigError(f"option '--client-fidelity': raises the participation along ASHA's rungs; allowed with "
                              f"--scheduler asha, not {self.scheduler}")
        if self.client_fidelity > 1:
            raise ConfigError(f"option '--client-fidelity': {self.client_fidelity} is above 1; allowed: (0, 1] (the "
                              "first rung's participation; the trials' participation is the last rung's)")
        clash = sorted(k for k in ("fidelity_participation", "fidelity_grace_rounds", "fidelity_factor")
                       if k in self.overrides or k in self.config_fields)
        if clash:
            raise ConfigError(f"option '--client-fidelity' sets field '{clash[0]}' from the ASHA options; allowed: "
                              "--client-fidelity or the fidelity_* fields, not both")

    def fidelity_fields(self) -> dict[str, Any]:
        """The run fields ``--client-fidelity`` gives every trial (none without it): the first rung's
        participation, and ASHA's grace period and reduction factor as the rungs."""
        if self.client_fidelity is None:
            return {}
        return {"fidelity_participation": float(self.client_fidelity), "fidelity_grace_rounds": int(self.grace_period),
                "fidelity_factor": float(self.reduction_factor)}

    def _check_places(self) -> None:
        """Storages, loggers, the study's name and output folder, the target domain."""
        if self.storage_path is not None:
            local = local_storage_dir(check_storage_path(self.storage_path))
            if local is not None:  # a folder that refuses writes: now, not when Tune first saves there
                # lazy: keeps pyarrow, numpy out of this module's import
                from fedtune.results.store import check_output_dir

                check_output_dir(local, "option '--storage-path'")
        _check_loggers(self.loggers)
        if self.optuna_storage is not None:
            check_optuna_storage(self.optuna_storage)
        if self.name is not None:
            problem = name_problem(self.name)
            if problem is not None:
                raise ConfigError(f"option '--name': {shown(self.name, 60)} is not a valid study name ({problem}); "
                                  f"allowed: {NAME_RULE}")
        if self.output is not None:
            # lazy: keeps pyarrow, numpy out of this module's import
            from fedtune.results.store import check_output_dir

            check_output_dir(self.output, "option '--output'")
        if self.target_domain is not None and str(self.target_domain).strip() == "":
            raise ConfigError("option '--target-domain': empty; allowed: a domain name or 'all'")

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _check_loggers(loggers: Sequence[str]) -> None:
    """``--logger``: known names, each once, and its package installed (else which extra to install).

    >>> _check_loggers(["csv"])
    >>> _check_loggers(["neptune"])
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--logger': 'neptune' is not allowed; allowed: csv, tensorboard, mlflow, wandb
    """
    for name in loggers:
        Bounds(choices=tuple(LOGGERS)).check("option '--logger'", name)
        needs = LOGGERS[name]
        if needs is not None and importlib.util.find_spec(needs[0]) is None:
            module, extra = needs
            raise ConfigError(f"option '--logger': {name} needs the '{module}' package, which is not installed; "
                              f"install it with: pip install 'fedtune[{extra}]'")
    if len(set(loggers)) != len(loggers):
        raise ConfigError(f"option '--logger': {', '.join(loggers)} names a logger twice; allowed: each once")
