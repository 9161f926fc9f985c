"""What a new ``fedtune sweep`` study writes before its first search: ``study.json``'s first
content and the study's own copy of its search spaces (:mod:`fedtune.tune.study.sweep` runs the study)."""

from __future__ import annotations

import copy
import json
import shlex
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedtune.algorithms import own_knobs
from fedtune.errors import ConfigError
from fedtune.plugins import loaded_plugin_entries, plugin_records
from fedtune.results import status
from fedtune.results.atomic import atomic_write_text, writes_to
from fedtune.results.study_dir import OPTUNA_FILE, SPACES_DIR, TUNE_DIR
from fedtune.spaces.lookup import load_space
from fedtune.spaces.show import space_text
from fedtune.spaces.yaml_files import build_space
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.plan import StudyPlan, plan_study, seeds_for

__all__ = ["command_line", "knob_summary", "new_study_data", "now", "own_knob_spaces", "relative", "say_knobs",
           "snapshot_spaces"]


def now() -> str:
    """The time now, UTC, ISO 8601 to the second (study.json's timestamps)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
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
            "tune_dir": plan.tune_storage if opts.storage_path else TUNE_DIR,
            "knobs": knob_summary(plan),
            # each plugin's module, version and source hash: a resume imports and checks them first
            "plugins": plugin_records(loaded_plugin_entries())}


def snapshot_spaces(opts: SweepOptions, plan: StudyPlan) -> tuple[SweepOptions, StudyPlan]:
    """Write every search space of a new study into ``<study>/spaces/`` as a complete file (the
    effective space: its file, if any, over fedtune's declarations; ``complete: true``) and re-plan
    on the copies, so the study folder is self-contained: ``--resume`` after a move, a copy or an
    upgrade of fedtune's declarations or built-in spaces reads the spaces the study started with."""
    folder = plan.study_dir / SPACES_DIR
    with writes_to(folder):
        folder.mkdir(parents=True, exist_ok=True)
    copies: dict[str, str] = {}
    own = own_knob_spaces(plan) if opts.knobs == "own" else {}
    for search in plan.searches:
        if search.algorithm not in copies:
            target = folder / f"{search.algorithm}.yaml"
            text = own[search.algorithm] if search.algorithm in own else space_text(load_space(search.space))
            with writes_to(target):  # a full disk: one line naming the file
                atomic_write_text(target, text)
            copies[search.algorithm] = str(target)
    new = copy.deepcopy(opts)
    new.spaces = list(copies.values())
    new.algorithms = list(copies)
    return new, plan_study(new, name=plan.name)


SHARED_HELP = "shared knob: fixed at one value for every method of the study (--knobs own)"


def own_knob_spaces(plan: StudyPlan) -> dict[str, str]:
    """``--knobs own``: per algorithm of ``plan``, the text of its search space (complete, as
    :func:`snapshot_spaces` writes it) with every sampled parameter that is not the algorithm's own
    (:func:`fedtune.algorithms.own_knobs`) turned into ``distribution: fixed`` at the space's
    default, so each method spends the budget on its own knobs and every method runs with the same
    shared ones. Conditional parameters (``when``) keep their rule. A shared parameter whose
    defaults differ between the study's spaces is a ConfigError: "one value for every method"
    would not hold."""
    texts: dict[str, str] = {}
    fixed_by: dict[str, dict[str, Any]] = {}
    for search in plan.searches:
        if search.algorithm in texts:
            continue
        space = load_space(search.space)
        doc = space.to_document()
        own, defaults, fixed = set(own_knobs(search.algorithm)), space.defaults(), {}
        for name, p in space.params.items():
            if name in own or not p.sampled or p.when:
                continue
            doc["params"][name] = {"distribution": "fixed", "value": defaults[name], "help": SHARED_HELP}
            fixed[name] = defaults[name]
        fixed_by[search.algorithm] = fixed
        pinned = build_space(doc, space.source, None)
        texts[search.algorithm] = space_text(pinned, f"with --knobs own: {search.algorithm}'s own knobs are searched, "
                                                     f"every shared one is fixed ({SHARED_HELP}).")
    for name in sorted({n for f in fixed_by.values() for n in f}):
        values = {a: f[name] for a, f in fixed_by.items() if name in f}
        if len({json_key(v) for v in values.values()}) > 1:
            raise ConfigError(f"option '--knobs': 'own' fixes the shared knob '{name}' at one value for every "
                              f"method, but the search spaces' defaults differ ("
                              f"{', '.join(f'{a}: {v}' for a, v in values.items())}); allowed: spaces whose shared "
                              "defaults agree (edit a space's default), or --knobs all")
    return texts


def json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def knob_summary(plan: StudyPlan) -> dict[str, Any]:
    """What each algorithm of ``plan`` searches and what it holds fixed (``study.json``'s ``knobs``
    and the sweep's first lines)."""
    out: dict[str, Any] = {"mode": plan.options.knobs, "searched": {}, "shared_fixed": {}}
    for search in plan.searches:
        if search.algorithm in out["searched"]:
            continue
        space = load_space(search.space)
        out["searched"][search.algorithm] = [n for n, p in space.params.items() if p.sampled]
        shared = {n: p.initial for n, p in space.params.items() if not p.sampled and p.help == SHARED_HELP}
        for n, v in shared.items():
            out["shared_fixed"].setdefault(n, {"value": v, "algorithms": []})["algorithms"].append(search.algorithm)
    return out


def relative(study_dir: Path, path: str) -> str:
    """``path`` relative to the study folder when it lies inside it (study.json stays relocatable)."""
    try:
        return str(Path(path).resolve().relative_to(Path(study_dir).resolve()))
    except ValueError:
        return str(path)


def say_knobs(console: Any, knobs: Mapping[str, Any]) -> None:
    """The first lines of a ``--knobs own`` study: what each method searches, what all share."""
    searched = "; ".join(f"{a}: {', '.join(ps) or 'nothing (one configuration)'}"
                         for a, ps in knobs["searched"].items())
    everyone = list(knobs["searched"])

    def one(name: str, fixed: Mapping[str, Any]) -> str:
        v = fixed["value"]
        text = f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}"
        return text if fixed["algorithms"] == everyone else f"{text} ({', '.join(fixed['algorithms'])})"

    shared = ", ".join(one(k, f) for k, f in knobs["shared_fixed"].items())
    console.print(f"searched (each method's own knobs): {searched}", soft_wrap=True)
    if shared:
        console.print(f"fixed for every method (shared knobs): {shared}", soft_wrap=True)
