"""A run's trial id: a stable digest of what it computes (``FederatedRunConfig.trial_id``), and the
rules that keep every earlier study's ids when fields are added or defaults change. A resumed study
finds its finished trials by these ids: a rule changed here re-runs them, or mixes old and new
results under one id. Split from :mod:`fedtune.config` (over 500 lines).

The rules are declared where each field is: a run field's ``trial_id`` role
(:func:`fedtune.config_roles.run_field`: ``always``, ``when_set`` at its ``legacy`` value,
``never``) and a component hyperparameter's (:class:`fedtune.algorithms.base.HParam`'s
``trial_id``: ``always``, ``when_set`` at its default, ``as_run``: hashed at the value that runs,
set or not, because its default changed after studies were written). The lists they give are
:func:`fedtune.config_roles.roles_of` 's (``never_hashed``, ``hashed_when_set``; the hand-kept
``NEVER_HASHED`` and ``HASHED_WHEN_SET`` they replace) and :func:`params_roles`' (what were
``PARAMS_HASHED_WHEN_SET`` and ``PARAMS_HASHED_WHEN_UNSET``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from fedtune.algorithms import SERVER_OPTIMIZERS, all_hparams
from fedtune.config_roles import roles_of
from fedtune.algorithms.base import RunConfig


def params_roles() -> tuple[dict[str, Any], tuple[str, ...]]:
    """The component hyperparameters left out of the trial id at the value every earlier run had
    (``trial_id="when_set"``: name -> default; the example-weighted model mean, Reddi et al.'s v
    start), and those hashed at the value that runs, set or not (``trial_id="as_run"``: their default
    changed after studies were written: fedadg_variant, fish_inner_optimizer, feddg_window, ...)."""
    specs = [h for _, h in all_hparams().values()]
    return ({h.name: h.default for h in specs if h.trial_id == "when_set"},
            tuple(h.name for h in specs if h.trial_id == "as_run"))


class HashedConfig(RunConfig, Protocol):
    """What :func:`trial_id_of` reads of a run's configuration (a
    :class:`~fedtune.config.FederatedRunConfig`, which imports this module): every field, the
    augmentation that runs, the server optimiser, and what every component reads."""

    server_optimizer: str

    def to_dict(self) -> dict[str, Any]: ...

    @property
    def effective_augment(self) -> str: ...


def trial_id_of(cfg: HashedConfig) -> str:
    """``<algorithm>-<10 hex digits>``: the SHA-1 of the config's fields (the augmentation that runs,
    not ``auto``), less the fields declared ``trial_id="never"`` and those declared ``"when_set"`` at
    the values earlier runs had."""
    roles = roles_of(type(cfg))
    values = {**cfg.to_dict(), "augment": cfg.effective_augment}  # what ran, not "auto"
    if cfg.global_lr is None and SERVER_OPTIMIZERS.spec(cfg.server_optimizer).default_lr is not None:
        # adam/yogi/adagrad step at their own default since issue 44 (the rule's before): hash the
        # step that runs, so these runs get new ids; sgd and avgm runs keep theirs (global_lr None)
        values["global_lr"] = cfg.effective_global_lr
    specs = cfg.resolved.hparam_specs()
    when_set, as_run = params_roles()
    values["params"] = {**{k: specs[k].of(cfg) for k in as_run if k in specs},
                        **{k: v for k, v in values["params"].items() if not (k in when_set and v == when_set[k])}}
    later = roles.hashed_when_set
    payload = {k: v for k, v in sorted(values.items())
               if k not in roles.never_hashed and not (k in later and v == later[k])}
    digest = hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{cfg.algorithm}-{digest}"

