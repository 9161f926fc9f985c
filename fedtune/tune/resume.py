"""Continuing a sweep study (``fedtune sweep --resume``): its saved options and search spaces read
back, the check that Tune can restore a search, and round files that became unreadable computed
again, and ``trials.parquet`` rows of trials that ended just before the driver stopped written.
:mod:`fedtune.tune.sweep` runs the study itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results.study_dir import SPACES_DIR, STUDY_FILE, StudyDir, latest_study, read_study, studies_in
from fedtune.tune.plan import StudyPlan, SweepOptions, plan_study
from fedtune.tune.tune_storage import restorable  # re-exported (it was defined here)

__all__ = ["FAILED_UNRECORDED", "recover_trial_rows", "repair_round_files", "restorable", "resumed_study", "study_space"]


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
    from fedtune import results
    from fedtune.runtime.driver import FederatedRun, round_row

    bad = results.corrupt_files(study_dir, "rounds")
    if not bad:
        return []
    trials = {}
    if StudyDir(study_dir).trials.is_file():
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


FAILED_UNRECORDED = "the trial raised; the driver stopped before its error text was recorded"
"""``error`` of a failed trial's ``trials.parquet`` row rebuilt by :func:`recover_trial_rows`."""


def recover_trial_rows(study_dir: Path, optuna_trials: Sequence[Any], console: Any = None) -> list[str]:
    """``--resume``: the ``trials.parquet`` rows a killed driver did not write. Tune tells the
    searcher that a trial ended before it tells the Arrow callback, so a driver killed between
    the two leaves a trial that Optuna records as finished (COMPLETE, PRUNED, or FAIL as
    diverged, failed or without metric) whose round file is whole but whose ``trials.parquet``
    row is missing; a failed one gets status ``failed`` with :data:`FAILED_UNRECORDED` as its
    error (the error text was not saved). The resumed searcher never runs that configuration again (it already ran), so its
    row is rebuilt here from its round rows and Optuna's record of the trial (configuration,
    start and end times). Returns one note per row written."""
    from optuna.trial import TrialState

    from fedtune import results
    from fedtune.results import status
    from fedtune.tune.callback import trial_row
    from fedtune.tune.trainable import trial_run_config

    files = StudyDir(study_dir)
    have = set(results.load(study_dir, "trials").column("trial_id").to_pylist()) if files.trials.is_file() else set()
    store = results.ResultsStore(study_dir.parent, study_dir.name)
    notes = []
    for t in optuna_trials:
        trial_id, config = t.user_attrs.get("fedtune_trial_id"), t.user_attrs.get("config")
        failed = t.state == TrialState.FAIL and t.user_attrs.get("fedtune_status") == status.FAILED
        ran = failed or t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
            t.state == TrialState.FAIL and t.user_attrs.get("fedtune_status") in (status.DIVERGED, status.NO_METRIC))
        if not ran or not trial_id or not isinstance(config, dict) or trial_id in have:
            continue
        path = store.rounds_path(trial_id)
        rows = sorted((r for r in results.load(path).to_pylist() if r.get("round") is not None),
                      key=lambda r: int(r["round"])) if path.is_file() else []
        cfg = trial_run_config(config)
        if not rows or cfg.trial_id() != trial_id:
            continue
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
        error = FAILED_UNRECORDED if failed else None
        store.write_trial(trial_row(rows, cfg, study=store.study, trial_id=trial_id, error=error,
                                    started_at=t.datetime_start, ended_at=t.datetime_complete,
                                    restarts=max(int(r.get("attempt") or 0) for r in rows)))
        have.add(trial_id)
        note = (f"trial {trial_id} ended just before the driver stopped, before its {files.trials.name} row was "
                f"written: the row was rebuilt from its {len(rows)} round rows")
        notes.append(note)
        if console is not None:
            console.print(f"[yellow]note: {note}[/yellow]")
    return notes


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
