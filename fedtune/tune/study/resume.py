"""Continuing a sweep study (``fedtune sweep --resume``): its saved options and search spaces read
back, the check that Tune can restore a search, and round files that became unreadable computed
again, and ``trials.parquet`` rows of trials that ended just before the driver stopped written.
:mod:`fedtune.tune.study.sweep` runs the study itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.data.registry import get_dataset
from fedtune.errors import ConfigError, shown
from fedtune.plugins import check_plugin_records
from fedtune.results import optuna_url, status
from fedtune.results.study_dir import (SPACES_DIR, STUDY_FILE, StudyDir, latest_study, read_study, read_study_if_any,
                                       studies_in)
from fedtune.runtime.driver import FederatedRun, round_row
from fedtune.tune.common.state_signatures import check_experiment
from fedtune.tune.study.options import SweepOptions, resume_fixed_dests
from fedtune.tune.study.plan import StudyPlan, abs_path, plan_study
from fedtune.tune.tuner.storage import check_storage_path, experiments_in, restorable, set_aside_unreadable_state

__all__ = ["FAILED_UNRECORDED", "RESUME_ALLOWED", "RESUME_FIXED", "check_optuna_storage", "check_resume_flags",
           "check_study_experiments", "rebuild_trial_rows", "recover_seed_rows", "recover_trial_rows", "repair_round_files",
           "resumed_study", "set_aside_unreadable_snapshots", "study_space"]


def resumed_study(opts: SweepOptions, output: Path) -> tuple[StudyPlan, dict[str, Any]]:
    """The plan and ``study.json`` of the study ``--resume`` continues: ``opts.name`` in ``output``,
    else the most recently started one there. The saved options count, but for where and how it
    runs now (``address``, ``verbose``, ``report``, ``output``)."""
    name = opts.name or latest_study(output)
    if name is None:
        raise ConfigError(f"--resume: no sweep study in '{output}' (no */{STUDY_FILE}); start one without --resume")
    study_dir = output / name
    if not (study_dir / STUDY_FILE).is_file():
        known = studies_in(output)
        raise ConfigError(f"--resume: no study '{name}' in '{output}' (no {study_dir / STUDY_FILE}); "
                          f"studies there: {', '.join(known) or 'none'}")
    data = read_study(study_dir)
    # its plugins first (what its configs name), each the same code it ran with: else one line
    check_plugin_records(data.get("plugins") or [], where=f"study '{name}'")
    saved = SweepOptions.from_json(data["options"])
    saved.address, saved.verbose, saved.report, saved.output = opts.address, opts.verbose, opts.report, str(output)
    saved.name = name
    saved.spaces = [str(study_space(study_dir, p)) for p in saved.spaces]
    return plan_study(saved, name=name), data


def repair_round_files(study_dir: Path, console: Any = None) -> list[str]:
    """``--resume``: every unreadable round file (truncated, not Parquet) is renamed to
    ``*.corrupt`` and its rows are computed again: a trial with a row in ``trials.parquet`` is
    re-run from its stored configuration for the rounds it had done (a run is deterministic given
    its configuration, so the rows are the same but for timings); a trial without one (it was
    running) is left to Tune, which continues it. Returns one warning per file. An unreadable
    ``trials.parquet`` is an error naming it (its rows cannot be recomputed)."""
    # lazy: keeps pyarrow out of this module's import
    from fedtune.results.store import ResultsStore, corrupt_files, load, quarantine

    bad = corrupt_files(study_dir, "rounds")
    if not bad:
        return []
    trials = {}
    if StudyDir(study_dir).trials.is_file():
        trials = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    store = ResultsStore(study_dir.parent, study_dir.name)
    notes = []
    for path in bad:
        moved = quarantine(path)
        trial_id = path.stem
        row = trials.get(trial_id)
        if row is None or not row.get("config_json") or not row.get("rounds_done"):
            note = f"round file {path} was unreadable: moved to {moved.name}; its trial is re-run if unfinished"
        else:
            config = json.loads(row["config_json"])
            config.update(output=str(study_dir.parent), name=study_dir.name)
            cfg = FederatedRunConfig.from_dict(config, source=f"trials.parquet row of {trial_id}")
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


def set_aside_unreadable_snapshots(plan: StudyPlan, console: Any = None) -> list[str]:
    """``--resume``: every Tune experiment of the study whose newest snapshot cannot be read has it
    set aside (:func:`fedtune.tune.tuner.storage.set_aside_unreadable_state`), so Tune restores the
    one before it, or the search's fit starts again on its Optuna study, with the study's options.
    Returns one warning per snapshot set aside."""
    from rich.markup import escape  # lazy: keeps rich out of this module's import

    notes = []
    for experiment in experiments_in(plan.tune_storage):
        for note in set_aside_unreadable_state(experiment):
            notes.append(note)
            if console is not None:
                console.print(f"[yellow]warning: {escape(note)}[/yellow]", soft_wrap=True)
    return notes


FAILED_UNRECORDED = "the trial raised; the driver stopped before its error text was recorded"
"""``error`` of a failed trial's ``trials.parquet`` row rebuilt by :func:`recover_trial_rows`."""


class _RowRebuilder:
    """Writes the missing ``trials.parquet`` rows of one study from the trials' round files (shared
    by :func:`recover_trial_rows` and :func:`recover_seed_rows`), one note per row."""

    def __init__(self, study_dir: Path, console: Any = None) -> None:
        # lazy: keeps pyarrow out of this module's import
        from fedtune.results.store import ResultsStore, load

        self.files = StudyDir(study_dir)
        self.store = ResultsStore(study_dir.parent, study_dir.name)
        self.have = (set(load(study_dir, "trials").column("trial_id").to_pylist())
                     if self.files.trials.is_file() else set())
        self.console = console
        self.notes: list[str] = []

    def rows(self, trial_id: str) -> list[dict[str, Any]]:
        """The trial's round rows in round order, null columns left out; none without a round file."""
        from fedtune.results.store import load  # lazy: keeps pyarrow out of this module's import

        path = self.store.rounds_path(trial_id)
        if not path.is_file():
            return []
        rows = sorted((r for r in load(path).to_pylist() if r.get("round") is not None),
                      key=lambda r: int(r["round"]))
        return [{k: v for k, v in r.items() if v is not None} for r in rows]

    def write(self, trial_id: str, rows: list[dict[str, Any]], cfg: FederatedRunConfig, note: str, *,
              error: str | None = None, started_at: Any = None, ended_at: Any = None, short: str | None = None) -> None:
        # lazy: keeps ray, pyarrow out of this module's import
        from fedtune.tune.trial.callback import trial_row

        self.store.write_trial(trial_row(rows, cfg, study=self.store.study, trial_id=trial_id, error=error,
                                         started_at=started_at, ended_at=ended_at,
                                         restarts=max(int(r.get("attempt") or 0) for r in rows),
                                         short=short or status.PRUNED))
        self.have.add(trial_id)
        self.notes.append(note)
        if self.console is not None:
            self.console.print(f"[yellow]note: {note}[/yellow]")


def recover_trial_rows(study_dir: Path, optuna_trials: Sequence[Any], console: Any = None) -> list[str]:
    """``--resume``, and each search's end: the ``trials.parquet`` rows a killed driver did not write,
    from the trials' round files and Optuna's record of them (configuration, start and end times).

    * A trial Optuna records as finished (COMPLETE, PRUNED, or FAIL as diverged, failed or without
      metric): Tune tells the searcher that a trial ended before it tells the Arrow callback, so a
      driver killed between the two leaves its round file whole and its row missing. A failed one
      gets status ``failed`` with :data:`FAILED_UNRECORDED` as its error (the error text was not saved).
    * A trial Optuna holds FAIL as ``orphaned`` (:func:`~fedtune.tune.tuner.optuna_search.reconcile_optuna`):
      asked by a driver killed before Tune's next snapshot, so no later driver knew of it or
      continued it, though its first rounds may be on disk. It gets status ``interrupted`` (or what
      its rounds say when they reached the last round, or diverged), so every round file has a row.

    The resumed searcher never runs a finished configuration again. Returns one note per row written."""
    from optuna.trial import TrialState  # lazy: keeps optuna out of this module's import

    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.trial.callback import no_objective_error
    from fedtune.tune.trial.trainable import trial_run_config

    rebuild = _RowRebuilder(study_dir, console)
    for t in optuna_trials:
        trial_id, config = t.user_attrs.get("fedtune_trial_id"), t.user_attrs.get("config")
        told = t.user_attrs.get("fedtune_status") if t.state == TrialState.FAIL else None
        failed, orphaned = told == status.FAILED, told == status.ORPHANED
        ran = failed or t.state in (TrialState.COMPLETE, TrialState.PRUNED) or told in (status.DIVERGED,
                                                                                       status.NO_METRIC)
        if not (ran or orphaned) or not trial_id or not isinstance(config, dict) or trial_id in rebuild.have:
            continue
        rows = rebuild.rows(trial_id)
        cfg = trial_run_config(config)
        if not rows or cfg.trial_id() != trial_id:
            continue
        if orphaned:
            note = (f"trial {trial_id} was left unfinished by a stopped driver after {len(rows)} of {cfg.rounds} "
                    f"rounds and was not continued (Optuna: {status.ORPHANED}): its {rebuild.files.trials.name} row "
                    "is written from its round rows")
        else:
            note = (f"trial {trial_id} had no {rebuild.files.trials.name} row (its driver stopped before writing "
                    f"it, or the file was moved away): rebuilt from its {len(rows)} round rows and Optuna's record "
                    "of the trial")
        error = FAILED_UNRECORDED if failed else (no_objective_error() if told == status.NO_METRIC else None)
        rebuild.write(trial_id, rows, cfg, note, error=error,
                      started_at=t.datetime_start, ended_at=None if orphaned else t.datetime_complete,
                      short=status.INTERRUPTED if orphaned else status.PRUNED)
    return rebuild.notes


def recover_seed_rows(study_dir: Path, data: dict[str, Any], console: Any = None) -> list[str]:
    """``--resume``: the missing ``trials.parquet`` rows of ``--seeds`` re-runs (they are not Optuna
    trials) rebuilt from their round files and the configuration ``study.json`` saved for them, for
    each re-run whose round file holds every round; a shorter one is left to Tune, which continues
    it. Returns one note per row written."""
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.trial.trainable import trial_run_config

    rebuild = _RowRebuilder(study_dir, console)
    for key, state in sorted((data.get("searches") or {}).items()):
        config, seeds = state.get("config"), state.get("seeds") or []
        if not key.endswith(" seeds") or not isinstance(config, dict):
            continue
        for seed in seeds[1:]:
            cfg = trial_run_config({**config, "seed": seed, "output": str(study_dir.parent), "name": study_dir.name})
            trial_id = cfg.trial_id()
            rows = [] if trial_id in rebuild.have else rebuild.rows(trial_id)
            if not rows or int(rows[-1]["round"]) < cfg.rounds:
                continue
            rebuild.write(trial_id, rows, cfg,
                          f"trial {trial_id} (seed {seed} of search '{key[:-len(' seeds')]}') had no "
                          f"{rebuild.files.trials.name} row: rebuilt from its {len(rows)} round rows")
    return rebuild.notes


def check_optuna_storage(plan: StudyPlan, data: dict[str, Any]) -> None:
    """``--resume``: refuse, before anything opens (and so creates) it, an Optuna storage that lost
    the study's searches: ``optuna.db`` deleted or moved, or a shared ``--optuna-storage`` without
    the study's Optuna studies. A search cannot continue without its Optuna trials (the sampler's
    history and the trials Tune will ask about), and an empty storage would silently restart it."""
    # lazy: keeps ray, optuna out of this module's import
    from fedtune.tune.tuner.optuna_search import optuna_storage

    started = [s for s in plan.searches
               if ((data.get("searches") or {}).get(s.key) or {}).get("status") not in (None, "pending")]
    if not started:
        return
    files = StudyDir(plan.study_dir)
    if not plan.options.optuna_storage:
        if files.optuna_db.is_file():
            return
        missing, where = [s.key for s in started], f"'{files.optuna_db}' is missing (deleted or moved)"
    else:
        import optuna  # lazy: keeps optuna out of this module's import

        storage = optuna_storage(plan.study_dir, url=plan.optuna_url)
        names = {st.study_name for st in optuna.get_all_study_summaries(storage, include_best_trial=False)}
        missing = [s.key for s in started if s.optuna_study(plan.name) not in names]
        if not missing:
            return
        where = f"the Optuna storage {plan.options.optuna_storage} has no Optuna study for them"
    raise ConfigError(f"--resume: the Optuna storage of study '{plan.name}' is gone: {where}; search(es) "
                      f"{', '.join(missing)} cannot continue without their Optuna trials. Nothing was changed: the "
                      f"finished trials are intact in {files.trials.name} and {files.rounds_dir.name}/ (fedtune report "
                      f"{plan.study_dir} still works); put the storage back to continue, or start a new study "
                      "(another --name) to run more trials")


def rebuild_trial_rows(plan: StudyPlan, data: dict[str, Any], console: Any = None) -> list[str]:
    """``--resume``: every ``trials.parquet`` row that is missing (a driver killed between a trial's
    end and its row, or a ``trials.parquet`` renamed away as fedtune's message for an unreadable
    one advises) rebuilt, for every search of the study, finished ones included: searched trials
    from their round files and Optuna (:func:`recover_trial_rows`), ``--seeds`` re-runs from their
    round files and ``study.json`` (:func:`recover_seed_rows`)."""
    # lazy: keeps ray, optuna out of this module's import
    from fedtune.tune.tuner.optuna_search import optuna_storage, optuna_trials

    storage = optuna_storage(plan.study_dir, url=plan.optuna_url)
    notes = []
    for search in plan.searches:
        state = (data.get("searches") or {}).get(search.key) or {}
        if state.get("status") in (None, "pending"):
            continue
        notes += recover_trial_rows(plan.study_dir, optuna_trials(storage, search.optuna_study(plan.name)), console)
    return notes + recover_seed_rows(plan.study_dir, data, console)


def study_space(study_dir: Path, path: str) -> Path:
    """A saved space path resolved for the study folder as it is now: relative paths (what this version
    writes) against the folder; an absolute one that no longer exists (a study written by an older
    version, then moved) by its file name under ``<study>/spaces/`` when there."""
    p = Path(path)
    if not p.is_absolute():
        return study_dir / p
    if not p.exists() and (study_dir / SPACES_DIR / p.name).is_file():
        return study_dir / SPACES_DIR / p.name
    return p


_RESUME_ATTRS = resume_fixed_dests()
"""``fedtune sweep`` dests a study keeps from its start -> the :class:`~fedtune.tune.study.options.SweepOptions`
attributes that hold them (declared ``resume_fixed`` at each option, or at its run field)."""
RESUME_FIXED = tuple(_RESUME_ATTRS)
"""Options (argparse dests) a study keeps from its start: given with ``--resume``, they are refused
(each defaults to None on the command line, so "given" is exact)."""
RESUME_ALLOWED = ("--name", "--output", "--address", "--verbose", "--no-report", "--trust-study-files")
"""What ``--resume`` does take: where the study is and how this driver runs and ends."""


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _effective(opts: SweepOptions, dest: str) -> Any:
    """Option ``dest`` of ``opts`` as the study runs it: an unset option as its default (``--knobs``
    all, the dataset's and the rounds' defaults, the selection protocol and the metrics they imply),
    a path made absolute, a storage URL normalised; JSON-plain, so 2 and 2.0 compare equal."""
    if dest == "knobs":
        return opts.knobs or "all"
    if dest in ("selection", "metric"):
        return [opts.protocol(), opts.metrics()]
    if dest == "dataset":
        return opts.dataset or FederatedRunConfig().dataset
    if dest == "rounds":
        return int(opts.rounds or FederatedRunConfig().rounds)
    if dest == "data_root":
        return abs_path(opts.data_root)
    if dest == "perturbation_interval":
        return opts.population_interval(int(opts.rounds or FederatedRunConfig().rounds))
    if dest == "storage_path" and opts.storage_path:
        return check_storage_path(opts.storage_path)
    if dest == "optuna_storage" and opts.optuna_storage:
        return optuna_url.check_optuna_storage(opts.optuna_storage)
    return [_plain(getattr(opts, a)) for a in _RESUME_ATTRS.get(dest, (dest,))]


def _first_domain(opts: SweepOptions) -> str | None:
    """The target domain of a study without ``--target-domain``: its dataset's first domain."""
    fields = {**opts.config_fields, **opts.overrides}
    try:
        ds = get_dataset(opts.dataset or FederatedRunConfig().dataset, root=abs_path(opts.data_root),
                         image_size=fields.get("image_size"), data_seed=int(fields.get("data_seed", 0) or 0))
        return str(ds.info.domains[0])
    except Exception:  # noqa: BLE001 - the data is not here: the two cannot be shown equal
        return None


def _same(dest: str, given: SweepOptions, saved: SweepOptions, study_dir: Path) -> bool:
    """Whether option ``dest`` given with ``--resume`` runs the study as its saved value does."""
    if dest == "spaces":  # the study keeps its own copies: the same text is the same space
        try:
            return ([Path(p).read_text(errors="replace") for p in given.spaces]
                    == [study_space(study_dir, p).read_text(errors="replace") for p in saved.spaces])
        except OSError:
            return False
    if dest == "target_domain" and (given.target_domain is None) != (saved.target_domain is None):
        first = _first_domain(saved)
        return first is not None and str(given.target_domain or first) == str(saved.target_domain or first)
    try:
        return _effective(given, dest) == _effective(saved, dest)
    except ConfigError:  # a value that does not even check: not the saved one
        return False


def _shown_option(opts: SweepOptions, dest: str) -> str:
    """Option ``dest`` of ``opts`` for a message: its value, an unset one as the default it runs with."""
    if dest == "spaces":
        return shown(list(opts.spaces), 120)
    values = [getattr(opts, a) for a in _RESUME_ATTRS.get(dest, (dest,))]
    value = values[0] if len(values) == 1 else values
    if value is None and dest in ("knobs", "dataset", "rounds", "selection", "perturbation_interval"):
        default = opts.protocol() if dest == "selection" else _effective(opts, dest)
        return f"{shown(default, 120)} (unset: the default)"
    if value is None and dest == "target_domain":
        return "None (unset: the dataset's first domain)"
    return shown(value, 120)


def check_resume_flags(given_flags: dict[str, Any], opts: SweepOptions) -> None:
    """Refuse, naming them with the given and the saved value, the study's options
    (:data:`RESUME_FIXED`) given with ``--resume`` that would run the study differently from the
    value it saved; the saved value again is accepted (and changes nothing), also when it is
    spelled differently: an option left unset at the start given now as its default (``--knobs all``,
    the default dataset, ``--selection val``), a relative path to the same folder, 2 for 2.0.
    Without a study to compare with, every one given is refused."""
    given = [k for k in RESUME_FIXED if given_flags.get(k) not in (None, [], False)]
    if not given:
        return
    output = Path(abs_path(opts.output) or "fedtune_results")
    name = opts.name or latest_study(output)
    saved_json = (read_study_if_any(output / name).get("options") if name and (output / name).is_dir() else None)
    if not isinstance(saved_json, dict):
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        raise ConfigError(f"--resume continues a study with its saved options; {flags} cannot change them (no study "
                          f"'{name}' in '{output}' to compare them with; allowed with --resume: "
                          f"{', '.join(RESUME_ALLOWED)}, and the study's saved options again)")
    saved = SweepOptions.from_json(saved_json)
    changed = [k for k in given if not _same(k, opts, saved, output / name)]
    if changed:
        flags = {k: f"--{k.replace('_', '-')}" for k in changed}
        what = ", ".join(f"{flags[k]} given {_shown_option(opts, k)}, the study's {_shown_option(saved, k)}"
                         for k in changed)
        raise ConfigError(f"--resume continues a study with its saved options; {', '.join(flags.values())} cannot "
                          f"change them ({what}); allowed with --resume: {', '.join(RESUME_ALLOWED)}, and the "
                          "study's saved options again")


def check_study_experiments(tune_storage: str, *, study: str, trust: bool = False) -> None:
    """:func:`~fedtune.tune.common.state_signatures.check_experiment` for every folder of a study's
    ``tune_storage``, before Ray starts.

    An experiment Tune cannot restore (a driver killed before Tune's first snapshot) is started
    afresh in its folder, and its ``tuner.pkl`` written anew before anything reads it, so that file
    alone may be unsigned there; any other unsigned pickle is refused even so, or the driver would
    later sign, as its own, a file planted there for the next resume."""
    # lazy: keeps pyarrow out of this module's import
    import pyarrow.fs  # lazy: keeps pyarrow out of this module's import

    text = str(tune_storage)
    if "://" in text:
        fs, path = pyarrow.fs.FileSystem.from_uri(text)
    else:
        fs, path = pyarrow.fs.LocalFileSystem(), str(Path(text).resolve())
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    for info in sorted(infos, key=lambda i: i.path):
        location = f"{text.rstrip('/')}/{PurePosixPath(info.path).name}"
        if info.type == pyarrow.fs.FileType.Directory:
            check_experiment(location, study=study, trust=trust,
                             ignore=() if restorable(location) else ("tuner.pkl",))
