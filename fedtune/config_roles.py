"""A run field's roles, declared once at the field, and every list of fields derived from them.

Each field of :class:`~fedtune.config.FederatedRunConfig` is made by :func:`run_field`, which
takes, besides its default, help and allowed values, the roles the rest of fedtune reads (the
attrs / pydantic-settings way: the field carries its metadata, every list is computed):

- ``trial_id`` (required): ``"always"`` part of the trial id; ``"never"`` never (where a run runs
  and writes, how it is placed and logged); ``"when_set"`` part of it only at another value than
  ``legacy`` (default: the field's default), the value every run before the field existed
  computed with, so earlier studies keep their trial ids (:func:`fedtune.trial_ids.trial_id_of`).
  A field added later is ``when_set``; a ``when_set`` field whose default changes keeps its old
  default as ``legacy``.
- ``group`` (required): the section of ``fedtune fields`` (:data:`GROUPS`).
- ``plan=True``: it decides the run's data plan (the clients and their data), so a cache of plans
  keys on it (:func:`fedtune.tune.trial.trainable.num_clients_of`).
- ``sweep_option="ATTR"``: ``fedtune sweep`` sets it by its option ``ATTR`` of
  :class:`~fedtune.tune.study.options.SweepOptions` (``--set`` refuses it); with
  ``resume_fixed=True`` a resumed study keeps the option's value and a ``--config`` file may fill
  it; without, the option says where the study goes or runs (``--output``, ``--name``,
  ``--address``), which a resume may change and a ``--config`` file may not hold.
- ``run_flag=True`` (or the flag's metavar): ``fedtune run`` and ``fedtune partition`` take it as
  ``--NAME`` as well as ``--set NAME=...``.
- ``hp=True``: a tunable knob (an ``hp.<name>`` column of the results, searched by the spaces);
  ``needs=(field, off, on)``: the field has no effect while ``field`` is off.

:func:`roles_of` reads them back (once per config class) and refuses, in one line, a field that
declares no trial-id role or group: a field added without saying whether it is part of the trial
id would change every earlier study's ids, or mix results of different runs under one id.

>>> from dataclasses import dataclass
>>> @dataclass
... class Tiny:
...     rounds: int = run_field(10, "rounds", trial_id="always", group="training", plan=True)
...     added: str = run_field("old", "a later field", trial_id="when_set", group="training")
...     output: str = run_field("out", "folder", trial_id="never", group="results", sweep_option="output")
>>> r = roles_of(Tiny)
>>> sorted(r.never_hashed), r.hashed_when_set, r.plan_fields, r.sweep_options
(['output'], {'added': 'old'}, ('rounds',), {'output': 'output'})
>>> @dataclass
... class Forgot:
...     extra: int = 0
>>> roles_of(Forgot)
Traceback (most recent call last):
...
TypeError: run field 'extra' of Forgot declares no trial-id role; allowed: trial_id='always', 'when_set' or 'never' in its run_field(...) (fedtune.config_roles)
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field, fields
from typing import Any

from fedtune.bounds import Bounds

TRIAL_ID_ROLES = ("always", "when_set", "never")
"""A field's part in the trial id (see the module's docstring)."""

GROUPS = {
    "run": "what to run: the algorithm and its parts, plugins",
    "data": "data: the dataset, its federated split and its cache",
    "model": "model: the network, its starting weights, batch norm",
    "training": "training: rounds, local and server optimisation, seeds",
    "fedex": "FedEx: the clients' knobs tuned inside the run",
    "evaluation": "evaluation: how often, in batches of what size",
    "resources": "resources and runtime: where and how a run runs",
    "results": "results: where a run writes",
}
"""The groups of ``fedtune fields``, in the order it shows them: name -> title."""

_DEFAULT = object()  # ``legacy`` not given: the field's default


def run_field(default: Any, help: str, *, trial_id: str, group: str, legacy: Any = _DEFAULT, plan: bool = False,
              sweep_option: str | None = None, resume_fixed: bool = False, run_flag: bool | str = False,
              choices: tuple | None = None, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
              note: str = "", hp: bool = False, factory: Any = None,
              needs: tuple[str, str, str] | None = None) -> Any:
    """A run field: its default (``factory`` for a list or mapping), help text, allowed values (one
    :class:`~fedtune.bounds.Bounds`, checked by :meth:`FederatedRunConfig.validate`) and roles (the
    module's docstring). A role's wrong value is refused here, where the field is declared."""
    if trial_id not in TRIAL_ID_ROLES:
        raise TypeError(f"run_field: trial_id={trial_id!r} is not a trial-id role; allowed: {', '.join(TRIAL_ID_ROLES)}")
    if group not in GROUPS:
        raise TypeError(f"run_field: group={group!r} is not a group of fedtune fields; allowed: {', '.join(GROUPS)}")
    if legacy is not _DEFAULT and trial_id != "when_set":
        raise TypeError(f"run_field: legacy={legacy!r} is the baseline of trial_id='when_set', not {trial_id!r}")
    if resume_fixed and sweep_option is None:
        raise TypeError("run_field: resume_fixed=True keeps a sweep option; give sweep_option=... as well")
    value = (factory() if factory is not None else default) if legacy is _DEFAULT else legacy
    meta = {"help": help, "bounds": Bounds(lo=lo, hi=hi, lo_open=lo_open, choices=choices or (), note=note),
            "hp": hp, "needs": needs, "trial_id": trial_id, "group": group, "plan": plan,
            "sweep_option": sweep_option, "resume_fixed": resume_fixed, "run_flag": run_flag}
    if trial_id == "when_set":
        meta["legacy"] = value
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Roles:
    """The lists a config class's field roles give (:func:`roles_of`), each in field order."""

    never_hashed: frozenset[str]
    hashed_when_set: dict[str, Any]  # field -> the value earlier runs had (left out of the id at it)
    plan_fields: tuple[str, ...]
    sweep_options: dict[str, str]  # field -> its SweepOptions attribute
    resume_fixed: tuple[str, ...]  # fields whose sweep option a resume keeps
    run_flags: dict[str, bool | str]  # field -> True or its flag's metavar
    groups: dict[str, tuple[str, ...]]  # group -> its fields, in GROUPS' order

    @property
    def study_place(self) -> tuple[str, ...]:
        """The sweep options' fields a resume may change: where the study goes or runs (output, name,
        address); a sweep's ``--config`` file may not hold them."""
        return tuple(k for k in self.sweep_options if k not in self.resume_fixed)


def _role(cls: type, f: dataclasses.Field, key: str, what: str, allowed: tuple[str, ...]) -> Any:
    value = f.metadata.get(key)
    if value not in allowed:
        raise TypeError(f"run field '{f.name}' of {cls.__name__} declares no {what}; allowed: {key}="
                        f"{', '.join(repr(a) for a in allowed[:-1])} or {allowed[-1]!r} in its run_field(...) "
                        "(fedtune.config_roles)")
    return value


@functools.lru_cache(maxsize=None)
def roles_of(cls: type) -> Roles:
    """Every list of ``cls``'s fields that a role gives; a field without a trial-id role or a group
    raises one line naming it."""
    fs = fields(cls)
    trial = {f.name: _role(cls, f, "trial_id", "trial-id role", TRIAL_ID_ROLES) for f in fs}
    group = {f.name: _role(cls, f, "group", "group of fedtune fields", tuple(GROUPS)) for f in fs}
    meta = {f.name: f.metadata for f in fs}
    return Roles(
        never_hashed=frozenset(k for k, r in trial.items() if r == "never"),
        hashed_when_set={k: copy.deepcopy(meta[k]["legacy"]) for k, r in trial.items() if r == "when_set"},
        plan_fields=tuple(k for k in meta if meta[k].get("plan")),
        sweep_options={k: meta[k]["sweep_option"] for k in meta if meta[k].get("sweep_option")},
        resume_fixed=tuple(k for k in meta if meta[k].get("resume_fixed")),
        run_flags={k: meta[k]["run_flag"] for k in meta if meta[k].get("run_flag")},
        groups={g: tuple(k for k in meta if group[k] == g) for g in GROUPS if g in group.values()},
    )
