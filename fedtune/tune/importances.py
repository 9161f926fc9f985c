"""Optuna's parameter importances of a study's searches, for ``fedtune report``.

:func:`optuna_importances` reads ``STUDY_DIR/optuna.db`` and computes fANOVA importances
(seed 0) of every Optuna study in it with ≥ 2 complete trials (the first objective of a
multi-objective study); every study it cannot do gets a note saying why.

>>> import tempfile
>>> optuna_importances(tempfile.mkdtemp())[1][0][:45]
'Optuna importances: no optuna.db in the study'
"""

from __future__ import annotations

import os
from typing import Any

from fedtune.results.study_dir import OPTUNA_FILE, StudyDir

__all__ = ["optuna_importances"]


def optuna_importances(study_dir: str | os.PathLike[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """(Optuna study name -> {parameter: importance}, notes on the studies left out)."""
    path = StudyDir(study_dir).optuna_db
    if not path.is_file():
        return {}, [(f"Optuna importances: no {OPTUNA_FILE} in the study directory (not an Optuna sweep, "
                     "or its Optuna study was kept in memory)")]
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{path}"
    try:
        names = optuna.get_all_study_names(storage=storage)
    except Exception as exc:  # noqa: BLE001 -- a corrupt or foreign file: say so, keep the report
        return {}, [f"Optuna importances: cannot read {path}: {exc}"]
    if not names:
        return {}, [f"Optuna importances: {path} holds no study"]
    out: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    for name in sorted(names):
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        target = None
        if len(study.directions) > 1:  # the first objective is the selection metric
            target = _first_objective
            notes.append(f"Optuna importances of study '{name}': multi-objective study; importances of its "
                         "first objective")
        if len(complete) < 2:
            notes.append(f"Optuna importances of study '{name}': {len(complete)} complete trial(s); "
                         "at least 2 are needed")
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
    return out, notes


def _first_objective(trial: Any) -> float:
    return float(trial.values[0])
