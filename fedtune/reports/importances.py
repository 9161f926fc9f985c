"""A study's Optuna storage as the report reads it, and Optuna's parameter importances of its
searches, for ``fedtune report``.

:func:`study_optuna` opens where the study's Optuna studies are: the ``--optuna-storage`` URL
saved in ``study.json`` (a shared storage holds other studies too: only the names starting with
``<study>/`` are this study's), else ``STUDY_DIR/optuna.db``. :func:`optuna_importances`
computes fANOVA importances (seed 0) of every Optuna study there with ≥ 2 complete trials (the
first objective of a multi-objective study); every study it cannot do gets a note saying why.

>>> import tempfile
>>> optuna_importances(tempfile.mkdtemp())[1][0][:45]
'Optuna importances: no optuna.db in the study'
"""

from __future__ import annotations

import os
from typing import Any

from fedtune.results.optuna_url import journal_path, shown
from fedtune.results.study_dir import OPTUNA_FILE, StudyDir, read_study_if_any

__all__ = ["optuna_importances", "study_optuna", "study_optuna_url"]


def study_optuna_url(study_dir: str | os.PathLike[str]) -> str:
    """The URL of the study's Optuna storage: ``study.json``'s ``--optuna-storage``, else the
    SQLite URL of ``STUDY_DIR/optuna.db``.

    >>> study_optuna_url("/x")
    'sqlite:////x/optuna.db'
    """
    options = read_study_if_any(study_dir).get("options")
    url = options.get("optuna_storage") if isinstance(options, dict) else None
    return str(url) if url else f"sqlite:///{StudyDir(os.path.abspath(study_dir)).optuna_db}"


def study_optuna(study_dir: str | os.PathLike[str]) -> tuple[Any, list[str], list[str]]:
    """(storage, the study's Optuna study names, notes): the storage is what ``optuna.load_study``
    takes (the URL's storage, opened once, or a JournalStorage for ``journal:///PATH``), None when
    there is none to read (notes say why)."""
    url = study_optuna_url(study_dir)
    data = read_study_if_any(study_dir)
    shared = isinstance(data.get("options"), dict) and bool(data["options"].get("optuna_storage"))
    if not shared and not StudyDir(study_dir).optuna_db.is_file():
        if data.get("searches"):  # a fedtune sweep study: it had one
            return None, [], [(f"the study's Optuna storage {OPTUNA_FILE} is missing (deleted or moved): no "
                               "parameter importances; the results above come from trials.parquet and rounds/")]
        return None, [], [(f"no {OPTUNA_FILE} in the study directory (not an Optuna sweep, or its Optuna "
                           "study was kept in memory)")]
    import optuna  # lazy: keeps optuna, numpy out of this module's import

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        path = journal_path(url)
        if path is not None:
            if not os.path.isfile(path):
                return None, [], [f"the study's Optuna journal {path} does not exist"]
            # lazy: keeps optuna, numpy out of this module's import
            from optuna.storages.journal import JournalFileBackend

            storage: Any = optuna.storages.JournalStorage(JournalFileBackend(path))
        else:  # opened once: a URL given to each load_study opens the database again (~0.1 s a study)
            storage = optuna.storages.get_storage(url)
        names = optuna.get_all_study_names(storage=storage)
    except Exception as exc:  # noqa: BLE001 -- a corrupt or foreign file, a server down: say so, keep the report
        return None, [], [f"cannot read {shown(url)}: {exc}"]
    if shared:  # a shared storage holds other studies: only "<study>/..." are this one's
        prefix = f"{data.get('study') or os.path.basename(os.path.abspath(study_dir))}/"
        names = [n for n in names if n.startswith(prefix)]
    if not names:
        return None, [], [f"{shown(url)} holds no study of this one"]
    return storage, sorted(names), []


def optuna_importances(study_dir: str | os.PathLike[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """(Optuna study name -> {parameter: importance}, notes on the studies left out)."""
    storage, names, why = study_optuna(study_dir)
    if storage is None:
        return {}, [f"Optuna importances: {w}" for w in why]
    # lazy: keeps optuna, numpy out of this module's import
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    out: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    few: list[tuple[str, int, int]] = []
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        target = None
        if len(study.directions) > 1:  # the first objective is the selection metric
            target = _first_objective
            notes.append(f"Optuna importances of study '{name}': multi-objective study; importances of its "
                         "first objective")
        searched = {k for t in complete for k in t.params}
        needed = min_trials_for_importances(len(searched))
        if len(complete) < needed:
            few.append((name, len(complete), needed))
        else:
            try:
                imp = optuna.importance.get_param_importances(
                    study, evaluator=FanovaImportanceEvaluator(seed=0), target=target)
            except Exception as exc:  # noqa: BLE001 -- e.g. no parameter common to all trials, or none varies
                notes.append(f"Optuna importances of study '{name}': not computable: {exc}")
                continue
            if not imp:
                notes.append(f"Optuna importances of study '{name}': no parameter appears in every complete trial")
                continue
            out[name] = {k: float(v) for k, v in imp.items()}
    if few:  # one note for all of them: fANOVA on a handful of trials ranks noise
        listed = ", ".join(f"'{n}' ({have} of {need})" for n, have, need in few)
        notes.append(f"Optuna importances: not computed for {len(few)} stud{'y' if len(few) == 1 else 'ies'} with "
                     f"too few complete trials to mean anything (fANOVA needs at least {MIN_IMPORTANCE_TRIALS}, and "
                     f"{TRIALS_PER_PARAMETER} per searched parameter): {listed}")
    return out, notes


MIN_IMPORTANCE_TRIALS = 10
TRIALS_PER_PARAMETER = 5


def min_trials_for_importances(searched: int) -> int:
    """Complete trials an Optuna study needs before its fANOVA importances are shown:
    :data:`MIN_IMPORTANCE_TRIALS`, and :data:`TRIALS_PER_PARAMETER` per searched parameter. Below
    that, the random forest behind fANOVA fits a handful of points and its ranking is noise.

    >>> min_trials_for_importances(1), min_trials_for_importances(5)
    (10, 25)
    """
    return max(MIN_IMPORTANCE_TRIALS, TRIALS_PER_PARAMETER * searched)


def _first_objective(trial: Any) -> float:
    return float(trial.values[0])
