"""What a sweep study is before anything runs: its options, its searches, its objective and the
no-argument study. No Ray, no Optuna: every bad input fails here (the cluster-capacity check,
which needs the cluster, is :mod:`fedtune.tune.tuner.capacity`).

**Searches.** One search per algorithm (its space: ``search_spaces/<algorithm>.yaml``, or the
SPACE files given, one per algorithm); with ``--target-domain all`` one search per
(algorithm, target domain). Searches run one after the other, each filling the cluster with
up to ``--max-concurrent`` trials (the next search starts as the last trials of one end). The target is a search of its own, not a grid dimension
of one search, because leave-one-domain-out selects hyperparameters per held-out domain
(DomainBed's training-domain validation, docs/methods-protocol.md §5) and Optuna's samplers need one
objective per study; OptunaSearch cannot take a ``grid_search`` dimension either. A search's
key is ``<algorithm>`` or ``<algorithm>/<target>``; its Optuna study is ``<study>/<key>``. A
study of several searches runs them in one Tune experiment, ``tune/_searches`` (each search keeps
its searcher and scheduler, :mod:`fedtune.tune.tuner.study_search`; its trials' actors are
reused from one search to the next); a study of one search, a PBT/PB2 study and a search a
driver of an earlier version started alone use ``tune/<algorithm>`` or
``tune/<algorithm>--<target>``. Several Optuna
studies share the one ``optuna.db`` because the algorithms' spaces differ (a single Optuna
study must keep one search space, and TPE models one objective landscape); every study name
starts with ``<study>/`` so ``optuna.get_all_study_names`` finds them all.

**Objective** (the protocol is :mod:`fedtune.results.selection`'s). ``--selection val`` (default,
honest): the metric is ``val_acc`` (source validation); ``--selection target-val`` (fda only):
``target_val_acc``, the target client's held-out labels; ``--selection oracle``: ``oracle_acc``,
a held-out slice of the target domain, and every table says "oracle". ``--metric`` alone
implies the protocol of its first metric. A trial's objective value is the metric at the round
the protocol reports (:func:`fedtune.results.selection.objective`: the best round for ``val`` and
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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from fedtune.algorithms.presets import PRESETS
from fedtune.config import ROLES, FederatedRunConfig
from fedtune.data.registry import get_dataset
from fedtune.errors import ConfigError
from fedtune.old_names import old_name_error
from fedtune.results import selection as _protocol
from fedtune.results.optuna_url import check_optuna_storage
from fedtune.results.study_dir import StudyDir
from fedtune.runtime.driver import build_plan
from fedtune.spaces.lookup import load_space
from fedtune.spaces.model import strip_switches
from fedtune.tune.common.searches import optuna_storage_url
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.tuner.storage import check_storage_path


STUDY_FIT = "_searches"
"""The Tune experiment (``tune/_searches``) of the searches of a study that run in one fit; no
search is named so (its name would begin with an algorithm's)."""


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
def _given(opts: SweepOptions, key: str, value: Any = "...") -> str:
    """Where a trial field was set: ``--set key=value`` or the ``--config`` file's field."""
    if key in opts.config_fields and key not in opts.overrides:
        return f"config file '{opts.config}': field '{key}'"
    return f"--set {key}={value}"


def abs_path(path: str | None) -> str | None:
    """``path`` with ``~`` expanded, made absolute (None stays None)."""
    return None if path is None else str(Path(path).expanduser().resolve())


def _default_name() -> str:
    return "sweep-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def _load_spaces(opts: SweepOptions) -> list[Any]:
    """The search spaces of the study: the SPACE files, else one per ``--algorithm``."""
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
                # `--algorithm a b` reads b as a SPACE: say how to name several algorithms
                names = [p for p in opts.spaces if p in PRESETS and not Path(p).exists()]
                hint = (f" (to search several algorithms repeat the flag: "
                        f"{' '.join(f'--algorithm {a}' for a in [*opts.algorithms, *names])})" if names else "")
                raise ConfigError(f"option '--algorithm': {', '.join(missing)} has no SPACE file among the given "
                                  f"ones (for {', '.join(by_algo)}); allowed: the SPACE files' algorithms{hint}")
            return [by_algo[a] for a in opts.algorithms]
        return spaces
    algorithms = opts.algorithms or ["fedavg"]
    return [load_space(a) for a in algorithms]


def _domains(dataset: str, data_root: str | None, overrides: Mapping[str, Any]) -> list[str]:
    ds = get_dataset(dataset, root=data_root, image_size=overrides.get("image_size"),
                     data_seed=int(overrides.get("data_seed", 0) or 0))
    return list(ds.info.domains)


def plan_study(opts: SweepOptions, *, name: str | None = None) -> StudyPlan:
    """Validate ``opts`` and lay out the searches; raises ConfigError/DataError on bad input.

    Checks, in order: the options; every space file (unknown keys, ranges outside what the
    algorithm allows, malformed YAML: :func:`fedtune.spaces.lookup.load_space`); every ``--set``
    field; then every search's default configuration as a full :class:`FederatedRunConfig` with its
    data plan (dataset, data root, target domain, setting), so nothing launches on bad input. A
    study that has started (its ``study.json`` is there: ``--resume``) keeps the scheduler options
    it started with (:meth:`SweepOptions.validate`'s ``started``).
    """
    opts.validate(started=_started(opts, name or opts.name))
    if opts.optuna_storage is not None:  # saved normalised: --resume from elsewhere opens the same storage

        opts.optuna_storage = check_optuna_storage(opts.optuna_storage)
    if opts.storage_path is not None:  # saved normalised (absolute), like --output

        opts.storage_path = check_storage_path(opts.storage_path)
    spaces = _load_spaces(opts)
    overrides = {**opts.config_fields, **opts.overrides}  # --config FILE < --set
    base = _base_config(opts, overrides, name)
    output, study = base["output"], base["name"]
    probe = FederatedRunConfig.from_dict({**base, "algorithm": spaces[0].algorithm}, source="--set")  # field errors first
    opts.check_run(probe, spaces)
    targets = _targets(opts, probe, overrides)
    searches: list[Search] = []
    fixed: dict[str, dict[str, Any]] = {}
    for space in spaces:
        _check_space_clashes(opts, space, overrides)
        for target in targets:
            for rep, rep_fixed in _target_searches(opts, space, target, base, len(targets)):
                searches.append(rep)
                fixed[rep.key] = rep_fixed
    return StudyPlan(options=opts, name=study, study_dir=Path(output) / study, searches=searches, fixed=fixed,
                     targets=targets, base_seed=int(probe.seed))


def _started(opts: SweepOptions, name: str | None) -> bool:
    """Whether the study ``name`` has started (its ``study.json`` is in the output folder); a name
    no file system takes has not (the options' check names it)."""
    try:
        return bool(name) and StudyDir(Path(abs_path(opts.output) or "fedtune_results") / name).study_json.is_file()
    except (OSError, ValueError):
        return False


def _base_config(opts: SweepOptions, overrides: Mapping[str, Any], name: str | None) -> dict[str, Any]:
    """What every trial shares: ``--config``/``--set`` fields, dataset options, output folder, study name."""
    for key in ROLES.sweep_options:  # the run fields fedtune sweep sets by its own options
        if key in overrides:
            flag = key.replace("_", "-")
            raise ConfigError(f"--set {key}=...: use the option --{flag} of fedtune sweep instead")
    base: dict[str, Any] = {**overrides, **opts.fidelity_fields()}
    if opts.dataset:
        base["dataset"] = opts.dataset
    if opts.data_root:
        base["data_root"] = abs_path(opts.data_root)
    if opts.rounds:
        base["rounds"] = opts.rounds
    output = abs_path(opts.output) or str(Path("fedtune_results").resolve())
    study = name or opts.name or _default_name()
    base["output"], base["name"] = output, study
    return base


def _targets(opts: SweepOptions, probe: FederatedRunConfig, overrides: Mapping[str, Any]) -> list[str | None]:
    """The target domains of the searches: every domain under ``--target-domain all``, else the one given."""
    if opts.target_domain != "all":
        return [opts.target_domain]
    domains = _domains(probe.dataset, probe.data_root, overrides)
    if len(domains) < 2:
        raise ConfigError(f"option '--target-domain': 'all' needs a dataset with several domains; "
                          f"'{probe.dataset}' has {len(domains)}")
    return list(domains)


def _check_space_clashes(opts: SweepOptions, space: Any, overrides: Mapping[str, Any]) -> None:
    """A ``--set``/``--config`` field may neither be sampled by ``space`` nor contradict its constants."""
    sampled = {p.name for p in space.params.values() if p.sampled}
    clash = sorted(sampled & set(overrides))
    if clash:
        raise ConfigError(f"{_given(opts, clash[0])}: '{clash[0]}' is sampled by search space '{space.source}'; "
                          "remove it from the space (or make it fixed there) or from --set/--config")
    clash = sorted(k for k in space.constants if k in overrides and overrides[k] != space.constants[k])
    if clash:
        raise ConfigError(f"{_given(opts, clash[0], overrides[clash[0]])}: search space '{space.source}' sets "
                          f"{clash[0]}={space.constants[clash[0]]}; allowed: the space's value")


def _target_searches(opts: SweepOptions, space: Any, target: str | None, base: Mapping[str, Any],
                     n_targets: int) -> list[tuple[Search, dict[str, Any]]]:
    """(search, its fixed trial config) per ``--trial-seeds`` replicate of ``space`` and ``target``, once the
    space's default configuration passed every check."""
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
                          f"pools every domain, so all {n_targets} searches would be the same search; "
                          "allowed: one --target-domain (or none) with setting fl, or --set setting=fdg")
    _protocol.check_protocol(opts.protocol(), run_plan.setting, oracle_fraction=cfg.oracle_fraction,
                             val_fraction=cfg.val_fraction, split_scheme=cfg.split_scheme,
                             field="option '--selection':")
    _protocol.check_split_rows(opts.protocol(), run_plan.split_scheme,  # CelebA's official split: no id_val rows
                               {s: sum(len(v) for v in getattr(run_plan, split).values())
                                for s, split in (("id_val", "id_val"), ("val", "ood_val"))},
                               f"dataset {cfg.dataset!r}", field="option '--selection':")
    out = []
    for k in range(opts.trial_seeds):  # k >= 1: the whole search again, other seeds (DomainBed)
        rep = Search(space.algorithm, target, space.source, per_target=search.per_target, trial_seed=k)
        out.append((rep, cfg_fixed if k == 0 else {**cfg_fixed, "seed": int(cfg.seed) + k,
                                                   "data_seed": int(cfg.data_seed) + k}))
    return out


def seeds_for(base_seed: int, k: int) -> list[int]:
    """The K seeds of the seed runs; the first is the search's own.

    >>> seeds_for(0, 3)
    [0, 1, 2]
    """
    return [base_seed + i for i in range(k)]


def __getattr__(name: str) -> NoReturn:
    """A name docs/sweep.md once gave here (``DEFAULT_STUDY``) raises one line naming its new home."""
    raise old_name_error(__name__, name)
