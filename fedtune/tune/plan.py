"""What a sweep study is before anything runs: its options, its searches, its objective and the
no-argument study. No Ray, no Optuna: every bad input fails here (the cluster-capacity check,
which needs the cluster, is :mod:`fedtune.tune.capacity`).

**Searches.** One search per algorithm (its space: ``search_spaces/<algorithm>.yaml``, or the
SPACE files given, one per algorithm); with ``--target-domain all`` one search per
(algorithm, target domain). Searches run one after the other, each filling the cluster with
up to ``--max-concurrent`` trials. The target is a search of its own, not a grid dimension
of one search, because leave-one-domain-out selects hyperparameters per held-out domain
(DomainBed's training-domain validation, docs/methods.md §5) and Optuna's samplers need one
objective per study; OptunaSearch cannot take a ``grid_search`` dimension either. A search's
key is ``<algorithm>`` or ``<algorithm>/<target>``; its Tune experiment is ``tune/<algorithm>``
or ``tune/<algorithm>--<target>``; its Optuna study is ``<study>/<key>``. Several Optuna
studies share the one ``optuna.db`` because the algorithms' spaces differ (a single Optuna
study must keep one search space, and TPE models one objective landscape); every study name
starts with ``<study>/`` so ``optuna.get_all_study_names`` finds them all.

**Objective** (the protocol is :mod:`fedtune.selection`'s). ``--selection val`` (default,
honest): the metric is ``val_acc`` (source validation); ``--selection target-val`` (fda only):
``target_val_acc``, the target client's held-out labels; ``--selection oracle``: ``oracle_acc``,
a held-out slice of the target domain, and every table says "oracle". ``--metric`` alone
implies the protocol of its first metric. A trial's objective value is the metric at the round
the protocol reports (:func:`fedtune.selection.objective`: the best round for ``val`` and
``target-val``, the last round for ``oracle``); ``target_acc`` (the rest of the target) is
always recorded and never chooses.

**Trial seeds.** ``--trial-seeds K`` repeats every search K times, DomainBed-style: search
replicate ``k`` (0..K-1) runs with ``seed + k``, ``data_seed + k`` and sampler seed
``sampler_seed + k``; its key is the search's key with ``@ts<k>`` appended for k >= 1 (its own
Optuna study and Tune experiment; k = 0 is the plain search). The report then shows mean ±
standard error over the K searches (including selection variance); with ``--seeds`` the ± is
over re-runs of one selected configuration and excludes it (the two cannot be combined).
``--sampler nsga2`` is multi-objective by default: maximise the metric and minimise
``server_s`` (mean seconds of server aggregation per round). Objectives named ``*_s`` are
means over rounds; accuracies/losses are the best over rounds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results import selection as _protocol
from fedtune.results.study_dir import StudyDir

__all__ = [
    "KNOBS", "LOGGERS", "METRICS", "SAMPLERS", "SCHEDULERS", "SELECTIONS", "Search",
    "StudyPlan", "SweepOptions", "abs_path", "optuna_storage_url", "plan_study", "seeds_for",
]

SAMPLERS = ("tpe", "random", "cmaes", "nsga2")
SCHEDULERS = ("fifo", "asha")
KNOBS = ("all", "own")
"""``--knobs``: ``all`` searches every parameter; ``own`` each algorithm's own (:func:`fedtune.algorithms.own_knobs`),
every shared one fixed at one value for every method (:func:`fedtune.tune.study_start.own_knob_spaces`)."""
LOGGERS: dict[str, tuple[str, str] | None] = {"csv": None, "tensorboard": ("tensorboardX", "tensorboard"),
                                              "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
"""``--logger`` names (:mod:`fedtune.tune.loggers`): the module each needs and fedtune's pip extra
that installs it (csv needs nothing more than Ray Tune)."""
SELECTIONS = _protocol.PROTOCOLS

METRICS: dict[str, str] = {
    "val_acc": "max", "val_loss": "min", "target_val_acc": "max", "target_val_loss": "min",
    "oracle_acc": "max", "oracle_loss": "min", "train_loss": "min",
    "server_s": "min", "client_s": "min", "wall_s": "min", "bytes_moved": "min",
}
"""Metrics a study may optimise, with their direction. The first (selection) metric is the
protocol's score or loss (:data:`fedtune.selection.SCORE` / ``LOSS``): ``val_acc``/``val_loss``
(``val``), ``target_val_acc``/``target_val_loss`` (``target-val``), ``oracle_acc``/``oracle_loss``
(``oracle``); further objectives (multi-objective) may be any cost metric. ``target_acc`` is
what is reported and never an objective."""

_SELECTION_METRICS = {p: (_protocol.SCORE[p], _protocol.LOSS[p]) for p in _protocol.PROTOCOLS}
_COST_METRICS = ("train_loss", "server_s", "client_s", "wall_s", "bytes_moved")

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
    """

    spaces: list[str] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)
    dataset: str | None = None
    data_root: str | None = None
    target_domain: str | None = None
    rounds: int | None = None
    num_samples: int = 8
    seeds: int = 1
    max_concurrent: int | None = None
    scheduler: str = "fifo"
    sampler: str = "tpe"
    metric: list[str] | None = None
    selection: str | None = None  # None: the protocol of --metric's first metric, else val
    trial_seeds: int = 1
    address: str | None = None
    output: str = "fedtune_results"
    name: str | None = None
    verbose: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    sampler_seed: int = 0
    grace_period: int = 1
    reduction_factor: float = 2.0
    report: bool = True
    max_failures: int = 0  # --max-failures: restarts of a failed trial (from its last checkpoint); -1: unlimited
    storage_path: str | None = None  # --storage-path: Tune's storage (shared dir or URI); None: <study>/tune
    scale_up_timeout_s: float = 900.0  # --scale-up-timeout: how long trials may wait for the autoscaler
    optuna_storage: str | None = None  # --optuna-storage: a shared Optuna storage URL (fedtune.tune.optuna_url)
    loggers: tuple[str, ...] = ()  # --logger: Ray Tune logger callbacks (csv, tensorboard, mlflow, wandb)
    config: str | None = None  # --config FILE.yaml: where config_fields came from (messages, study.json)
    config_fields: dict[str, Any] = field(default_factory=dict)  # its run fields; overrides (--set) win
    knobs: str | None = None  # --knobs: None/"all": every parameter; "own": each algorithm's own, shared ones fixed

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

    def validate(self) -> None:
        """Raise ConfigError naming the option and the allowed values."""
        def choice(name: str, value: Any, allowed: Sequence[str]) -> None:
            if value not in allowed:
                raise ConfigError(f"option '--{name}': '{value}' is not allowed; allowed: {', '.join(allowed)}")

        choice("sampler", self.sampler, SAMPLERS)
        if self.knobs is not None:
            choice("knobs", self.knobs, KNOBS)
        choice("scheduler", self.scheduler, SCHEDULERS)
        choice("selection", self.protocol(), SELECTIONS)
        for name, value, lo in (("num-samples", self.num_samples, 1), ("seeds", self.seeds, 1),
                                ("trial-seeds", self.trial_seeds, 1),
                                ("grace-period", self.grace_period, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ConfigError(f"option '--{name}': {value!r} is not allowed; allowed: an integer >= {lo}")
        if self.max_concurrent is not None and (not isinstance(self.max_concurrent, int) or self.max_concurrent < 1):
            raise ConfigError(f"option '--max-concurrent': {self.max_concurrent!r} is not allowed; allowed: an integer >= 1")
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 1):
            raise ConfigError(f"option '--rounds': {self.rounds!r} is not allowed; allowed: an integer >= 1")
        if not self.reduction_factor > 1:
            raise ConfigError(f"option '--reduction-factor': {self.reduction_factor!r} is not allowed; allowed: > 1")
        if self.seeds > 1 and self.trial_seeds > 1:
            raise ConfigError(f"options '--seeds {self.seeds}' and '--trial-seeds {self.trial_seeds}' cannot be "
                              "combined; allowed: --trial-seeds K (K whole searches: ± includes selection variance) "
                              "or --seeds K (K re-runs of each selected configuration)")
        metrics = self.metrics()
        for m in metrics:
            if m in ("target_acc", "target_loss") and m == metrics[0]:
                raise ConfigError(f"option '--metric': '{m}' is the reported target accuracy and never chooses "
                                  "(honest selection never chooses by the target domain's reported examples); "
                                  f"allowed first metrics: {', '.join(v for p in SELECTIONS for v in _SELECTION_METRICS[p])} "
                                  "(--selection oracle chooses by a held-out slice of the target: oracle_acc)")
            if m not in ("target_acc", "target_loss"):
                choice("metric", m, list(METRICS))
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
        if not isinstance(self.max_failures, int) or isinstance(self.max_failures, bool) or self.max_failures < -1:
            raise ConfigError(f"option '--max-failures': {self.max_failures!r} is not allowed; allowed: an integer "
                              ">= 0 (restarts of a failed trial), or -1 (unlimited)")
        if not (isinstance(self.scale_up_timeout_s, (int, float)) and self.scale_up_timeout_s > 0):
            raise ConfigError(f"option '--scale-up-timeout': {self.scale_up_timeout_s!r} is not allowed; allowed: "
                              "seconds > 0")
        if self.storage_path is not None:
            from fedtune.tune.tune_storage import check_storage_path

            check_storage_path(self.storage_path)
        _check_loggers(self.loggers)
        if self.optuna_storage is not None:
            from fedtune.tune.optuna_url import check_optuna_storage

            check_optuna_storage(self.optuna_storage)
        if self.sampler == "cmaes":
            import importlib.util

            if len(metrics) > 1:
                raise ConfigError("option '--sampler': cmaes optimises one objective; use nsga2 or tpe for "
                                  f"{', '.join(metrics)}")
            if importlib.util.find_spec("cmaes") is None:
                raise ConfigError("option '--sampler': cmaes needs the 'cmaes' package (pip install cmaes); "
                                  "allowed without it: tpe, random, nsga2")
        if self.name is not None:
            from fedtune.results import NAME_RULE, check_name

            try:
                check_name(self.name, "name")
            except ValueError:
                raise ConfigError(f"option '--name': '{self.name}' is not a valid study name; allowed: "
                                  f"{NAME_RULE}") from None
        if self.output is not None:
            from fedtune.results import check_output_dir

            check_output_dir(self.output, "option '--output'")
        if self.target_domain is not None and str(self.target_domain).strip() == "":
            raise ConfigError("option '--target-domain': empty; allowed: a domain name or 'all'")

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Search:
    """One search: an algorithm (and a target domain under leave-one-domain-out) with its space.

    >>> s = Search("fedavg", "30", "search_spaces/fedavg.yaml", True)
    >>> s.key, s.tune_name, s.optuna_study("lodo")
    ('fedavg/30', 'fedavg--30', 'lodo/fedavg/30')
    >>> Search("fedavg", None, "fedavg.yaml", trial_seed=1).tune_name
    'fedavg@ts1'
    """

    algorithm: str
    target: str | None
    space: str  # path of the search-space file
    per_target: bool = False  # the target is part of the key (leave-one-domain-out)
    trial_seed: int = 0  # --trial-seeds: which replicate of the whole search (0 = the plain search)

    @property
    def key(self) -> str:
        base = f"{self.algorithm}/{self.target}" if self.per_target else self.algorithm
        return f"{base}@ts{self.trial_seed}" if self.trial_seed else base

    @property
    def tune_name(self) -> str:
        return self.key.replace("/", "--")

    def optuna_study(self, study: str) -> str:
        return f"{study}/{self.key}"


@dataclass
class StudyPlan:
    """A validated study: its searches and every search's fixed trial configuration."""

    options: SweepOptions
    name: str
    study_dir: Path
    searches: list[Search]
    fixed: dict[str, dict[str, Any]]  # search key -> constant part of every trial config
    targets: list[str | None]
    base_seed: int

    @property
    def metrics(self) -> list[str]:
        return self.options.metrics()

    @property
    def modes(self) -> list[str]:
        return self.options.modes()

    @property
    def optuna_path(self) -> Path:
        return StudyDir(self.study_dir).optuna_db

    @property
    def optuna_url(self) -> str:
        """Where the study's Optuna studies live: ``--optuna-storage``, else ``optuna.db`` here."""
        return self.options.optuna_storage or optuna_storage_url(self.study_dir)

    @property
    def tune_path(self) -> Path:
        return StudyDir(self.study_dir).tune_dir

    @property
    def tune_storage(self) -> str:
        """Tune's ``storage_path`` for this study's experiments: ``<study>/tune`` on the driver's
        disk, or ``<--storage-path>/<study>`` (a shared directory or a URI such as ``s3://...``),
        where Tune keeps its experiment state and the trials' checkpoints."""
        if self.options.storage_path:
            return f"{self.options.storage_path.rstrip('/')}/{self.name}"
        return str(self.tune_path)

    def tune_location(self, name: str) -> str:
        """Where the Tune experiment ``name`` of this study lives (:attr:`tune_storage`/``name``)."""
        return f"{self.tune_storage}/{name}"


# ------------------------------------------------------------------------------------------------
# Planning and validation (no Ray): every bad input fails here, before anything starts.
def _check_loggers(loggers: Sequence[str]) -> None:
    """``--logger``: known names, each once, and its package installed (else which extra to install).

    >>> _check_loggers(["csv"])
    >>> _check_loggers(["neptune"])
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--logger': 'neptune' is not allowed; allowed: csv, tensorboard, mlflow, wandb
    """
    import importlib.util

    for name in loggers:
        if name not in LOGGERS:
            raise ConfigError(f"option '--logger': '{name}' is not allowed; allowed: {', '.join(LOGGERS)}")
        needs = LOGGERS[name]
        if needs is not None and importlib.util.find_spec(needs[0]) is None:
            module, extra = needs
            raise ConfigError(f"option '--logger': {name} needs the '{module}' package, which is not installed; "
                              f"install it with: pip install 'fedtune[{extra}]'")
    if len(set(loggers)) != len(loggers):
        raise ConfigError(f"option '--logger': {', '.join(loggers)} names a logger twice; allowed: each once")


def _given(opts: SweepOptions, key: str, value: Any = "...") -> str:
    """Where a trial field was set: ``--set key=value`` or the ``--config`` file's field."""
    if key in opts.config_fields and key not in opts.overrides:
        return f"config file '{opts.config}': field '{key}'"
    return f"--set {key}={value}"


def abs_path(path: str | None) -> str | None:
    """``path`` with ``~`` expanded, made absolute (None stays None)."""
    return None if path is None else str(Path(path).expanduser().resolve())


def optuna_storage_url(study_dir: str | os.PathLike[str]) -> str:
    """The SQLite URL of a study's ``optuna.db`` (absolute).

    >>> optuna_storage_url("/tmp/x/s")
    'sqlite:////tmp/x/s/optuna.db'
    """
    return f"sqlite:///{StudyDir(Path(study_dir).resolve()).optuna_db}"


def _default_name() -> str:
    return "sweep-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def _load_spaces(opts: SweepOptions) -> list[Any]:
    """The search spaces of the study: the SPACE files, else one per ``--algorithm``."""
    from fedtune.algorithms import PRESETS
    from fedtune.tune.spaces import load_space

    for a in opts.algorithms:
        if a not in PRESETS:
            raise ConfigError(f"option '--algorithm': '{a}' is unknown; allowed: {', '.join(PRESETS)}")
    if len(set(opts.algorithms)) != len(opts.algorithms):
        raise ConfigError(f"option '--algorithm': {', '.join(opts.algorithms)} names an algorithm twice")
    if opts.spaces:
        spaces = [load_space(abs_path(p) if Path(p).exists() else p) for p in opts.spaces]
        by_algo: dict[str, Any] = {}
        for s in spaces:
            if s.algorithm in by_algo:
                raise ConfigError(f"search spaces '{by_algo[s.algorithm].source}' and '{s.source}' are both for "
                                  f"algorithm '{s.algorithm}'; allowed: one space per algorithm")
            by_algo[s.algorithm] = s
        if opts.algorithms:
            missing = [a for a in opts.algorithms if a not in by_algo]
            if missing:
                raise ConfigError(f"option '--algorithm': {', '.join(missing)} has no SPACE file among the given "
                                  f"ones (for {', '.join(by_algo)}); allowed: the SPACE files' algorithms")
            return [by_algo[a] for a in opts.algorithms]
        return spaces
    algorithms = opts.algorithms or ["fedavg"]
    return [load_space(a) for a in algorithms]


def _domains(dataset: str, data_root: str | None, overrides: Mapping[str, Any]) -> list[str]:
    from fedtune.data import get_dataset

    ds = get_dataset(dataset, root=data_root, image_size=overrides.get("image_size"),
                     data_seed=int(overrides.get("data_seed", 0) or 0))
    return list(ds.info.domains)


def plan_study(opts: SweepOptions, *, name: str | None = None) -> StudyPlan:
    """Validate ``opts`` and lay out the searches; raises ConfigError/DataError on bad input.

    Checks, in order: the options; every space file (unknown keys, ranges outside what the
    algorithm allows, malformed YAML: :func:`fedtune.tune.spaces.load_space`); every ``--set``
    field; then every search's default configuration as a full :class:`FederatedRunConfig` with its
    data plan (dataset, data root, target domain, setting), so nothing launches on bad input.
    """
    from fedtune.runtime.driver import build_plan
    from fedtune.tune.spaces import strip_switches

    opts.validate()
    if opts.optuna_storage is not None:  # saved normalised: --resume from elsewhere opens the same storage
        from fedtune.tune.optuna_url import check_optuna_storage

        opts.optuna_storage = check_optuna_storage(opts.optuna_storage)
    if opts.storage_path is not None:  # saved normalised (absolute), like --output
        from fedtune.tune.tune_storage import check_storage_path

        opts.storage_path = check_storage_path(opts.storage_path)
    spaces = _load_spaces(opts)
    overrides = {**opts.config_fields, **opts.overrides}  # --config FILE < --set
    for key in ("algorithm", "output", "name", "target_domain", "dataset", "data_root", "rounds", "address"):
        if key in overrides:
            flag = key.replace("_", "-")
            raise ConfigError(f"--set {key}=...: use the option --{flag} of fedtune sweep instead")
    base: dict[str, Any] = dict(overrides)
    if opts.dataset:
        base["dataset"] = opts.dataset
    if opts.data_root:
        base["data_root"] = abs_path(opts.data_root)
    if opts.rounds:
        base["rounds"] = opts.rounds
    output = abs_path(opts.output) or str(Path("fedtune_results").resolve())
    study = name or opts.name or _default_name()
    base["output"], base["name"] = output, study
    probe = FederatedRunConfig.from_dict({**base, "algorithm": spaces[0].algorithm}, source="--set")  # field errors first

    if opts.target_domain == "all":
        domains = _domains(probe.dataset, probe.data_root, overrides)
        if len(domains) < 2:
            raise ConfigError(f"option '--target-domain': 'all' needs a dataset with several domains; "
                              f"'{probe.dataset}' has {len(domains)}")
        targets: list[str | None] = list(domains)
    else:
        targets = [opts.target_domain]

    searches: list[Search] = []
    fixed: dict[str, dict[str, Any]] = {}
    for space in spaces:
        sampled = {p.name for p in space.params.values() if p.sampled}
        clash = sorted(sampled & set(overrides))
        if clash:
            raise ConfigError(f"{_given(opts, clash[0])}: '{clash[0]}' is sampled by search space '{space.source}'; "
                              "remove it from the space (or make it fixed there) or from --set/--config")
        clash = sorted(k for k in space.constants if k in overrides and overrides[k] != space.constants[k])
        if clash:
            raise ConfigError(f"{_given(opts, clash[0], overrides[clash[0]])}: search space '{space.source}' sets "
                              f"{clash[0]}={space.constants[clash[0]]}; allowed: the space's value")
        for target in targets:
            search = Search(space.algorithm, target, space.source, per_target=opts.target_domain == "all")
            cfg_fixed = {**base, "algorithm": space.algorithm}
            if target is not None:
                cfg_fixed["target_domain"] = target
            trial = {**cfg_fixed, **strip_switches(space.defaults())}
            cfg = FederatedRunConfig.from_dict(trial, source=f"search '{search.key}'")
            run_plan = build_plan(cfg)  # dataset, data root, target domain and setting checks
            if search.per_target and run_plan.setting == "fl":
                raise ConfigError(f"option '--target-domain': 'all' (leave-one-domain-out) needs a setting that "
                                  f"holds a domain out; algorithm '{space.algorithm}' runs in setting 'fl', which "
                                  f"pools every domain, so all {len(targets)} searches would be the same search; "
                                  "allowed: one --target-domain (or none) with setting fl, or --set setting=fdg")
            _protocol.check_protocol(opts.protocol(), run_plan.setting, oracle_fraction=cfg.oracle_fraction,
                                     val_fraction=cfg.val_fraction, field="option '--selection':")
            for k in range(opts.trial_seeds):  # k >= 1: the whole search again, other seeds (DomainBed)
                rep = Search(space.algorithm, target, space.source, per_target=search.per_target, trial_seed=k)
                searches.append(rep)
                fixed[rep.key] = cfg_fixed if k == 0 else {**cfg_fixed, "seed": int(cfg.seed) + k,
                                                           "data_seed": int(cfg.data_seed) + k}
    return StudyPlan(options=opts, name=study, study_dir=Path(output) / study, searches=searches, fixed=fixed,
                     targets=targets, base_seed=int(probe.seed))


def seeds_for(base_seed: int, k: int) -> list[int]:
    """The K seeds of the seed runs; the first is the search's own.

    >>> seeds_for(0, 3)
    [0, 1, 2]
    """
    return [base_seed + i for i in range(k)]
