"""The shared knobs of every search space, declared once: how a space samples the run fields every
algorithm has (the ``hp=True`` fields of :class:`~fedtune.config.FederatedRunConfig`) and the server
optimiser. Each entry is one search-space ``params`` entry (:mod:`fedtune.spaces.lookup`);
:mod:`fedtune.spaces.derive` puts them after the components' own hyperparameters.

**Client and server steps** (:data:`SHARED_KNOBS`). ``local_lr``, ``local_momentum``,
``weight_decay`` and ``global_lr`` have one distribution and range for every algorithm, so methods
are compared with their steps tuned alike (FedOMG against FedAvg with the server step tuned for
both). ``global_lr``'s default is the server rule's ``default_global_lr`` (FedAvg 1.0, FedOMG 0.05:
fedtune's default, not the paper's η_g; docs/methods-seeds.md §1), so a search's first point is the
paper setting. ``local_optimizer`` is sgd here; ``examples/paper-setup/`` overrides it with Adam and
DomainBed's ranges. The compute budget (``rounds``, ``local_epochs``, ``local_steps``,
``batch_size``) is never searched by default: a study's base configuration sets it, the same for
every algorithm it compares (a file may still add ``local_steps`` etc. as parameters).

**Server optimiser** (:data:`SERVER_OPTIMIZER` and :data:`SERVER_OPTIMIZER_BLOCK`): a shared knob
on the server rule's step. The default, ``sgd``, is the rule's own step: the default point runs
exactly as before the block existed. adam / yogi / adagrad follow Reddi et al. 2021 ("Adaptive
Federated Optimization"), who fix beta1 = 0.9, beta2 = 0.99 and tune tau over powers of ten; their
server learning rate is ``global_lr``. avgm is FedAvgM (Hsu et al. 2019), its momentum over their
high-momentum values (0 would repeat sgd exactly). Each optimiser's hyperparameters are declared
with the optimiser (their ``HParam.search``); the derivation samples each only when
``server_optimizer`` is one that uses it (``when: {server_optimizer: [...]}``) and leaves it out
otherwise.

>>> list(SHARED_KNOBS)
['local_lr', 'local_optimizer', 'local_momentum', 'weight_decay', 'global_lr']
>>> SHARED_KNOBS["global_lr"]["default"] is None   # the server rule's default_global_lr
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["SERVER_OPTIMIZER", "SERVER_OPTIMIZER_BLOCK", "SHARED_KNOBS"]

SHARED_KNOBS: dict[str, dict[str, Any]] = {
    "local_lr": {"distribution": "loguniform", "low": 0.005, "high": 0.2, "default": 0.05,
                 "help": "client SGD step size (shared knob)"},
    "local_optimizer": {"distribution": "fixed", "value": "sgd", "help": "sgd here; examples/paper-setup/ tunes Adam"},
    "local_momentum": {"distribution": "categorical", "choices": [0.0, 0.5, 0.9], "default": 0.9},
    "weight_decay": {"distribution": "categorical", "choices": [0.0, 1.0e-4, 5.0e-4], "default": 0.0},
    # default: None here, the server rule's default_global_lr in a derived space
    "global_lr": {"distribution": "loguniform", "low": 0.005, "high": 1.0, "default": None,
                  "help": "server learning rate (shared knob)"},
}
"""The run fields every space searches, in the order a derived space lists them (after the
components' hyperparameters and the preset's ``own_shared``)."""

SERVER_OPTIMIZER: dict[str, Any] = {
    "distribution": "categorical", "choices": ["sgd", "avgm", "adam", "yogi", "adagrad"], "default": "sgd",
    "help": "server optimiser on the rule's step; sgd = the rule as it is (shared knob)"}
"""How every space samples ``server_optimizer`` (the registry's optimisers, listed here on purpose:
a new optimiser joins the searched ones by a change of this line, which changes every study's
sampling)."""

SERVER_OPTIMIZER_BLOCK: tuple[str, ...] = ("server_momentum", "server_beta1", "server_beta2", "server_tau",
                                           "server_adam_bias_correction", "server_v_start")
"""The server optimisers' hyperparameters, in the order a derived space lists them after
``server_optimizer`` (each one's ``search`` is declared with it)."""
