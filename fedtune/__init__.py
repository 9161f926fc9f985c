"""fedtune: honest hyperparameter studies of federated domain generalisation / adaptation on Ray.

This package is fedtune's public face, the user API that docs/python-api.md
documents; it stays where it is when fedtune's modules move:

- running: :class:`FederatedRunConfig`, :func:`run`, :class:`ConfigError`;
- results: :func:`load` (the Arrow store as a ``pyarrow.Table``), :func:`make_report` (what
  ``fedtune report`` reads and prints);
- Ray Tune's ``Tuner``: :func:`search_space`, :func:`fedtune_trainable`, :class:`ArrowCallback`;
- registries: :data:`PRESETS` (named algorithms), :data:`CLIENT_METHODS`, :data:`SERVER_RULES`,
  :data:`SERVER_OPTIMIZERS`, :func:`list_datasets`;
- your own components (docs/extending.md): :func:`register`, :func:`plugin_runtime_env`, and what a
  component subclasses and declares with: :class:`ClientMethod` (:class:`ClientContext`,
  :class:`ClientOutcome`, :func:`descend`, :class:`SGD`), :class:`ServerRule` (:class:`RoundInfo`,
  :class:`AggregateResult`, :func:`server_step`, :func:`weighted_sum`), :class:`ServerOptimizer`,
  :class:`HParam`, :class:`ClientMethodSpec`, :class:`ServerRuleSpec`, :class:`ServerOptimizerSpec`,
  :class:`Preset`, :class:`DatasetSpec`,
  :class:`DomainDataset`, :class:`DatasetInfo`, :class:`CachedImageDataset` (a dataset of image files
  decoded once into fedtune's image cache); your own model is named ``MODULE:FUNCTION`` in the run's
  ``model`` field (:mod:`fedtune.model_factory`);
- checking your own components (docs/extending.md, "Checking your component"; ``fedtune check``):
  :func:`check_component` (every contract check of a registered component, as :class:`CheckResult`
  values), :func:`assert_component_ok` (the same, one AssertionError naming each failure: for pytest),
  :func:`check_plugin` (every component a plugin module registers).

Each name is defined in one module (``fedtune._HOMES``; ``fedtune.run is fedtune.runtime.driver.run``)
and loads on first use, so importing ``fedtune`` is light (no torch, no Ray, no pyarrow). Code
inside the package imports every name from its home, never from here. A spelling of an earlier
version (``fedtune.results.load``, ``fedtune.RunConfig``, ...) raises one line naming the new
one (:mod:`fedtune.old_names`).

>>> import fedtune
>>> cfg = fedtune.FederatedRunConfig.from_dict({"rounds": 2, "backend": "local"})
>>> cfg.algorithm, cfg.dataset
('fedavg', 'rotated-digits')
>>> fedtune.RunConfig
Traceback (most recent call last):
...
AttributeError: fedtune.RunConfig moved: use fedtune.FederatedRunConfig
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedtune.old_names import install_finder, old_name_error

if TYPE_CHECKING:  # for type checkers; at run time each name loads on first use (__getattr__)
    from fedtune.algorithms import CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES
    from fedtune.algorithms.presets import PRESETS
    from fedtune.config import FederatedRunConfig
    from fedtune.data.registry import list_datasets
    from fedtune.errors import ConfigError
    from fedtune.reports.report import make_report
    from fedtune.results.store import load
    from fedtune.runtime.driver import run
    from fedtune.spaces.lookup import search_space
    from fedtune.tune.trial.callback import ArrowCallback
    from fedtune.tune.trial.trainable import fedtune_trainable
    from fedtune.plugins import plugin_runtime_env, register
    from fedtune.algorithms.base import ClientMethodSpec, HParam, Preset, ServerOptimizerSpec, ServerRuleSpec
    from fedtune.algorithms.client.method import SGD, ClientContext, ClientMethod, ClientOutcome, descend
    from fedtune.algorithms.server.aggregate import server_step, weighted_sum
    from fedtune.algorithms.server.optimizer import ServerOptimizer
    from fedtune.algorithms.server.rule import AggregateResult, RoundInfo, ServerRule
    from fedtune.data.base import DatasetInfo, DomainDataset
    from fedtune.data.registry import DatasetSpec
    from fedtune.data.folder import CachedImageDataset
    from fedtune.contracts.result import CheckResult
    from fedtune.contracts.suite import assert_component_ok, check_component, check_plugin

__version__ = "0.1.0"

_HOMES: dict[str, str] = {
    # running
    "FederatedRunConfig": "fedtune.config",
    "run": "fedtune.runtime.driver",
    "ConfigError": "fedtune.errors",
    # results
    "load": "fedtune.results.store",
    "make_report": "fedtune.reports.report",
    # Ray Tune's Tuner
    "search_space": "fedtune.spaces.lookup",
    "fedtune_trainable": "fedtune.tune.trial.trainable",
    "ArrowCallback": "fedtune.tune.trial.callback",
    # registries
    "PRESETS": "fedtune.algorithms.presets",
    "CLIENT_METHODS": "fedtune.algorithms",
    "SERVER_RULES": "fedtune.algorithms",
    "SERVER_OPTIMIZERS": "fedtune.algorithms",
    "list_datasets": "fedtune.data.registry",
    # your own components (docs/extending.md)
    "register": "fedtune.plugins",
    "plugin_runtime_env": "fedtune.plugins",
    "HParam": "fedtune.algorithms.base",
    "ClientMethodSpec": "fedtune.algorithms.base",
    "ServerRuleSpec": "fedtune.algorithms.base",
    "ServerOptimizerSpec": "fedtune.algorithms.base",
    "Preset": "fedtune.algorithms.base",
    "ClientMethod": "fedtune.algorithms.client.method",
    "ClientContext": "fedtune.algorithms.client.method",
    "ClientOutcome": "fedtune.algorithms.client.method",
    "SGD": "fedtune.algorithms.client.method",
    "descend": "fedtune.algorithms.client.method",
    "ServerRule": "fedtune.algorithms.server.rule",
    "RoundInfo": "fedtune.algorithms.server.rule",
    "AggregateResult": "fedtune.algorithms.server.rule",
    "server_step": "fedtune.algorithms.server.aggregate",
    "weighted_sum": "fedtune.algorithms.server.aggregate",
    "ServerOptimizer": "fedtune.algorithms.server.optimizer",
    "DatasetSpec": "fedtune.data.registry",
    "DomainDataset": "fedtune.data.base",
    "DatasetInfo": "fedtune.data.base",
    "CachedImageDataset": "fedtune.data.folder",
    # checking your own components (fedtune check)
    "check_component": "fedtune.contracts.suite",
    "assert_component_ok": "fedtune.contracts.suite",
    "check_plugin": "fedtune.contracts.suite",
    "CheckResult": "fedtune.contracts.result",
}
"""Each public name -> the module that defines it (and that code inside fedtune imports it from)."""

__all__ = ["__version__", "FederatedRunConfig", "run", "ConfigError", "load", "make_report", "search_space",
           "fedtune_trainable", "ArrowCallback", "PRESETS", "CLIENT_METHODS", "SERVER_RULES", "SERVER_OPTIMIZERS",
           "list_datasets", "register", "plugin_runtime_env", "HParam", "ClientMethodSpec", "ServerRuleSpec",
           "ServerOptimizerSpec", "Preset", "ClientMethod", "ClientContext", "ClientOutcome", "SGD",
           "descend", "ServerRule", "RoundInfo", "AggregateResult", "server_step", "weighted_sum", "ServerOptimizer",
           "DatasetSpec", "DomainDataset", "DatasetInfo", "CachedImageDataset", "check_component", "assert_component_ok",
           "check_plugin", "CheckResult"]


def __getattr__(name: str) -> Any:
    """``fedtune.<name>``: a public name from its home module, imported on first use; an old
    spelling raises its one line (:func:`fedtune.old_names.old_name_error`)."""
    home = _HOMES.get(name)
    if home is None:
        raise old_name_error(__name__, name)
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


install_finder()  # `import fedtune.tune.spaces`, `from fedtune.results import load`: one line naming the new spelling
