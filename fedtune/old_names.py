"""Spellings of earlier fedtune versions that no longer resolve, and the one line saying where each went.

The house-keeping of issue 18 gave every name one address: the packages stopped re-exporting
their modules' names (``fedtune.results.load`` is :func:`fedtune.results.store.load`, published
for users as ``fedtune.load``), ``RunConfig`` lost its alias, and search spaces and reports left
``fedtune/tune/``. Scripts written against the README of that time then failed with Python's bare
``has no attribute`` or ``No module named``. Here every such spelling that the README, docs and
examples of that time used (and every name those packages' ``__all__`` listed) has its new one:

- :data:`MOVED_NAMES`: old ``package.name`` -> its new spelling;
- :data:`MOVED_MODULES`: old module path -> the module that holds its names now (also what
  :func:`fedtune.tune.study.moved_modules.old_module_names` uses to unpickle a study saved before a move).

Two hooks raise the line, never a working alias (each name keeps one address):

- attribute access (``fedtune.results.load``): the package's ``__init__`` has a module
  ``__getattr__`` whose only statement is ``raise old_name_error(__name__, name)``;
- imports (``from fedtune.results import load``, ``import fedtune.tune.spaces``): :class:`OldNamesFinder`,
  the last finder on :data:`sys.meta_path` (``import fedtune`` installs it), so it only ever
  answers for a path no real module holds. ``from package import name`` asks for the module
  ``package.name`` when the package lacks the attribute, which is how this reaches
  ``from fedtune.algorithms import fedomg_direction`` too.

>>> print(old_name_error("fedtune.results", "load"))
fedtune.results.load moved: use fedtune.load
>>> print(moved_message("fedtune.tune.report"))
fedtune.tune.report moved: use fedtune.reports.report (make_report: fedtune.make_report;
paired_gap: fedtune.reports.stats.paired_gap)
>>> print(old_name_error("fedtune.results", "nothing_here"))
module 'fedtune.results' has no attribute 'nothing_here'

This module imports nothing of fedtune (it is on the floor: every package may use it).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MOVED_MODULES", "MOVED_NAMES", "OldNamesFinder", "install_finder", "moved_message", "old_name_error"]


def _moved(old: str, new: str, *names: str) -> dict[str, str]:
    """``old.<name>`` -> ``new.<name>`` for each name."""
    return {f"{old}.{name}": f"{new}.{name}" for name in names}


MOVED_MODULES: dict[str, str] = {
    # house-keeping (#18): search spaces and reports left tune/, the selection alias went
    "fedtune.tune.spaces": "fedtune.spaces.lookup",
    "fedtune.tune.spaces_model": "fedtune.spaces.model",
    "fedtune.tune.spaces_yaml": "fedtune.spaces.yaml_files",
    "fedtune.tune.optuna_url": "fedtune.results.optuna_url",
    "fedtune.tune.report": "fedtune.reports.report",
    "fedtune.tune.report_model": "fedtune.reports.model",
    "fedtune.tune.report_stats": "fedtune.reports.stats",
    "fedtune.tune.report_render": "fedtune.reports.render",
    "fedtune.tune.plots": "fedtune.reports.plots",
    "fedtune.tune.importances": "fedtune.reports.importances",
    "fedtune.selection": "fedtune.results.selection",
    # issue 28: tune/ grouped by job (study/, trial/, tuner/)
    "fedtune.tune.options": "fedtune.tune.study.options",
    "fedtune.tune.plan": "fedtune.tune.study.plan",
    "fedtune.tune.default_study": "fedtune.tune.study.default_study",
    "fedtune.tune.study_start": "fedtune.tune.study.study_start",
    "fedtune.tune.sweep": "fedtune.tune.study.sweep",
    "fedtune.tune.seed_runs": "fedtune.tune.study.seed_runs",
    "fedtune.tune.resume": "fedtune.tune.study.resume",
    "fedtune.tune.driver_lock": "fedtune.tune.study.driver_lock",
    "fedtune.tune.ray_lost": "fedtune.tune.common.ray_lost",
    "fedtune.tune.active": "fedtune.tune.common.active",
    "fedtune.tune.moved_modules": "fedtune.tune.study.moved_modules",
    "fedtune.tune.trainable": "fedtune.tune.trial.trainable",
    "fedtune.tune.callback": "fedtune.tune.trial.callback",
    "fedtune.tune.loggers": "fedtune.tune.trial.loggers",
    "fedtune.tune.progress": "fedtune.tune.trial.progress",
    "fedtune.tune.scale_up": "fedtune.tune.trial.scale_up",
    "fedtune.tune.optuna_search": "fedtune.tune.tuner.optuna_search",
    "fedtune.tune.capacity": "fedtune.tune.tuner.capacity",
    "fedtune.tune.tune_storage": "fedtune.tune.tuner.storage",
    "fedtune.tune.tune_env": "fedtune.tune.tuner.env",
    # issue 28: algorithms/ split into client/ (torch) and server/ (NumPy)
    "fedtune.algorithms.client_hooks": "fedtune.algorithms.client.hooks",
    "fedtune.algorithms.coral": "fedtune.algorithms.client.coral",
    "fedtune.algorithms.feddyn": "fedtune.algorithms.client.feddyn",
    "fedtune.algorithms.fedga_client": "fedtune.algorithms.client.fedga",
    "fedtune.algorithms.fediir": "fedtune.algorithms.client.fediir",
    "fedtune.algorithms.fedsr": "fedtune.algorithms.client.fedsr",
    "fedtune.algorithms.fishr": "fedtune.algorithms.client.fishr",
    "fedtune.algorithms.gala_client": "fedtune.algorithms.client.gala",
    "fedtune.algorithms.gfm": "fedtune.algorithms.client.gfm",
    "fedtune.algorithms.moon": "fedtune.algorithms.client.moon",
    "fedtune.algorithms.optim": "fedtune.algorithms.client.optim",
    "fedtune.algorithms.precision": "fedtune.algorithms.client.precision",
    "fedtune.algorithms.prox": "fedtune.algorithms.client.prox",
    "fedtune.algorithms.sam": "fedtune.algorithms.client.sam",
    "fedtune.algorithms.scaffold": "fedtune.algorithms.client.scaffold",
    "fedtune.algorithms.simclr": "fedtune.algorithms.client.simclr",
    "fedtune.algorithms.step_records": "fedtune.algorithms.client.step_records",
    "fedtune.algorithms.aggregate": "fedtune.algorithms.server.aggregate",
    "fedtune.algorithms.blocked": "fedtune.algorithms.server.blocked",
    "fedtune.algorithms.server_optimizer": "fedtune.algorithms.server.optimizer",
    "fedtune.algorithms.server_side": "fedtune.algorithms.server.side",
    "fedtune.algorithms.feddyn_server": "fedtune.algorithms.server.feddyn",
    "fedtune.algorithms.fedga": "fedtune.algorithms.server.fedga",
    "fedtune.algorithms.fedgp": "fedtune.algorithms.server.fedgp",
    "fedtune.algorithms.fedgp_auto_beta": "fedtune.algorithms.server.fedgp_auto_beta",
    "fedtune.algorithms.fediir_server": "fedtune.algorithms.server.fediir",
    "fedtune.algorithms.fedomg": "fedtune.algorithms.server.fedomg",
    "fedtune.algorithms.fedomg_solvers": "fedtune.algorithms.server.fedomg_solvers",
    "fedtune.algorithms.fishr_server": "fedtune.algorithms.server.fishr",
    "fedtune.algorithms.gala": "fedtune.algorithms.server.gala",
    "fedtune.algorithms.gala_move": "fedtune.algorithms.server.gala_move",
    "fedtune.algorithms.scaffold_server": "fedtune.algorithms.server.scaffold",
    "fedtune.algorithms.wolfe": "fedtune.algorithms.server.wolfe",
    # issue 46: the study's vocabulary moved below the rooms inside Ray Tune (tune/common/)
    "fedtune.tune.study.active": "fedtune.tune.common.active",
    "fedtune.tune.study.ray_lost": "fedtune.tune.common.ray_lost",
    "fedtune.tune.study.state_signatures": "fedtune.tune.common.state_signatures",
}
"""Old module path -> the module that holds its names now (same class names: old pickles load)."""

MOVED_NAMES: dict[str, str] = {
    # the top-level package: FederatedRunConfig's former name
    "fedtune.RunConfig": "fedtune.FederatedRunConfig",
    # fedtune.results re-exported every public name of its modules (the README's `results.load`)
    "fedtune.results.load": "fedtune.load",
    **_moved("fedtune.results", "fedtune.results.arrow", "CorruptResultsError", "ForeignResultsError", "rows_to_table"),
    **_moved("fedtune.results", "fedtune.results.atomic", "ResultsWriteError", "StorageFullError"),
    **_moved("fedtune.results", "fedtune.results.schema", "IDENTITY_COLUMNS", "REQUIRED_COLUMNS", "ROUND_COLUMN_DOCS",
             "ROUND_CORE_SCHEMA", "TABLES", "TIMESTAMP", "TRIAL_COLUMN_DOCS", "TRIAL_CORE_SCHEMA", "schema_markdown"),
    **_moved("fedtune.results", "fedtune.results.store", "LOCK_TIMEOUT_S", "TEMP_MIN_AGE_S", "ResultsStore",
             "TrialsLockTimeout", "check_output_dir", "check_study_dir", "check_writable", "clean_stray_temp_files",
             "corrupt_files", "is_study_dir", "quarantine"),
    **_moved("fedtune.results", "fedtune.results.study_dir", "LOCK_FILE", "NAME_RULE", "ROUNDS_DIR", "TRIALS_FILE",
             "check_name"),
    **_moved("fedtune.results", "fedtune.results.summary", "summarize_trial"),
    # fedtune.runtime's __all__ (the README's `fedtune.runtime.FederatedRun`)
    "fedtune.runtime.run": "fedtune.run",
    **_moved("fedtune.runtime", "fedtune.runtime.driver", "FederatedRun", "RunResult", "build_plan"),
    **_moved("fedtune.runtime", "fedtune.runtime.cluster", "connect_ray"),
    **_moved("fedtune.runtime", "fedtune.runtime.coordinator", "Coordinator"),
    **_moved("fedtune.runtime", "fedtune.runtime.pools", "ClientFailure", "assign_clients"),
    **_moved("fedtune.runtime", "fedtune.runtime.resources", "ResourcePlan", "plan_resources"),
    **_moved("fedtune.runtime", "fedtune.errors", "ResourceError"),
    # the flat-weight copies left fedtune.models for their own module (issue 29)
    **_moved("fedtune.models", "fedtune.flat_weights", "get_flat", "set_flat"),
    # fedtune.data's __all__
    "fedtune.data.list_datasets": "fedtune.list_datasets",
    **_moved("fedtune.data", "fedtune.data.base", "ClientSpec", "DatasetInfo", "DomainDataset", "FederatedPlan",
             "Pieces"),
    **_moved("fedtune.data", "fedtune.data.registry", "DatasetEntry", "dataset_info", "get_dataset"),
    **_moved("fedtune.data", "fedtune.data.partition", "SETTINGS", "make_plan", "sample_participants"),
    **_moved("fedtune.data", "fedtune.errors", "DataError"),
    # fedtune.algorithms imported its classes and the README's "public math"
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.aggregate", "combine", "fedavg_buffers", "fedavg_step",
             "fedavg_weights", "weighted_sum"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.method", "SGD", "ClientContext", "ClientMethod",
             "ClientOutcome"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.rule", "AggregateResult", "FedAvg", "RoundInfo", "ServerRule"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.fedomg", "FedOMG", "fedomg_direction", "gram_matrix"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.fedomg_solvers", "omg_objective", "solve_omg_exact",
             "solve_omg_sgd"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.fedgp", "FedDA", "FedGP", "TargetOnly", "align_source_magnitude",
             "fedgp_combine", "proj_plus", "proj_plus_per_tensor"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.fedgp_auto_beta", "auto_beta", "auto_beta_estimates"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.server.gala", "Gala", "gala_global_weights"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.gala", "GalaClient"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.gfm", "GFM", "GCA"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.prox", "Prox"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.sam", "SAM"),
    # 2026-11-27: the server optimisers' declarations left declarations.py (over 500 lines)
    **_moved("fedtune.algorithms.declarations", "fedtune.algorithms.optimizer_declarations", "SERVER_OPTIMIZER_SPECS",
             "SERVER_MOMENTUM", "SERVER_BETA1", "SERVER_BETA2", "SERVER_TAU", "SERVER_ADAM_BIAS_CORRECTION",
             "SERVER_V_START"),
    **_moved("fedtune.algorithms", "fedtune.algorithms.client.simclr", "SimCLR", "GalaSimCLR"),
    # issue 44: FedADG's declarations (seventeen hyperparameters and their readings) left declarations.py
    **_moved("fedtune.algorithms.declarations", "fedtune.algorithms.fedadg_declarations", "FEDADG_ALPHA", "FEDADG_EPOCHS", "FEDADG_GEN_LR", "FEDADG_DISC_LR", "FEDADG_NOISE", "FEDADG_LATENT", "FEDADG_DISC_WIDTH", "FEDADG_SOFT_LABEL", "FEDADG_LABEL_SMOOTHING", "FEDADG_SMOOTHING_FORM", "FEDADG_PRETRAIN_LOSS", "FEDADG_ORDER", "FEDADG_DISC_LOSS", "FEDADG_GEN_LOSS", "FEDADG_DISC_ARCH", "FEDADG_MODEL_MODE", "FEDADG_VARIANT", "FEDADG_HPARAMS"),
    # issue 28: the modules fedtune.algorithms.client and .server became packages
    **_moved("fedtune.algorithms.client", "fedtune.algorithms.client.method", "StepFunction", "RecordStep", "Augment",
             "ClientData", "ClientContext", "ClientOutcome", "batches", "descend", "ClientMethod", "SGD"),
    **_moved("fedtune.algorithms.client", "fedtune.algorithms.client.steps", "local_steps", "effective_batch_size",
             "batch_size_note", "batches_per_epoch"),
    # the named algorithms left the components' declarations for a module of their own
    **_moved("fedtune.algorithms.declarations", "fedtune.algorithms.presets", "PRESETS"),
    # the step counts left the client methods' module for a torch-free one (the trial actor loads no torch)
    **_moved("fedtune.algorithms.client.method", "fedtune.algorithms.client.steps", "effective_batch_size",
             "batch_size_note", "batches_per_epoch"),
    **_moved("fedtune.algorithms.server", "fedtune.algorithms.server.rule", "RoundInfo", "AggregateResult",
             "ServerRule", "FedAvg"),
    # issue 46: FedEx became a declared in-run tuner (its hyperparameters, bounds and checks declared once)
    **_moved("fedtune.algorithms.server.fedex", "fedtune.algorithms.tuner_declarations", "FEDEX_MAX_CONFIGS",
             "FEDEX_OBJECTIVES", "AUTHORS_RANGES"),
    # names docs/ used in modules that moved, where they are not in the module's new home
    "fedtune.tune.report.make_report": "fedtune.make_report",
    "fedtune.tune.report.paired_gap": "fedtune.reports.stats.paired_gap",
    "fedtune.tune.spaces.search_space": "fedtune.search_space",
    "fedtune.tune.spaces.strip_switches": "fedtune.spaces.model.strip_switches",
    # docs/sweep.md: the default study's sizes
    "fedtune.tune.study.plan.DEFAULT_STUDY": "fedtune.tune.study.default_study.DEFAULT_STUDY",
    # issue 46: the study's vocabulary moved below the rooms inside Ray Tune (tune/common/)
    **_moved("fedtune.tune.study.plan", "fedtune.tune.common.searches", "SEARCH_FIELD", "search_of"),
    **_moved("fedtune.tune.study.ray_lost", "fedtune.tune.study.search_fit", "fit_stop", "study_write_error"),
    **_moved("fedtune.tune.study.state_signatures", "fedtune.tune.study.resume", "check_study_experiments"),
}
"""Old ``module.name`` spelling -> the spelling to use now (``fedtune.<name>`` where the public
face has it, else ``<home module>.<name>``)."""


def moved_message(old: str) -> str | None:
    """The one line for the old spelling ``old`` (a name or a module path); ``None`` if it never moved."""
    if old in MOVED_NAMES:
        return f"{old} moved: use {MOVED_NAMES[old]}"
    if old in MOVED_MODULES:
        elsewhere = [f"{name[len(old) + 1:]}: {new}" for name, new in MOVED_NAMES.items() if name.startswith(old + ".")]
        return f"{old} moved: use {MOVED_MODULES[old]}" + (f" ({'; '.join(elsewhere)})" if elsewhere else "")
    return None


def old_name_error(module: str, name: str) -> AttributeError:
    """The error for ``module.name`` that does not exist: one line naming the new spelling when
    it moved, else Python's own message. A package's ``__getattr__`` raises it."""
    message = moved_message(f"{module}.{name}")
    return AttributeError(message or f"module {module!r} has no attribute {name!r}", name=name)


class OldNamesFinder(importlib.abc.MetaPathFinder):
    """The last finder on :data:`sys.meta_path`: an import of a moved spelling (asked for only
    once no real finder holds it) raises an ImportError with its one line; anything else is left
    to Python (``None``: no module)."""

    fedtune_old_names = True  # how install_finder recognises one (also across reloads of this module)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        message = moved_message(fullname)
        if message is None:
            return None
        raise ImportError(message, name=fullname)


def install_finder() -> None:
    """Append an :class:`OldNamesFinder` to :data:`sys.meta_path` unless one is there
    (``import fedtune`` calls this)."""
    if not any(getattr(finder, "fedtune_old_names", False) for finder in sys.meta_path):
        sys.meta_path.append(OldNamesFinder())
