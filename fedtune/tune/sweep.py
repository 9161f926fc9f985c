"""``fedtune sweep``: hyperparameter studies on Ray Tune + Optuna, with resume and seeds.

A *study* (``--name``) lives in ``OUTPUT/<study>/``::

    study.json              options, selection (val|target-val|oracle), algorithms, targets, searches, seed runs
    optuna.db               SQLite; one Optuna study per search, named "<study>/<search key>"
    tune/<search>/          Ray Tune's experiment of each search (what ``--resume`` restores)
    rounds/<trial>.parquet  every (trial, round), written by ArrowCallback (the single writer)
    trials.parquet          one row per finished trial
    report.md, plots/       ``fedtune report``'s output, refreshed at the end of the sweep

**Searches.** One search per algorithm (its space: ``search_spaces/<algorithm>.yaml``, or the
SPACE files given, one per algorithm); with ``--target-domain all`` one search per
(algorithm, target domain). Searches run one after the other, each filling the cluster with
up to ``--max-concurrent`` trials. The target is a search of its own, not a grid dimension
of one search, because leave-one-domain-out selects hyperparameters per held-out domain
(DomainBed's training-domain validation, METHODS.md §5) and Optuna's samplers need one
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

**Defaults first.** Each search's first trial is the search space's defaults (the papers'
settings, ``default:`` in the YAML): the Optuna study is seeded with
``SearchSpace.default_point()`` (``enqueue_trial``) when it has no trial yet, so a resumed or
restarted search never enqueues it twice.

**Trial seeds.** ``--trial-seeds K`` repeats every search K times, DomainBed-style: search
replicate ``k`` (0..K-1) runs with ``seed + k``, ``data_seed + k`` and sampler seed
``sampler_seed + k``; its key is the search's key with ``@ts<k>`` appended for k >= 1 (its own
Optuna study and Tune experiment; k = 0 is the plain search). The report then shows mean ±
standard error over the K searches (including selection variance); with ``--seeds`` the ± is
over re-runs of one selected configuration and excludes it (the two cannot be combined).
``--sampler nsga2`` is multi-objective by default: maximise the metric and minimise
``server_s`` (mean seconds of server aggregation per round). Objectives named ``*_s`` are
means over rounds; accuracies/losses are the best over rounds.

**Optuna bookkeeping** (:class:`FedtuneOptunaSearch`, a subclass of Ray's OptunaSearch):
every round's metric is an Optuna intermediate value (``step`` = round; single objective
only, Optuna has no intermediate values for several objectives), and each round's objective
values are kept as user attributes ``round.<r>``. When a trial ends it is told to Optuna as

* COMPLETE — it ran its last round; values: the objective(s) above;
* PRUNED — it was stopped before its last round (ASHA) without diverging; Optuna then takes
  its last intermediate value (Ray's own adapter would tell COMPLETE with a truncated score);
* FAIL — it diverged (NaN/Inf; ``fedtune_status: diverged``, and ``diverged`` in
  trials.parquet), raised (``failed``), or has no finite metric. FAIL rather than PRUNED for
  divergence: a NaN run has no objective value, and TPE must not treat its last finite
  accuracy as a result.

User attributes: ``tune_trial_id``, ``fedtune_trial_id`` (the Arrow store's id), ``config`` (the
trial's full configuration), ``fedtune_status`` and ``rounds_done``.

**Resume.** ``--resume`` reads ``study.json`` and continues: searches marked done are skipped;
a started one is ``Tuner.restore``-d from ``tune/<search>`` (unfinished trials continue from
their last Tune checkpoint, ``--set checkpoint_every=N``, else from round 1; the Arrow
callback keeps each (trial, round) once); one never started begins. The searcher (with its
Optuna storage) comes back from Tune's experiment snapshot, taken every
:data:`EXPERIMENT_SNAPSHOT_S` seconds; trials asked from Optuna after the last snapshot of a
killed driver are left RUNNING in optuna.db and are told FAIL (``fedtune_status:
orphaned``) when the search ends, so Optuna finally holds every trial in a finished state.
Ray restores Tune's own settings (``--verbose`` included) from the first run.
Without ``--name``, a new study is named ``sweep-<UTC time>`` and ``--resume`` continues the
most recently started study in OUTPUT. A study directory that already holds a study is never
overwritten: pass ``--resume`` or another ``--name``.

**Seeds.** ``--seeds K``: after the searches, the configuration the report selects per
(algorithm, target) (highest metric at its best round) is evaluated with the K seeds
``s, s+1, ..., s+K-1`` (``s`` = the study's ``seed``, default 0). Its search run *is* the
seed-``s`` replicate (a run is deterministic given its seed, so re-running it would reproduce
it exactly); the K-1 others run as one Tune experiment ``tune/<search>--seeds``. The report
then shows mean ± standard error over the K seeds.

**Resources.** Ray is joined at ``--address`` or started like ``fedtune run`` (explicit
``num_cpus``, no dashboard). A trial reserves what :func:`fedtune.tune.trainable.resources_for`
says (by default as many client actors as the cluster fits, so trials run one at a time;
``--set max_client_actors=1`` lets more run side by side). ``--max-concurrent`` above what
the cluster can place is capped, with a warning naming the numbers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedtune.config import ConfigError, RunConfig

__all__ = [
    "DEFAULT_ALGORITHMS", "DEFAULT_STUDY", "EXPERIMENT_SNAPSHOT_S", "METRICS", "SAMPLERS", "SCHEDULERS",
    "SELECTIONS", "Search", "StudyInterrupted", "StudyPlan", "SweepOptions", "SweepResult",
    "add_sweep_parser", "cmd_sweep", "concurrency_cap", "make_sampler", "make_scheduler", "objective_values",
    "optuna_storage_url", "plan_study", "reconcile_optuna", "run_sweep", "seeds_for",
]

SAMPLERS = ("tpe", "random", "cmaes", "nsga2")
SCHEDULERS = ("fifo", "asha")
from fedtune import selection as _protocol  # noqa: E402

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

DEFAULT_ALGORITHMS = ("fedavg", "fedprox", "fedomg")
"""Algorithms of the no-argument study (those registered and with a search space)."""

DEFAULT_STUDY: dict[str, Any] = {
    "dataset": "rotated-digits", "rounds": 8, "num_samples": 4, "trial_seeds": 3,
    "overrides": {"local_steps": 10, "batch_size": 32, "client_cpus": 1.0, "max_client_actors": 1},
}
"""The no-argument study: rotated-digits (target domain "0", the cnn), 8 rounds of 10 local
steps, 4 Optuna trials per search (the first: the space's defaults), the whole search repeated
over 3 trial seeds so the table has an error bar that includes selection variance; one client
actor per trial, so trials run side by side. A few minutes on 2 CPU cores. Its report says
plainly which gaps it can and cannot resolve (:meth:`fedtune.tune.report.Report.conclusions`)."""

EXPERIMENT_SNAPSHOT_S = 2.0
"""Seconds between Tune's experiment snapshots (``TUNE_GLOBAL_CHECKPOINT_S``; Ray's default is
adaptive and at least 10 s). A driver killed between two snapshots redoes at most this much
bookkeeping on ``--resume``; set the environment variable to override."""

STUDY_FILE = "study.json"
OPTUNA_FILE = "optuna.db"
TUNE_DIR = "tune"
_FINISHED = ("TERMINATED", "ERROR")


# ------------------------------------------------------------------------------------------------
class StudyInterrupted(RuntimeError):
    """The study stopped before its end (Ctrl-C: Ray Tune saved its state); ``--resume`` continues it."""


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
        if self.sampler == "cmaes":
            import importlib.util

            if len(metrics) > 1:
                raise ConfigError("option '--sampler': cmaes optimises one objective; use nsga2 or tpe for "
                                  f"{', '.join(metrics)}")
            if importlib.util.find_spec("cmaes") is None:
                raise ConfigError("option '--sampler': cmaes needs the 'cmaes' package (pip install cmaes); "
                                  "allowed without it: tpe, random, nsga2")
        if self.name is not None:
            from fedtune.results import NAME_RULE, _check_name

            try:
                _check_name(self.name, "name")
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
        return self.study_dir / OPTUNA_FILE

    @property
    def tune_path(self) -> Path:
        return self.study_dir / TUNE_DIR


@dataclass
class SweepResult:
    """What :func:`run_sweep` did: the study, its searches' states, the report (if made)."""

    study_dir: Path
    name: str
    searches: dict[str, dict[str, Any]]
    report: Any = None
    report_path: Path | None = None
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# Planning and validation (no Ray): every bad input fails here, before anything starts.
def _abs(path: str | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def optuna_storage_url(study_dir: str | os.PathLike[str]) -> str:
    """The SQLite URL of a study's ``optuna.db`` (absolute).

    >>> optuna_storage_url("/tmp/x/s")
    'sqlite:////tmp/x/s/optuna.db'
    """
    return f"sqlite:///{Path(study_dir).resolve() / OPTUNA_FILE}"


SQLITE_TIMEOUT_S = 30.0
"""How long one SQLite statement on ``optuna.db`` waits for a lock held by another connection
(e.g. optuna-dashboard reading the live study) before SQLite answers "database is locked"."""

STORAGE_RETRY_S = 600.0
"""After that, how long :func:`optuna_storage` keeps retrying a locked call (backoff 0.05 s ... 2 s)
before it gives up and raises: a record is never dropped silently."""


def optuna_storage(study_dir: str | os.PathLike[str], *, timeout_s: float = SQLITE_TIMEOUT_S,
                   retry_s: float = STORAGE_RETRY_S) -> Any:
    """The Optuna storage of a study: an ``RDBStorage`` on ``optuna.db`` whose SQLite connections
    wait ``timeout_s`` for a lock and whose every call is retried with backoff while the database
    is locked (up to ``retry_s``). Pickled into Tune's experiment, it is rebuilt on the study
    directory being resumed (not the one it was created in), so a study folder can be copied or
    moved and resumed there (see :class:`FedtuneRDBStorage`)."""
    return _storage_class()(optuna_storage_url(study_dir), timeout_s=timeout_s, retry_s=retry_s)


def _is_locked(exc: BaseException) -> bool:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        text = str(e).lower()
        if "database is locked" in text or "database table is locked" in text or "database is busy" in text:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _retrying(fn: Callable, name: str) -> Callable:
    import functools

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + float(getattr(self, "fedtune_retry_s", STORAGE_RETRY_S))
        delay = 0.05
        while True:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if not _is_locked(exc) or time.monotonic() + delay > deadline:
                    raise
                logging.getLogger(__name__).info("optuna.db is locked during %s; retrying in %.2fs", name, delay)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    return call


def _storage_class() -> type:
    """:class:`FedtuneRDBStorage`, built on first use (Optuna is imported only then)."""
    if "FedtuneRDBStorage" in globals():
        return globals()["FedtuneRDBStorage"]
    import inspect

    from optuna.storages import RDBStorage

    class FedtuneRDBStorage(RDBStorage):
        """Optuna's RDBStorage with a SQLite lock timeout, retries while the database is locked,
        and relocation: unpickled while a sweep runs (Tune restoring its experiment), it opens
        the ``optuna.db`` of the study directory being run, wherever the pickle was made."""

        def __init__(self, url: str, *, timeout_s: float = SQLITE_TIMEOUT_S, retry_s: float = STORAGE_RETRY_S):
            self.fedtune_timeout_s, self.fedtune_retry_s = float(timeout_s), float(retry_s)
            super().__init__(url, engine_kwargs={"connect_args": {"timeout": float(timeout_s)}})

        def __setstate__(self, state: dict) -> None:
            active = _ACTIVE.get("study_dir")
            if active is not None and str(state.get("url", "")).startswith("sqlite:"):
                state = {**state, "url": optuna_storage_url(active)}
            self.fedtune_retry_s = float(state.get("fedtune_retry_s", STORAGE_RETRY_S))
            _retrying(RDBStorage.__setstate__, "open")(self, state)

    for attr, fn in list(vars(RDBStorage).items()):
        if inspect.isfunction(fn) and (not attr.startswith("_") or attr == "__init__"):
            target = vars(FedtuneRDBStorage).get(attr, fn)
            setattr(FedtuneRDBStorage, attr, _retrying(target, attr))
    return _publish(FedtuneRDBStorage, "FedtuneRDBStorage")


def _default_name() -> str:
    return "sweep-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def is_default_study(opts: SweepOptions) -> bool:
    """True when no option chooses what to run (``fedtune sweep`` alone)."""
    return not (opts.spaces or opts.algorithms or opts.dataset or opts.data_root or opts.target_domain
                or opts.rounds or opts.overrides)


def apply_default_study(opts: SweepOptions) -> SweepOptions:
    """The no-argument study: :data:`DEFAULT_STUDY` on the algorithms of :data:`DEFAULT_ALGORITHMS`
    that are registered and have a search space."""
    from fedtune.algorithms import PRESETS
    from fedtune.tune.spaces import list_spaces

    spaces = set(list_spaces())
    algos = [a for a in DEFAULT_ALGORITHMS if a in PRESETS and a in spaces]
    out = copy.deepcopy(opts)
    out.algorithms = algos or ["fedavg"]
    out.dataset = DEFAULT_STUDY["dataset"]
    out.rounds = DEFAULT_STUDY["rounds"]
    if out.num_samples == SweepOptions.num_samples:
        out.num_samples = DEFAULT_STUDY["num_samples"]
    if out.trial_seeds == SweepOptions.trial_seeds and out.seeds == SweepOptions.seeds:
        out.trial_seeds = DEFAULT_STUDY["trial_seeds"]
    out.overrides = dict(DEFAULT_STUDY["overrides"])
    return out


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
        spaces = [load_space(_abs(p) if Path(p).exists() else p) for p in opts.spaces]
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
    field; then every search's default configuration as a full :class:`RunConfig` with its
    data plan (dataset, data root, target domain, setting), so nothing launches on bad input.
    """
    from fedtune.runtime.driver import build_plan
    from fedtune.tune.spaces import strip_switches

    opts.validate()
    spaces = _load_spaces(opts)
    overrides = dict(opts.overrides)
    for key in ("algorithm", "output", "name", "target_domain", "dataset", "data_root", "rounds", "address"):
        if key in overrides:
            flag = key.replace("_", "-")
            raise ConfigError(f"--set {key}=...: use the option --{flag} of fedtune sweep instead")
    base: dict[str, Any] = dict(overrides)
    if opts.dataset:
        base["dataset"] = opts.dataset
    if opts.data_root:
        base["data_root"] = _abs(opts.data_root)
    if opts.rounds:
        base["rounds"] = opts.rounds
    output = _abs(opts.output) or str(Path("fedtune_results").resolve())
    study = name or opts.name or _default_name()
    base["output"], base["name"] = output, study
    probe = RunConfig.from_dict({**base, "algorithm": spaces[0].algorithm}, source="--set")  # field errors first

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
            raise ConfigError(f"--set {clash[0]}=...: '{clash[0]}' is sampled by search space '{space.source}'; "
                              "remove it from the space (or make it fixed there) or from --set")
        clash = sorted(k for k in space.constants if k in overrides and overrides[k] != space.constants[k])
        if clash:
            raise ConfigError(f"--set {clash[0]}={overrides[clash[0]]}: search space '{space.source}' sets "
                              f"{clash[0]}={space.constants[clash[0]]}; allowed: the space's value")
        for target in targets:
            search = Search(space.algorithm, target, space.source, per_target=opts.target_domain == "all")
            cfg_fixed = {**base, "algorithm": space.algorithm}
            if target is not None:
                cfg_fixed["target_domain"] = target
            trial = {**cfg_fixed, **strip_switches(space.defaults())}
            cfg = RunConfig.from_dict(trial, source=f"search '{search.key}'")
            run_plan = build_plan(cfg)  # dataset, data root, target domain and setting checks
            if search.per_target and run_plan.setting == "fl":
                raise ConfigError(f"option '--target-domain': 'all' (leave-one-domain-out) needs a setting that "
                                  f"holds a domain out; algorithm '{space.algorithm}' runs in setting 'fl', which "
                                  f"pools every domain, so all {len(targets)} searches would be the same search; "
                                  "allowed: one --target-domain (or none) with setting fl, or --set setting=fdg")
            _protocol.check_protocol(opts.protocol(), run_plan.setting, oracle_fraction=cfg.oracle_fraction,
                                     field="option '--selection':")
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


# ------------------------------------------------------------------------------------------------
# Optuna
def make_sampler(name: str, seed: int, num_samples: int):
    """A seeded Optuna sampler: ``tpe`` (default), ``random``, ``cmaes`` or ``nsga2``.

    TPE starts modelling after ``max(1, min(10, num_samples // 3))`` random trials (Optuna's
    fixed 10 would make every small study random); NSGA-II's population is
    ``max(2, min(50, num_samples // 2))`` for the same reason.

    >>> type(make_sampler("tpe", 0, 9)).__name__
    'TPESampler'
    """
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():  # multivariate/group are "experimental" (stable since Optuna 2.x)
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, min(10, num_samples // 3)),
                                              multivariate=True, group=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False,
                                            n_startup_trials=max(1, min(10, num_samples // 3)))
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, min(50, num_samples // 2)))
    raise ConfigError(f"option '--sampler': '{name}' is not allowed; allowed: {', '.join(SAMPLERS)}")


def make_scheduler(name: str, metric: str, mode: str, rounds: int, grace_period: int = 1,
                   reduction_factor: float = 2.0):
    """Tune's trial scheduler: ``fifo`` (every trial runs all its rounds) or ``asha``
    (AsyncHyperBand on the round, rungs at ``grace_period * reduction_factor**k``)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if name == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=rounds,
                         grace_period=min(grace_period, rounds), reduction_factor=reduction_factor)


def objective_values(per_round: Mapping[int, Mapping[str, float]], metrics: Sequence[str],
                     modes: Sequence[str]) -> list[float] | None:
    """A trial's objective values from its per-round metrics, :func:`fedtune.selection.objective`
    per metric: the value at the round the protocol reports (best over rounds, max/min by mode;
    the last round for ``oracle_*``), the mean of a ``*_s``/``bytes_moved`` cost; None when a
    metric has no value.

    >>> objective_values({1: {"val_acc": 0.5, "server_s": 0.2}, 2: {"val_acc": 0.4, "server_s": 0.4}},
    ...                  ["val_acc", "server_s"], ["max", "min"])
    [0.5, 0.30000000000000004]
    """
    out = []
    for m, mode in zip(metrics, modes):
        value = _protocol.objective({r: v.get(m, math.nan) for r, v in per_round.items()}, m, mode)
        if value is None:
            return None
        out.append(value)
    return out


def _finite(v: Any) -> bool:
    try:
        return v is not None and not isinstance(v, bool) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _searcher_class() -> type:
    """:class:`FedtuneOptunaSearch`, built on first use so that importing this module (the CLI
    does) needs no Ray; it is then a module attribute, so pickles refer to it by name."""
    if "FedtuneOptunaSearch" in globals():
        return globals()["FedtuneOptunaSearch"]
    from ray.tune.search.optuna import OptunaSearch

    class _FedtuneOptunaSearch(OptunaSearch):
        """Ray's OptunaSearch with fedtune's bookkeeping (see the module docstring): per-round
        intermediate values, PRUNED for trials stopped early, FAIL for diverged ones, the full
        configuration and fedtune's trial id as user attributes, ``switch.*`` keys kept in Optuna
        but out of the trial config."""

        def __init__(self, space: Callable, *, metrics: Sequence[str], modes: Sequence[str], rounds: int,
                     fixed: Mapping[str, Any], sampler: Any, study_name: str, storage: Any,
                     first_point: Mapping[str, Any] | None = None) -> None:
            multi = len(metrics) > 1
            super().__init__(space=space, metric=list(metrics) if multi else metrics[0],
                             mode=list(modes) if multi else modes[0], sampler=sampler, study_name=study_name,
                             storage=storage)
            # The search space's defaults as the first trial (SearchSpace.default_point()). Not
            # Ray's points_to_evaluate: OptunaSearch would enqueue them again each time the searcher
            # is re-created on the same Optuna study (a restarted search); enqueue only into an
            # empty study.
            if first_point and not self._ot_study.get_trials(deepcopy=False):
                self._ot_study.enqueue_trial(dict(first_point))
            self.fedtune_metrics = list(metrics)
            self.fedtune_modes = list(modes)
            self.fedtune_rounds = int(rounds)
            self.fedtune_fixed = dict(fixed)
            self.fedtune_reported: dict[str, set[int]] = {}

        # -- asking -------------------------------------------------------------------------
        def suggest(self, trial_id: str) -> dict | None:
            from fedtune.tune.spaces import strip_switches

            params = super().suggest(trial_id)
            if params is None:
                return None
            ot_trial = self._ot_trials[trial_id]
            config = strip_switches(params)
            full = {**self.fedtune_fixed, **config}
            ot_trial.set_user_attr("tune_trial_id", trial_id)
            try:
                cfg = RunConfig.from_dict(full, source="sampled configuration")
                ot_trial.set_user_attr("fedtune_trial_id", cfg.trial_id())
            except ConfigError as exc:  # the trial will fail on it and be told FAIL
                ot_trial.set_user_attr("config_error", str(exc))
            ot_trial.set_user_attr("config", json.loads(json.dumps(full, sort_keys=True, default=str)))
            return config

        # -- results ------------------------------------------------------------------------
        def _record(self, trial_id: str, result: Mapping[str, Any]) -> None:
            import optuna

            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None:
                return
            step = result.get("round", result.get("training_iteration"))
            if step is None:
                return
            step = int(step)
            values = {m: float(result[m]) for m in self.fedtune_metrics if _finite(result.get(m))}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ot_trial.set_user_attr(f"round.{step}", values)
                    first = values.get(self.fedtune_metrics[0])
                    reported = self.fedtune_reported.setdefault(trial_id, set())
                    if len(self.fedtune_metrics) == 1 and first is not None and step not in reported:
                        ot_trial.report(first, step)
                        reported.add(step)
                except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
                    pass  # the trial was told already (a driver restart replays it): nothing to add

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            if trial_id in self._completed_trials:
                return
            self._record(trial_id, result)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            from optuna.trial import TrialState

            if trial_id in self._completed_trials:
                return
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None:
                return
            if result:
                self._record(trial_id, result)  # the last result reaches only on_trial_complete
            frozen = self._frozen(ot_trial)
            per_round = {int(k.split(".", 1)[1]): v for k, v in (frozen.user_attrs if frozen else {}).items()
                         if k.startswith("round.")}
            last_round = int(result.get("round", 0) or 0) if result else (max(per_round) if per_round else 0)
            diverged = bool(result) and result.get("status") == "diverged"
            values = None
            if error:
                state, status = TrialState.FAIL, "failed"
            elif diverged:
                state, status = TrialState.FAIL, "diverged"
            elif last_round < self.fedtune_rounds:
                state, status = TrialState.PRUNED, "pruned"
            else:
                values = objective_values(per_round, self.fedtune_metrics, self.fedtune_modes)
                state, status = (TrialState.COMPLETE, "completed") if values else (TrialState.FAIL, "no_metric")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    if frozen is None or frozen.state == TrialState.RUNNING:
                        ot_trial.set_user_attr("fedtune_status", status)
                        ot_trial.set_user_attr("rounds_done", last_round)
                    self._ot_study.tell(ot_trial, values if state == TrialState.COMPLETE else None, state=state,
                                        skip_if_finished=True)
                except Exception as exc:  # noqa: BLE001 - never let bookkeeping kill the study
                    logging.getLogger(__name__).warning("Optuna: could not tell trial %s: %s", trial_id, exc)
            self._completed_trials.add(trial_id)

        def _frozen(self, ot_trial: Any) -> Any:
            for t in self._ot_study.get_trials(deepcopy=False):
                if t.number == ot_trial.number:
                    return t
            return None

    return _publish(_FedtuneOptunaSearch, "FedtuneOptunaSearch")


def _publish(cls: type, name: str) -> type:
    cls.__name__ = cls.__qualname__ = name
    cls.__module__ = __name__
    globals()[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """``FedtuneOptunaSearch`` and ``SweepProgress`` are built on first access (they subclass Ray
    classes; unpickling Tune's saved experiment looks them up by name here)."""
    if name == "FedtuneOptunaSearch":
        return _searcher_class()
    if name == "SweepProgress":
        return _progress_callback_class()
    if name == "FedtuneRDBStorage":
        return _storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reconcile_optuna(storage_url: str | Any, study_name: str) -> int:
    """Tell FAIL (user attribute ``fedtune_status: orphaned``) every trial still RUNNING in the
    Optuna study: after a search ended nothing runs, so these were asked by a driver that was
    killed before Tune's next snapshot. Returns how many were closed. ``storage_url``: a URL or
    a storage (:func:`optuna_storage`: retried while the database is locked)."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage_url)
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "fedtune_status", "orphaned")
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        n += 1
    return n


# ------------------------------------------------------------------------------------------------
# Resources
def concurrency_cap(configs: Sequence[Mapping[str, Any]], requested: int | None,
                    cluster: Mapping[str, float], nodes: list[dict[str, float]] | None = None) -> tuple[int, str | None]:
    """How many trials of ``configs`` can run at once on a cluster with ``cluster`` resources in
    total (``ray.cluster_resources()``), and a warning when ``requested`` is more than that.
    Each trial reserves the sum of its :func:`~fedtune.tune.trainable.resources_for` bundles
    (planned on ``nodes``, default: the connected cluster's); the cap divides the cluster's
    totals by the largest such reservation, an upper bound on a cluster of several nodes.
    Raises ConfigError when not even one trial fits.

    >>> concurrency_cap([{"dataset": "rect4", "client_cpus": 0.5, "max_client_actors": 1}], 8, {"CPU": 2.0},
    ...                 nodes=[{"CPU": 2.0}])[1]
    'option --max-concurrent: 8 concurrent trials need 4 CPU (each trial reserves 0.5 CPU), but the cluster has 2 CPU; running at most 4 trials at a time'
    """
    from fedtune.runtime.resources import ResourceError
    from fedtune.tune.trainable import resources_for

    need: dict[str, float] = {}
    for cfg in configs:
        try:
            pgf = resources_for(dict(cfg), nodes)
        except ResourceError as exc:
            raise ConfigError(str(exc)) from None
        total: dict[str, float] = {}
        for b in pgf.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + float(v)
        for k, v in total.items():
            need[k] = max(need.get(k, 0.0), v)
    fit = math.inf
    for k, v in need.items():
        if v > 0:
            fit = min(fit, math.floor(float(cluster.get(k, 0.0)) / v + 1e-9))
    fit = int(fit) if fit != math.inf else (requested or 1)
    if fit < 1:
        raise ConfigError(f"a trial reserves {_res_text(need)} but the cluster has {_res_text(cluster, need)}; "
                          "lower client_cpus/client_gpus or max_client_actors")
    if requested is None:
        return fit, None
    if requested > fit:
        want = {k: v * requested for k, v in need.items()}
        return fit, (f"option --max-concurrent: {requested} concurrent trials need {_res_text(want)} (each trial "
                     f"reserves {_res_text(need)}), but the cluster has {_res_text(cluster, need)}; running at most "
                     f"{fit} trial{'s' if fit != 1 else ''} at a time")
    return requested, None


def _res_text(res: Mapping[str, float], keys: Mapping[str, float] | None = None) -> str:
    names = [k for k in (keys or res) if (keys or res)[k] > 0] or ["CPU"]
    return ", ".join(f"{float(res.get(k, 0.0)):g} {k}" for k in names)


# ------------------------------------------------------------------------------------------------
# Progress: a live rich view fed by a Tune callback
class _View:
    """The driver's live table: per search, trials done / running / pruned / failed and the
    best so far by the selection metric (with its target accuracy)."""

    def __init__(self, plan: StudyPlan, console: Any, live: bool):
        import threading

        self.plan = plan
        self.console = console
        self.rows: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.live = None
        self.enabled = live

    def start(self) -> None:
        if not self.enabled:
            return
        from rich.live import Live

        self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
            if not self.console.is_terminal:
                self.console.print()  # the last frame ends without a newline off a terminal

    def row(self, key: str, total: int) -> dict[str, Any]:
        with self.lock:
            return self.rows.setdefault(key, {"total": total, "trials": {}, "state": "waiting"})

    def render(self) -> Any:
        from rich.table import Table

        metric = self.plan.metrics[0]
        label = self.plan.options.protocol()
        t = Table(title=f"study {self.plan.name} — {time.time() - self.t0:.0f}s — selection: {label} "
                        f"({metric}{', ORACLE' if label == 'oracle' else ''})")
        for col in ("search", "state", "done", "run", "pruned", "failed", "of", f"best {metric}", "target"):
            t.add_column(col, justify="left" if col in ("search", "state") else "right",
                         overflow="fold", min_width=10 if col == "search" else None)
        with self.lock:
            for key, r in self.rows.items():
                c = _count(r["trials"].values())
                best = r.get("best")
                t.add_row(key, r["state"], str(c["done"]), str(c["running"]), str(c["pruned"]),
                          str(c["failed"] + c["diverged"]) + (f" ({c['diverged']} div.)" if c["diverged"] else ""),
                          str(r["total"]), f"{best[0]:.4f}" if best else "—",
                          f"{best[1]:.4f}" if best and _finite(best[1]) else "—")
        return t


def _count(trials: Any) -> dict[str, int]:
    c = {"done": 0, "running": 0, "pruned": 0, "failed": 0, "diverged": 0, "pending": 0}
    for s in trials:
        c[s if s in c else "pending"] += 1
    return c


# The driver's live view and, per search key, what this driver session saw of its trials. Module
# state on purpose: Tune pickles its callbacks into the experiment and unpickles them on resume,
# so they find the view of the process they run in here (one Tune loop runs at a time).
_ACTIVE: dict[str, Any] = {"view": None}
_SESSIONS: dict[str, dict[str, Any]] = {}


def _classify(status: str, last: Mapping[str, Any] | None, rounds: int) -> str:
    if status == "ERROR":
        return "failed"
    if status == "TERMINATED":
        if not last:
            return "pruned"
        if last.get("status") == "diverged":
            return "diverged"
        return "done" if int(last.get("round", 0) or 0) >= rounds else "pruned"
    return "running" if status == "RUNNING" else "pending"


def _progress_callback_class() -> type:
    if "SweepProgress" in globals():
        return globals()["SweepProgress"]
    from ray.tune import Callback

    class SweepProgress(Callback):
        """Feeds the live view and records which trials started and ended in this driver session
        (to tell an interrupted ``fit`` from a finished one). Holds only names, so it pickles
        into Tune's experiment state; the view lives in this process (``_ACTIVE``)."""

        def __init__(self, key: str, rounds: int, metric: str, mode: str, total: int):
            self.key, self.rounds = key, rounds
            self.metric, self.mode, self.total = metric, mode, total

        def _session(self) -> dict[str, Any]:
            return _SESSIONS.setdefault(self.key, {"started": set(), "ended": set(), "errored": {},
                                                                    "statuses": {}, "num_trials": 0})

        def _update(self, trials: list) -> None:
            view = _ACTIVE["view"]
            if view is None:
                return
            s = self._session()
            row = view.row(self.key, self.total)
            with view.lock:
                row["state"] = "running"
                for t in trials:
                    # Tune calls on_trial_complete/_error before it changes the trial's status
                    status = s["errored"].get(t.trial_id) or ("TERMINATED" if t.trial_id in s["ended"] and
                                                              t.status == "RUNNING" else t.status)
                    row["trials"][t.trial_id] = _classify(status, t.last_result, self.rounds)

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            s = self._session()
            if not s.get("seen"):  # first step: show what a restored experiment already holds
                s["seen"] = True
                for t in trials:
                    value = (getattr(t, "metric_analysis", None) or {}).get(self.metric, {}).get(self.mode)
                    self._best(value, None)
                self._update(trials)

        def _best(self, value: Any, target: Any) -> None:
            view = _ACTIVE["view"]
            if view is None or not _finite(value):
                return
            row = view.row(self.key, self.total)
            with view.lock:
                best = row.get("best")
                if best is None or (value > best[0] if self.mode == "max" else value < best[0]):
                    row["best"] = (float(value), target)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._session()["started"].add(trial.trial_id)
            self._update(trials)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._session()["started"].add(trial.trial_id)
            self._best(result.get(self.metric), result.get("target_acc"))
            self._update(trials)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._session()["ended"].add(trial.trial_id)
            self._update(trials)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._session()["ended"].add(trial.trial_id)
            self._session()["errored"][trial.trial_id] = "ERROR"
            self._update(trials)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            s = self._session()
            s["num_trials"] = len(trials)
            s["statuses"] = {t.trial_id: t.status for t in trials}

    return _publish(SweepProgress, "SweepProgress")


def _interrupted(session: Mapping[str, Any], total: int) -> bool:
    """An ended ``fit`` was interrupted when a trial started in this session never ended, a trial
    is still pending/running, or fewer trials than asked for exist."""
    if session.get("started", set()) - session.get("ended", set()):
        return True
    if any(s not in _FINISHED for s in session.get("statuses", {}).values()):
        return True
    return session.get("num_trials", 0) < total


# ------------------------------------------------------------------------------------------------
# The study file
def _read_study(study_dir: Path) -> dict[str, Any]:
    path = study_dir / STUDY_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the study file: {exc}") from None
    if not isinstance(data, dict) or "options" not in data:
        raise ConfigError(f"{path}: not a fedtune sweep study file (no 'options')")
    return data


def _write_study(study_dir: Path, data: Mapping[str, Any]) -> None:
    import tempfile

    study_dir.mkdir(parents=True, exist_ok=True)
    path = study_dir / STUDY_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{STUDY_FILE}.", suffix=".tmp", dir=study_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def latest_study(output: str | os.PathLike[str]) -> str | None:
    """Name of the most recently started sweep study in ``output`` (by ``study.json``'s
    ``started_at``), or None."""
    best: tuple[str, str] | None = None
    root = Path(output)
    if not root.is_dir():
        return None
    for p in root.glob(f"*/{STUDY_FILE}"):
        try:
            started = str(json.loads(p.read_text()).get("started_at", ""))
        except (OSError, ValueError):
            continue
        if best is None or started > best[0]:
            best = (started, p.parent.name)
    return best[1] if best else None


def _studies_in(output: Path) -> list[str]:
    return sorted(p.parent.name for p in output.glob(f"*/{STUDY_FILE}")) if output.is_dir() else []


# ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _tune_env(verbose: bool) -> Iterator[None]:
    """Environment and loggers of Tune's driver loop: experiment snapshots every
    :data:`EXPERIMENT_SNAPSHOT_S`, no per-trial CSV/JSON/TensorBoard files (the Arrow store has
    every result), and without ``--verbose`` no Tune tables or INFO logs (the live view shows
    progress). Restored afterwards."""
    env = {"TUNE_GLOBAL_CHECKPOINT_S": str(EXPERIMENT_SNAPSHOT_S), "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
    if not verbose:
        env["RAY_AIR_NEW_OUTPUT"] = "0"  # the legacy engine honours verbose=0; the new one prints a header
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if k == "TUNE_GLOBAL_CHECKPOINT_S" and os.environ.get(k):
            continue
        os.environ[k] = v
    loggers = [logging.getLogger(n) for n in ("ray.tune", "ray.train", "ray.air", "optuna")]
    levels = [lg.level for lg in loggers]
    import optuna

    optuna_level = optuna.logging.get_verbosity()
    if not verbose:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)
        optuna.logging.set_verbosity(optuna_level)


class _Study:
    """One sweep invocation: the plan, the study file, Ray, the view; runs every phase."""

    def __init__(self, plan: StudyPlan, data: dict[str, Any], console: Any, trainable: Any = None):
        self.plan = plan
        self.data = data
        self.console = console
        self.opts = plan.options
        self.trainable = trainable
        self.warnings: list[str] = []
        self.view = _View(plan, console, live=not self.opts.verbose)
        self.cap: int | None = None

    def save(self) -> None:
        self.data["updated_at"] = _now()
        _write_study(self.plan.study_dir, self.data)

    def search_state(self, key: str) -> dict[str, Any]:
        return self.data.setdefault("searches", {}).setdefault(key, {"status": "pending"})

    # -- phases ----------------------------------------------------------------------------------
    def run(self) -> None:
        import ray

        if self.trainable is None:
            from fedtune.tune.trainable import fedtune_trainable

            self.trainable = fedtune_trainable()
        self.cap, warning = concurrency_cap(list(self._probe_configs()), self.opts.max_concurrent,
                                            ray.cluster_resources())  # bundles planned on the live cluster
        if warning:
            self.warnings.append(warning)
            self.console.print(f"[yellow]warning: {warning}[/yellow]")
        self.data["max_concurrent"] = self.cap
        self.save()
        _ACTIVE["view"] = self.view
        # Tune's saved experiment (tuner.pkl, searcher state) holds the Optuna storage pickled where
        # the study was created; while this study runs, it unpickles onto this study directory.
        _ACTIVE["study_dir"] = self.plan.study_dir
        self.view.start()
        try:
            with _tune_env(self.opts.verbose):
                for search in self.plan.searches:
                    self.run_search(search)
                if self.opts.seeds > 1:
                    for search in self.plan.searches:
                        self.run_seeds(search)
        finally:
            self.view.stop()
            _ACTIVE["view"] = None
            _ACTIVE.pop("study_dir", None)

    def _probe_configs(self) -> Iterator[dict[str, Any]]:
        from fedtune.tune.spaces import load_space, strip_switches

        for s in self.plan.searches:
            yield {**self.plan.fixed[s.key], **strip_switches(load_space(s.space).defaults())}

    def _run_config(self, name: str, key: str, total: int):
        from ray import tune

        from fedtune.tune.callback import ArrowCallback

        progress = _progress_callback_class()(key, self._rounds(), self.plan.metrics[0], self.plan.modes[0], total)
        return tune.RunConfig(
            name=name, storage_path=str(self.plan.tune_path),
            callbacks=[ArrowCallback(str(self.plan.study_dir.parent), self.plan.name), progress],
            verbose=1 if self.opts.verbose else 0, log_to_file=False,
            failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False))

    def _restore(self, exp_dir: Path) -> Any:
        """``Tuner.restore`` of ``exp_dir`` (in this study directory, wherever the study was created):
        Tune takes the experiment's location from ``exp_dir``; the Optuna storage unpickles onto
        this study (``_ACTIVE["study_dir"]``); the Arrow callback pickled in ``tuner.pkl`` is
        pointed at this study directory too, so a copied or moved study writes only here."""
        from ray import tune

        from fedtune.results import ResultsStore
        from fedtune.tune.callback import ArrowCallback

        tuner = tune.Tuner.restore(str(exp_dir), trainable=self.trainable, resume_unfinished=True,
                                   resume_errored=False)
        run_config = tuner._local_tuner.get_run_config()  # Ray keeps the callbacks of the first run
        for cb in run_config.callbacks or []:
            if isinstance(cb, ArrowCallback):
                cb.store = ResultsStore(self.plan.study_dir.parent, self.plan.name)
                cb.study = cb.store.study
        return tuner

    def _rounds(self) -> int:
        return int(next(iter(self.plan.fixed.values())).get("rounds") or RunConfig().rounds)

    def _fit(self, tuner: Any, key: str, tune_name: str, total: int) -> None:
        state = self.search_state(key)
        state.update(status="running", tune_dir=f"{TUNE_DIR}/{tune_name}")  # relative to the study dir
        self.save()
        _SESSIONS.pop(key, None)
        row = self.view.row(key, total)
        row["state"] = "starting"
        tuner.fit()
        session = _SESSIONS.get(key, {})
        if _interrupted(session, total):
            row["state"] = "interrupted"
            state["status"] = "interrupted"
            self.save()
            raise StudyInterrupted(f"study '{self.plan.name}' was interrupted during search '{key}'; continue it "
                                   f"with: fedtune sweep --resume --name {self.plan.name} --output "
                                   f"{self.plan.study_dir.parent}")
        row["state"] = "done"

    def run_search(self, search: Search) -> None:
        from ray import tune

        from fedtune.tune.spaces import load_space

        state = self.search_state(search.key)
        total = self.opts.num_samples
        if state.get("status") == "done":
            self.view.row(search.key, total)["state"] = "done (earlier run)"
            return
        exp_dir = self.plan.tune_path / search.tune_name
        storage = optuna_storage_url(self.plan.study_dir)
        study_name = search.optuna_study(self.plan.name)
        state.update(optuna_study=study_name, algorithm=search.algorithm, target_domain=search.target,
                     space=_relative(self.plan.study_dir, search.space))
        if _restorable(exp_dir):
            _searcher_class(), _progress_callback_class(), _storage_class()  # what Tune's saved state refers to
            tuner = self._restore(exp_dir)
        else:
            import optuna

            space = load_space(search.space)
            sampler = make_sampler(self.opts.sampler, self.opts.sampler_seed + search.trial_seed, total)
            searcher = _searcher_class()(
                space.optuna_define_by_run, metrics=self.plan.metrics, modes=self.plan.modes,
                rounds=self._rounds(), fixed=self.plan.fixed[search.key], sampler=sampler,
                study_name=study_name, storage=optuna_storage(self.plan.study_dir),
                first_point=space.default_point())
            scheduler = make_scheduler(self.opts.scheduler, self.plan.metrics[0], self.plan.modes[0], self._rounds(),
                                       self.opts.grace_period, self.opts.reduction_factor)
            tuner = tune.Tuner(
                self.trainable, param_space=dict(self.plan.fixed[search.key]),
                tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=total,
                                            max_concurrent_trials=self.cap, reuse_actors=True,
                                            trial_dirname_creator=trial_dirname),
                run_config=self._run_config(search.tune_name, search.key, total))
        self._fit(tuner, search.key, search.tune_name, total)
        orphans = reconcile_optuna(optuna_storage(self.plan.study_dir), study_name)
        state.update(status="done", ended_at=_now(), orphaned_trials=orphans)
        self.save()

    def run_seeds(self, search: Search) -> None:
        from ray import tune

        key = f"{search.key} seeds"
        state = self.search_state(key)
        seeds = seeds_for(self.plan.base_seed, self.opts.seeds)
        extra = seeds[1:]
        total = len(extra)
        if state.get("status") in ("done", "skipped"):
            self.view.row(key, total)["state"] = f"{state['status']} (earlier run)"
            return
        name = f"{search.tune_name}--seeds"
        exp_dir = self.plan.tune_path / name
        if _restorable(exp_dir):
            _progress_callback_class()
            tuner = self._restore(exp_dir)
        else:
            try:
                chosen = selected_config(self.plan.study_dir, search, self.plan.base_seed, self.opts.protocol())
            except ConfigError as exc:  # e.g. every trial of the search failed: the other searches go on
                state.update(status="skipped", reason=str(exc))
                self.warnings.append(str(exc))
                self.view.row(key, total)["state"] = "skipped"
                self.console.print(f"[yellow]warning: {exc}[/yellow]")
                self.save()
                return
            state.update(selected_trial=chosen["trial_id"], seeds=seeds, config=chosen["config"],
                         algorithm=search.algorithm, target_domain=search.target)
            config = {**chosen["config"], "output": self.plan.fixed[search.key]["output"],
                      "name": self.plan.name, "seed": tune.grid_search(extra)}
            tuner = tune.Tuner(
                self.trainable, param_space=config,
                tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=self.cap, reuse_actors=True,
                                            trial_dirname_creator=trial_dirname),
                run_config=self._run_config(name, key, total))
        self._fit(tuner, key, name, total)
        state.update(status="done", ended_at=_now(),
                     trial_ids=[state.get("selected_trial")] + [_trial_id({**state["config"], "seed": s})
                                                               for s in extra])
        self.save()


def repair_round_files(study_dir: Path, console: Any = None) -> list[str]:
    """``--resume``: every unreadable round file (truncated, not Parquet) is renamed to
    ``*.corrupt`` and its rows are computed again: a trial with a row in ``trials.parquet`` is
    re-run from its stored configuration for the rounds it had done (a run is deterministic given
    its configuration, so the rows are the same but for timings); a trial without one (it was
    running) is left to Tune, which continues it. Returns one warning per file. An unreadable
    ``trials.parquet`` is an error naming it (its rows cannot be recomputed)."""
    from fedtune import results
    from fedtune.runtime.driver import FederatedRun, round_row

    bad = results.corrupt_files(study_dir, "rounds")
    if not bad:
        return []
    trials = {}
    if (study_dir / results.TRIALS_FILE).is_file():
        trials = {r["trial_id"]: r for r in results.load(study_dir, "trials").to_pylist()}
    store = results.ResultsStore(study_dir.parent, study_dir.name)
    notes = []
    for path in bad:
        moved = results.quarantine(path)
        trial_id = path.stem
        row = trials.get(trial_id)
        if row is None or not row.get("config_json") or not row.get("rounds_done"):
            note = f"round file {path} was unreadable: moved to {moved.name}; its trial is re-run if unfinished"
        else:
            config = json.loads(row["config_json"])
            config.update(output=str(study_dir.parent), name=study_dir.name)
            cfg = RunConfig.from_dict(config, source=f"trials.parquet row of {trial_id}")
            if cfg.trial_id() != trial_id:
                raise ConfigError(f"round file {path} was unreadable (moved to {moved.name}) and the configuration "
                                  f"stored for trial {trial_id} gives trial id {cfg.trial_id()}; delete the trial's "
                                  "row from trials.parquet to have it re-run")
            rows = []
            with FederatedRun(cfg) as fr:
                for _ in range(int(row["rounds_done"])):
                    rows.append(round_row(cfg, fr, trial_id, fr.step()))
            store.write_rounds(trial_id, rows)
            note = (f"round file {path} was unreadable: moved to {moved.name}; its {len(rows)} rounds were "
                    "re-run (deterministic) and written again")
        notes.append(note)
        if console is not None:
            console.print(f"[yellow]warning: {note}[/yellow]")
    return notes


def trial_dirname(trial: Any) -> str:
    """Tune's folder of a trial: its Tune id (Tune's default lists the whole config)."""
    return f"trial_{trial.trial_id}"


def _restorable(exp_dir: Path) -> bool:
    """Tune can restore ``exp_dir``: it has Tune's ``tuner.pkl`` and an experiment snapshot (a
    driver killed before the first snapshot left nothing to restore: the search starts again,
    continuing the same Optuna study)."""
    from ray import tune

    return tune.Tuner.can_restore(str(exp_dir)) and any(exp_dir.glob("experiment_state-*.json"))


def _trial_id(config: Mapping[str, Any]) -> str:
    from fedtune.tune.spaces import strip_switches

    return RunConfig.from_dict(strip_switches(dict(config))).trial_id()


def selected_config(study_dir: Path, search: Search, seed: int, selection: str) -> dict[str, Any]:
    """The configuration the report selects for ``search`` among its seed-``seed`` trials
    (:mod:`fedtune.selection`: the highest protocol score at the reported round; ties: first
    trial id), with its trial id."""
    from fedtune import results
    from fedtune.tune.report import make_report

    report = make_report(study_dir, selection=selection, plots=False, write=False)
    sel = report.selected
    picks = sel[(sel["algorithm"] == search.algorithm) & (sel["seed"] == seed)] if not sel.empty else sel
    if search.target is not None and not picks.empty:
        picks = picks[picks["domain"] == str(search.target)]
    if picks.empty:
        raise ConfigError(f"--seeds: search '{search.key}' has no trial with a finite "
                          f"{_protocol.SCORE[selection]} to select; nothing to re-run")
    trial_id = str(picks.iloc[0]["trial_id"])
    trials = results.load(study_dir, "trials").to_pandas()
    row = trials[trials["trial_id"] == trial_id]
    if row.empty or not isinstance(row.iloc[-1].get("config_json"), str):
        raise ConfigError(f"--seeds: selected trial {trial_id} has no configuration in trials.parquet")
    config = json.loads(row.iloc[-1]["config_json"])
    params = config.pop("params", {}) or {}
    keep = {k: v for k, v in config.items() if k not in ("output", "name")}
    keep.update(params)
    return {"trial_id": trial_id, "config": keep}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------------
def run_sweep(opts: SweepOptions, *, resume: bool = False, console: Any = None, trainable: Any = None,
              on_ray: Callable[[], None] | None = None) -> SweepResult:
    """Run (or, with ``resume``, continue) the study ``opts`` describes; see the module docstring.

    Validates everything before Ray starts; starts a local Ray (or joins ``opts.address``)
    unless Ray is already initialised, and shuts down only a Ray it started. ``trainable``
    replaces :func:`fedtune.tune.trainable.fedtune_trainable` (tests). Raises ConfigError on bad
    input and :class:`StudyInterrupted` when the study was interrupted (``--resume`` continues it).
    """
    from rich.console import Console

    console = console or Console()
    t0 = time.time()
    output = Path(_abs(opts.output) or "fedtune_results")
    if resume:
        name = opts.name or latest_study(output)
        if name is None:
            raise ConfigError(f"--resume: no sweep study in '{output}' (no */{STUDY_FILE}); start one without --resume")
        study_dir = output / name
        if not (study_dir / STUDY_FILE).is_file():
            known = _studies_in(output)
            raise ConfigError(f"--resume: no study '{name}' in '{output}' (no {study_dir / STUDY_FILE}); "
                              f"studies there: {', '.join(known) or 'none'}")
        data = _read_study(study_dir)
        saved = SweepOptions.from_json(data["options"])
        saved.address, saved.verbose, saved.report, saved.output = opts.address, opts.verbose, opts.report, str(output)
        saved.name = name
        saved.spaces = [str(_study_space(study_dir, p)) for p in saved.spaces]
        plan = plan_study(saved, name=name)
        data.setdefault("resumed_at", []).append(_now())
    else:
        if is_default_study(opts):
            opts = apply_default_study(opts)
        plan = plan_study(opts)
        if (plan.study_dir / STUDY_FILE).exists() or (plan.study_dir / TUNE_DIR).exists():
            raise ConfigError(f"option '--name': study '{plan.name}' already exists in '{output}'; continue it with "
                              f"--resume --name {plan.name}, or choose another --name")
        opts, plan = _snapshot_spaces(opts, plan)
        data = {"study": plan.name, "started_at": _now(), "selection": opts.protocol(),
                "trial_seeds": opts.trial_seeds,
                "metric": plan.metrics, "modes": plan.modes,
                "algorithms": list(dict.fromkeys(s.algorithm for s in plan.searches)),
                "targets": plan.targets, "protocol": "leave-one-domain-out" if opts.target_domain == "all" else "single",
                "sampler": opts.sampler, "scheduler": opts.scheduler, "seeds": seeds_for(plan.base_seed, opts.seeds),
                "options": {**opts.to_json(), "name": plan.name, "output": str(output),
                            "spaces": [_relative(plan.study_dir, p) for p in opts.spaces]},
                "searches": {s.key: {"status": "pending", "algorithm": s.algorithm, "target_domain": s.target,
                                     "space": _relative(plan.study_dir, s.space),
                                     "optuna_study": s.optuna_study(plan.name)}
                             for s in plan.searches},
                "trial_seed_of": {s.key: s.trial_seed for s in plan.searches},
                "optuna_storage": OPTUNA_FILE, "tune_dir": TUNE_DIR}
    import ray

    from fedtune.runtime.driver import connect_ray

    base_cfg = RunConfig.from_dict({k: v for k, v in plan.fixed[plan.searches[0].key].items()},
                                   source="study").replace(address=opts.address)
    from fedtune.runtime.driver import sigterm_as_interrupt

    started_ray = connect_ray(base_cfg, verbose=opts.verbose)
    study = _Study(plan, data, console, trainable)
    try:
        # ray.init made SIGTERM a sys.exit; make it Ctrl-C again (Tune's graceful stop, exit 130).
        with sigterm_as_interrupt():
            if on_ray is not None:
                on_ray()
            if resume:
                study.warnings.extend(repair_round_files(plan.study_dir, console))
            study.run()
    finally:
        if started_ray:
            ray.shutdown()
    result = SweepResult(plan.study_dir, plan.name, dict(data.get("searches", {})), elapsed_s=time.time() - t0,
                         warnings=study.warnings)
    data["completed_at"] = _now()
    _write_study(plan.study_dir, data)
    if opts.report:
        from fedtune.tune.report import make_report

        result.report = make_report(plan.study_dir)
        result.report_path = result.report.markdown_path
    return result


SPACES_DIR = "spaces"
"""A study's own copy of the search spaces it runs (``<study>/spaces/<algorithm>.yaml``)."""


def _snapshot_spaces(opts: SweepOptions, plan: StudyPlan) -> tuple[SweepOptions, StudyPlan]:
    """Copy every search space of a new study into ``<study>/spaces/`` and re-plan on the copies, so
    the study folder is self-contained: ``--resume`` after a move, a copy or an upgrade of fedtune's
    built-in spaces reads the spaces the study started with."""
    import shutil

    folder = plan.study_dir / SPACES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    copies: dict[str, str] = {}
    for search in plan.searches:
        if search.algorithm not in copies:
            target = folder / f"{search.algorithm}.yaml"
            shutil.copyfile(search.space, target)
            copies[search.algorithm] = str(target)
    new = copy.deepcopy(opts)
    new.spaces = list(copies.values())
    new.algorithms = list(copies)
    return new, plan_study(new, name=plan.name)


def _relative(study_dir: Path, path: str) -> str:
    """``path`` relative to the study folder when it lies inside it (study.json stays relocatable)."""
    try:
        return str(Path(path).resolve().relative_to(Path(study_dir).resolve()))
    except ValueError:
        return str(path)


def _study_space(study_dir: Path, path: str) -> Path:
    """A saved space path resolved for the study folder as it is now: relative paths (what this version
    writes) against the folder; an absolute one that no longer exists (a study written by an older
    version, then moved) by its file name under ``<study>/spaces/`` when there."""
    p = Path(path)
    if not p.is_absolute():
        return study_dir / p
    if not p.exists() and (study_dir / SPACES_DIR / p.name).is_file():
        return study_dir / SPACES_DIR / p.name
    return p


# ------------------------------------------------------------------------------------------------
# CLI
def add_sweep_parser(sub: Any) -> Any:
    """Add ``fedtune sweep`` to the subcommands ``sub`` of the ``fedtune`` parser."""
    p = sub.add_parser(
        "sweep", help="hyperparameter study: Ray Tune + Optuna over search spaces, with resume and seeds",
        description="Search each algorithm's hyperparameters (search_spaces/<algorithm>.yaml or SPACE files) with "
                    "Ray Tune + Optuna; every round goes to OUTPUT/STUDY/. Without arguments: a small default "
                    "study on rotated-digits comparing " + ", ".join(DEFAULT_ALGORITHMS) + ".")
    p.add_argument("spaces", nargs="*", metavar="SPACE.yaml", help="search-space files (one per algorithm)")
    p.add_argument("--algorithm", action="append", dest="algorithms", default=[], metavar="NAME",
                   help="algorithm to search (repeatable); default: the SPACE files' algorithms, else fedavg")
    p.add_argument("--dataset", help="dataset (see `fedtune datasets`); default rotated-digits (embedded)")
    p.add_argument("--data-root", metavar="DIR", help="directory holding the dataset's files")
    p.add_argument("--target-domain", metavar="NAME|all",
                   help="held-out target domain; 'all': leave-one-domain-out, one search per target domain")
    p.add_argument("--rounds", type=int, metavar="N", help="federated rounds per trial")
    p.add_argument("--num-samples", type=int, default=None, metavar="N",
                   help="trials per search (default 8; the default study: 4)")
    p.add_argument("--seeds", type=int, default=1, metavar="K",
                   help="re-run each search's selected configuration with K seeds (mean ± standard error over the "
                        "re-runs; excludes selection variance: see --trial-seeds)")
    p.add_argument("--max-concurrent", type=int, metavar="N", help="trials at once (default: as many as fit)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="fifo", help="fifo (all rounds) or asha (early stop)")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler (seeded; nsga2: multi-objective)")
    p.add_argument("--metric", metavar="NAME[,NAME]",
                   help="objective metric(s), first = selection metric (its protocol: val_acc/val_loss -> val, "
                        "target_val_acc/target_val_loss -> target-val, oracle_acc/oracle_loss -> oracle); default "
                        "the protocol's accuracy, "
                        "with nsga2 also server_s")
    p.add_argument("--selection", choices=SELECTIONS, default=None,
                   help="val (default): by source validation (honest); target-val (fda only): by the target "
                        "client's held-out labels; oracle: by a held-out slice of the target domain, last round "
                        "(DomainBed's test-domain validation; labelled oracle)")
    p.add_argument("--trial-seeds", type=int, default=1, metavar="K",
                   help="repeat every search K times with other seeds, data seeds and sampler seeds; the report's "
                        "± is then over the K searches (includes selection variance)")
    p.add_argument("--grace-period", type=int, default=1, metavar="N", help="ASHA: rounds before a trial may stop")
    p.add_argument("--reduction-factor", type=float, default=2.0, metavar="F", help="ASHA: rung reduction factor")
    p.add_argument("--sampler-seed", type=int, default=0, metavar="S", help="seed of the Optuna sampler")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to join ('auto' for the running one)")
    p.add_argument("--output", metavar="DIR", default="fedtune_results", help="results directory")
    p.add_argument("--name", metavar="STUDY", help="study name (default sweep-<UTC time>; --resume: the latest)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted study (its saved options)")
    p.add_argument("--no-report", action="store_true", help="do not write report.md and plots at the end")
    p.add_argument("--verbose", action="store_true", help="Ray Tune's own tables and logs instead of the live view")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="set a run field for every trial, e.g. --set local_steps=2 (see `fedtune fields`)")
    return p


_RESUME_FIXED = ("spaces", "algorithms", "dataset", "data_root", "target_domain", "rounds", "num_samples",
                 "max_concurrent", "metric", "selection", "set")


def options_from_args(args: Any) -> SweepOptions:
    """:class:`SweepOptions` from parsed ``fedtune sweep`` arguments."""
    from fedtune.config import parse_set_options

    metric = None
    if args.metric:
        metric = [m.strip() for m in str(args.metric).split(",") if m.strip()]
    opts = SweepOptions(
        spaces=list(args.spaces), algorithms=list(args.algorithms), dataset=args.dataset, data_root=args.data_root,
        target_domain=args.target_domain, rounds=args.rounds,
        num_samples=args.num_samples if args.num_samples is not None else SweepOptions.num_samples,
        seeds=args.seeds, max_concurrent=args.max_concurrent, scheduler=args.scheduler, sampler=args.sampler,
        metric=metric, selection=args.selection, trial_seeds=args.trial_seeds, address=args.address, output=args.output, name=args.name,
        verbose=args.verbose, overrides=parse_set_options(args.set), sampler_seed=args.sampler_seed,
        grace_period=args.grace_period, reduction_factor=args.reduction_factor, report=not args.no_report)
    if args.resume:
        given = [f"--{k.replace('_', '-')}" for k in _RESUME_FIXED
                 if getattr(args, k, None) not in (None, [], False)]
        if given:
            raise ConfigError(f"--resume continues a study with its saved options; {', '.join(given)} cannot "
                              "change them (allowed with --resume: --name, --output, --address, --verbose)")
    return opts


def cmd_sweep(args: Any) -> int:
    """``fedtune sweep``: run the study, print the results table and the paths."""
    from rich.console import Console

    console = Console()
    opts = options_from_args(args)
    try:
        result = run_sweep(opts, resume=args.resume, console=console)
    except StudyInterrupted as exc:
        print(f"fedtune: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside Tune's loop
        name = opts.name or latest_study(Path(_abs(opts.output) or "fedtune_results")) or "STUDY"
        print(f"fedtune: the study is interrupted; continue it with: fedtune sweep --resume --name {name} "
              f"--output {_abs(opts.output)}", file=sys.stderr)
        raise
    if result.report is not None:
        result.report.print(console)
    print(f"study:   {result.study_dir}")
    print(f"rounds:  {result.study_dir / 'rounds'}")
    print(f"trials:  {result.study_dir / 'trials.parquet'}")
    print(f"optuna:  {optuna_storage_url(result.study_dir)} (studies {result.name}/...)")
    if result.report_path is not None:
        print(f"report:  {result.report_path}")
    print(f"elapsed: {result.elapsed_s:.0f}s")
    if not _any_completed(result.study_dir):
        print("fedtune: no trial of the study completed (see the status and error columns of trials.parquet)",
              file=sys.stderr)
        return 3
    return 0


def _any_completed(study_dir: Path) -> bool:
    from fedtune import results

    if not (study_dir / results.TRIALS_FILE).is_file():
        return False
    return "completed" in set(results.load(study_dir, "trials").column("status").to_pylist())
