"""What a new ``fedtune sweep`` study writes before its first search: ``study.json``'s first
content and the study's own copy of its search spaces (:mod:`fedtune.tune.sweep` runs the study)."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedtune.results import status
from fedtune.results.study_dir import OPTUNA_FILE, SPACES_DIR, TUNE_DIR
from fedtune.tune.plan import StudyPlan, SweepOptions, plan_study, seeds_for

__all__ = ["command_line", "new_study_data", "now", "relative", "snapshot_spaces"]


def now() -> str:
    """The time now, UTC, ISO 8601 to the second (study.json's timestamps)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    import shlex
    import sys

    return " ".join(shlex.quote(a) for a in ["fedtune", *sys.argv[1:]]) if sys.argv else "fedtune sweep"


def new_study_data(opts: SweepOptions, plan: StudyPlan, output: Path) -> dict[str, Any]:
    """``study.json`` of a new study."""
    return {"study": plan.name, "started_at": now(), "selection": opts.protocol(),
            "trial_seeds": opts.trial_seeds,
            "metric": plan.metrics, "modes": plan.modes,
            "algorithms": list(dict.fromkeys(s.algorithm for s in plan.searches)),
            "targets": plan.targets, "protocol": "leave-one-domain-out" if opts.target_domain == "all" else "single",
            "sampler": opts.sampler, "scheduler": opts.scheduler, "seeds": seeds_for(plan.base_seed, opts.seeds),
            "options": {**opts.to_json(), "name": plan.name, "output": str(output),
                        "spaces": [relative(plan.study_dir, p) for p in opts.spaces]},
            "searches": {s.key: {"status": status.PENDING, "algorithm": s.algorithm, "target_domain": s.target,
                                 "space": relative(plan.study_dir, s.space),
                                 "optuna_study": s.optuna_study(plan.name)}
                         for s in plan.searches},
            "trial_seed_of": {s.key: s.trial_seed for s in plan.searches},
            "optuna_storage": opts.optuna_storage or OPTUNA_FILE,
            "tune_dir": plan.tune_storage if opts.storage_path else TUNE_DIR}


def snapshot_spaces(opts: SweepOptions, plan: StudyPlan) -> tuple[SweepOptions, StudyPlan]:
    """Copy every search space of a new study into ``<study>/spaces/`` and re-plan on the copies, so
    the study folder is self-contained: ``--resume`` after a move, a copy or an upgrade of fedtune's
    built-in spaces reads the spaces the study started with."""
    import shutil

    from fedtune.results.atomic import writes_to

    folder = plan.study_dir / SPACES_DIR
    with writes_to(folder):
        folder.mkdir(parents=True, exist_ok=True)
    copies: dict[str, str] = {}
    for search in plan.searches:
        if search.algorithm not in copies:
            target = folder / f"{search.algorithm}.yaml"
            with writes_to(target):  # a full disk: one line naming the file
                shutil.copyfile(search.space, target)
            copies[search.algorithm] = str(target)
    new = copy.deepcopy(opts)
    new.spaces = list(copies.values())
    new.algorithms = list(copies)
    return new, plan_study(new, name=plan.name)


def relative(study_dir: Path, path: str) -> str:
    """``path`` relative to the study folder when it lies inside it (study.json stays relocatable)."""
    try:
        return str(Path(path).resolve().relative_to(Path(study_dir).resolve()))
    except ValueError:
        return str(path)
