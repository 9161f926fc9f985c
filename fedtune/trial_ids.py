"""A run's trial id: a stable digest of what it computes (``FederatedRunConfig.trial_id``), and the
rules that keep every earlier study's ids when fields are added or defaults change. A resumed study
finds its finished trials by these ids: a rule changed here re-runs them, or mixes old and new
results under one id. Split from :mod:`fedtune.config` (over 500 lines)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from fedtune.algorithms import SERVER_OPTIMIZERS
from fedtune.algorithms.base import RunConfig

# Fields that never change what a run computes: where it runs and writes, how it is placed and logged.
NEVER_HASHED = frozenset({"plugins", "backend", "address", "eval_every", "eval_batch_size", "eval_batch_mib",
                          "num_cpus", "num_gpus", "output", "name", "max_client_actors", "placement_timeout_s",
                          "on_client_failure", "client_placement", "client_cpus", "client_gpus", "coordinator_cpus",
                          "coordinator_gpus", "checkpoint_every", "cache_dir", "cache_key", "cache_wait_s"})
# Fields added after studies were first written: left out of trial_id while at these values, so the
# trial ids of earlier studies (which ran with exactly these) stay the same. ``augment`` is hashed as
# the augmentation that runs: DomainBed's datasets augment by default, so their ids change.
HASHED_WHEN_SET = {"weights": "none", "augment": "none", "local_optimizer": "sgd", "precision": "fp32",
                   "channels_last": True, "cudnn_benchmark": True, "server_optimizer": "sgd",
                   "domain_homogeneity": None, "domain_homogeneity_rounding": "authors", "target_lr_scale": 1.0,
                   "split_scheme": None, "freeze_batchnorm": False, "fidelity_participation": None,
                   "fidelity_grace_rounds": 1, "fidelity_factor": 2.0, "fedex_configs": 0, "fedex_knobs": ["local_lr"],
                   "fedex_eps": 0.5, "fedex_schedule": "aggressive", "fedex_baseline": 0.0, "fedex_diff": False,
                   "fedex_cutoff": 0.0, "fedex_objective": "error"}
# The same for hyperparameters added later (in ``params``), at the value every earlier run computed with:
# the example-weighted model mean, and Reddi et al.'s v start. A shipped space that now names them fixed
# at these values keeps its trial ids.
PARAMS_HASHED_WHEN_SET = {"client_weighting": "examples", "server_v_start": "tau_squared"}
# Hyperparameters whose default changed after studies were written: hashed at the value that runs, set
# or not, so a run that leaves one unset gets another id than the runs of the old default
# (fedadg_variant: fedtune's `fixed` reading until issue 44, the authors' PACS code since;
# fish_inner_optimizer: `fresh` until issue 44, `round` (DomainBed's, Bai et al.'s) since;
# feddg_window: `centred`, L ~ U(0, 1), until issue 44, ELCFS's `dc` since).
PARAMS_HASHED_WHEN_UNSET = ("fedadg_variant", "fish_inner_optimizer", "feddg_window", "feddg_ratio_low",
                            "feddg_ratio_high")


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
    not ``auto``), less :data:`NEVER_HASHED` and the later fields at the values earlier runs had."""
    values = {**cfg.to_dict(), "augment": cfg.effective_augment}  # what ran, not "auto"
    if cfg.global_lr is None and SERVER_OPTIMIZERS.spec(cfg.server_optimizer).default_lr is not None:
        # adam/yogi/adagrad step at their own default since issue 44 (the rule's before): hash the
        # step that runs, so these runs get new ids; sgd and avgm runs keep theirs (global_lr None)
        values["global_lr"] = cfg.effective_global_lr
    specs = cfg.resolved.hparam_specs()
    values["params"] = {**{k: specs[k].of(cfg) for k in PARAMS_HASHED_WHEN_UNSET if k in specs},
                        **{k: v for k, v in values["params"].items()
                           if not (k in PARAMS_HASHED_WHEN_SET and v == PARAMS_HASHED_WHEN_SET[k])}}
    payload = {k: v for k, v in sorted(values.items())
               if k not in NEVER_HASHED and not (k in HASHED_WHEN_SET and v == HASHED_WHEN_SET[k])}
    digest = hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{cfg.algorithm}-{digest}"
