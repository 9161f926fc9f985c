"""``--seeds K``: which configuration of a search is re-run with more seeds, and the trial id of
each re-run (:mod:`fedtune.tune.sweep` runs them as one Tune experiment per search).

``--seeds K``: after the searches, the configuration the report selects per
(algorithm, target) (highest metric at its best round) is evaluated with the K seeds
``s, s+1, ..., s+K-1`` (``s`` = the study's ``seed``, default 0). Its search run *is* the
seed-``s`` replicate (a run is deterministic given its seed, so re-running it would reproduce
it exactly); the K-1 others run as one Tune experiment ``tune/<search>--seeds``. The report
then shows mean ± standard error over the K seeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results.selection import SCORE
from fedtune.tune.plan import Search

__all__ = ["seed_trial_id", "selected_config"]


def seed_trial_id(config: Mapping[str, Any]) -> str:
    """The trial id of a re-run's configuration (switches of a search space left out)."""
    from fedtune.tune.spaces import strip_switches

    return FederatedRunConfig.from_dict(strip_switches(dict(config))).trial_id()


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
                          f"{SCORE[selection]} to select; nothing to re-run")
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
