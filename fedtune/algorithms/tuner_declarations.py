"""The in-run tuners declared once: their hyperparameters, checks and where their code lives (as
:mod:`fedtune.algorithms.declarations` declares the client methods and server rules).

An in-run tuner tunes the clients' knobs inside one federated run (FedEx, Khodak et al. 2021:
docs/methods-server.md §25). Its hyperparameters are :class:`~fedtune.algorithms.base.HParam` s like a
method's; they are run fields (``fedex_configs: 4``, ``cfg.fedex_eps``), made one per declaration by
:func:`fedtune.config.tuner_fields`, and its cross-field ``check`` runs with the client method's and
the server rule's when a config is validated. Torch-free and NumPy-free like the other
declarations; the registry :data:`fedtune.algorithms.IN_RUN_TUNERS` is built from
:data:`IN_RUN_TUNER_SPECS`, the code lives in :mod:`fedtune.algorithms.server.fedex` (the
coordinator's half) and :mod:`fedtune.algorithms.client.fedex` (the client hook).

>>> [h.name for h in FEDEX_SPEC.hparams][:3], FEDEX_SPEC.switch
(['fedex_configs', 'fedex_knobs', 'fedex_eps'], 'fedex_configs')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedtune.algorithms.base import HParam, InRunTunerSpec, RunConfig
from fedtune.errors import ConfigError

# ================================================================== FedEx (Khodak et al., NeurIPS 2021)
FEDEX_SCHEDULES = ("aggressive", "adaptive", "auto", "constant", "scale")
FEDEX_OBJECTIVES = ("error", "loss")
FEDEX_MAX_CONFIGS = 1000
"""Most configurations FedEx tunes over: the authors' runs give FedEx the arms of their wrapper,
``elim_rate ** num_elims`` (5 under random search, 27 under three eliminations at rate 3;
mkhodak/FedEx hyper.py ``wrapped_fedex``, cifar.py ``--configs``), and a run draws at most
participants x rounds of them; the server also sends the ``[k, knobs]`` table to every client each
round and builds it one configuration at a time. 1000 leaves ample room above the authors'."""
AUTHORS_RANGES: dict[str, dict[str, Any]] = {
    "local_lr": {"distribution": "loguniform", "low": 1e-4, "high": 1.0},
    "local_momentum": {"distribution": "uniform", "low": 0.0, "high": 1.0},
    "weight_decay": {"distribution": "loguniform", "low": 1e-5, "high": 1e-1},
    "local_epochs": {"distribution": "int", "low": 1, "high": 5},
    "batch_size": {"distribution": "int", "low": 8, "high": 128, "log": True},
    "prox_mu": {"distribution": "loguniform", "low": 1e-5, "high": 1.0},
}
"""The ranges FedEx perturbs the knobs of the authors' client space within (their ``CLIENT`` in
cifar.py, femnist.py, shakespeare.py: lr 10^U(-4, 0), momentum U(0, 1), weight decay 10^U(-5, -1),
epochs 1..5, batch 2^(3..7), FedProx mu 10^U(-5, 0)); every other client-method hyperparameter
moves within its declared search range (``HParam.search``)."""
SHARED_KNOBS = ("local_lr", "local_momentum", "weight_decay", "local_epochs", "batch_size")
"""The run fields FedEx may tune with any client method."""

FEDEX_CONFIGS = HParam(
    "fedex_configs", 0, "FedEx (Khodak et al. 2021): tune the clients' knobs (fedex_knobs) inside the run over this "
    "many local configurations, the run's own values and fedex_configs - 1 perturbations of them; every participant "
    "trains a configuration drawn from the server's distribution, which an exponentiated-gradient step moves towards "
    "the configurations whose trained models score best on the clients' validation splits; 0 = off (docs/methods-server.md "
    "section 25)", kind="int", lo=0, hi=FEDEX_MAX_CONFIGS, note="0: off")
FEDEX_KNOBS = HParam(
    "fedex_knobs", ("local_lr",), "FedEx: the client knobs it tunes: local_lr, local_momentum, weight_decay, "
    "local_epochs, batch_size, or the client method's own hyperparameters (prox_mu, fedsr_l2r, ...; not those of a "
    "method with a server side)", kind="names")
FEDEX_EPS = HParam(
    "fedex_eps", 0.5, "FedEx: how far the configurations 1.. move from the run's own values, as a fraction of each "
    "knob's range (the authors' ranges for the knobs they tune, else the knob's declared search range; the authors' "
    "eps; 0 = all configurations the run's own: the run without FedEx; 1 already reaches a knob's whole range from "
    "any value)", lo=0.0, hi=1.0)
FEDEX_SCHEDULE = HParam(
    "fedex_schedule", "aggressive", "FedEx step size eta0 / denom, eta0 = sqrt(2 log k): aggressive (denom = max "
    "|gradient|, the authors' scripts' default), adaptive (root of the summed squared max |gradient|), auto "
    "(sqrt(round)), constant (1), scale (1 / sqrt(2 log k))", kind="choice", choices=FEDEX_SCHEDULES)
FEDEX_BASELINE = HParam(
    "fedex_baseline", 0.0, "FedEx baseline: discount factor of the mean of earlier rounds' scores subtracted from each "
    "score (0 = the last round's, 1 = the mean of all; the authors' wrapper draws it from U[0, 1))", lo=0.0, hi=1.0)
FEDEX_DIFF = HParam(
    "fedex_diff", False, "FedEx: score the change local training made (after - before) instead of the trained "
    "model's score", kind="bool")
FEDEX_CUTOFF = HParam(
    "fedex_cutoff", 0.0, "FedEx: below this entropy of the distribution it stops changing and every client trains "
    "the most likely configuration", lo=0.0)
FEDEX_OBJECTIVE = HParam(
    "fedex_objective", "error", "FedEx score of a client's trained model on its validation split: error (1 - "
    "accuracy, the authors' default) or loss (cross-entropy)", kind="choice", choices=FEDEX_OBJECTIVES)


def client_knob_hparams(cfg: RunConfig) -> dict[str, HParam]:
    """The client method's hyperparameters FedEx may tune: all of them, unless the method keeps a
    server side (FedDyn's alpha, FedIIR's moving average are read on the server too: one value per run)."""
    spec = cfg.resolved.client_spec
    return {} if spec.server_side is not None else {h.name: h for h in spec.hparams}


def knob_searches(knobs: Sequence[str], method_hparams: Mapping[str, HParam]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(knob, its range)`` for each of ``knobs``: :data:`AUTHORS_RANGES` for the knobs the authors
    tune, a client method's other hyperparameters (``method_hparams``) their declared ``search``.
    Declarations only (never a search-space file), so every process of a run finds the same ranges.
    Raises ConfigError naming the knob and the allowed ones."""
    declared: dict[str, Mapping[str, Any]] = {name: AUTHORS_RANGES[name] for name in SHARED_KNOBS}
    declared.update({name: AUTHORS_RANGES.get(name, h.search) for name, h in method_hparams.items()
                     if h.search is not None and h.kind in ("float", "int")})
    if not knobs:  # every configuration would be the run's own: a distribution moved by noise alone
        raise ConfigError(f"field 'fedex_knobs': [] names no knob to tune, so all fedex_configs configurations "
                          f"would be the same; allowed: one or more of {', '.join(sorted(declared))}")
    out = []
    for name in knobs:
        entry = declared.get(name)
        if entry is None:
            raise ConfigError(f"field 'fedex_knobs': {name!r} is not a client knob FedEx can tune here; allowed: "
                              f"{', '.join(sorted(declared))}")
        out.append((name, entry))
    if len(set(knobs)) != len(knobs):
        raise ConfigError(f"field 'fedex_knobs': {list(knobs)} names a knob twice; allowed: each once")
    return out


def _check_fedex(cfg: RunConfig) -> None:
    """FedEx's fields against the run (``fedex_configs`` > 0)."""
    if FEDEX_CONFIGS.of(cfg) == 1:
        raise ConfigError("field 'fedex_configs': 1 configuration leaves FedEx nothing to choose; allowed: 0 (off) "
                          "or at least 2")
    if not cfg.resolved.client_spec.supervised:
        raise ConfigError(f"field 'fedex_configs': FedEx scores the clients' trained classifiers on their validation "
                          f"splits, which client method {cfg.resolved.client_method_name} (unsupervised) has "
                          "not; allowed: 0")
    if cfg.val_fraction == 0 and cfg.split_scheme is None:
        raise ConfigError("field 'fedex_configs': FedEx scores the clients on their validation splits, and "
                          "val_fraction is 0; allowed: 0, or val_fraction > 0")
    knob_searches(FEDEX_KNOBS.of(cfg), client_knob_hparams(cfg))


FEDEX_SPEC = InRunTunerSpec(
    "fedex", "fedtune.algorithms.server.fedex:FedExServer",
    "FedEx (Khodak et al. 2021): every participant trains a configuration of the clients' knobs drawn from the "
    "server's distribution, moved each round by an exponentiated-gradient step on their validation scores",
    (FEDEX_CONFIGS, FEDEX_KNOBS, FEDEX_EPS, FEDEX_SCHEDULE, FEDEX_BASELINE, FEDEX_DIFF, FEDEX_CUTOFF, FEDEX_OBJECTIVE),
    check=_check_fedex, title="FedEx", off="FedEx is off (fedex_configs 0)", on="fedex_configs >= 2 (FedEx on)",
    knobs="fedex_knobs", client_hooks=("fedtune.algorithms.client.fedex:FedExHook",), columns=("fedex_json",))

IN_RUN_TUNER_SPECS: tuple[InRunTunerSpec, ...] = (FEDEX_SPEC,)

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")] + [
    "client_knob_hparams", "knob_searches"]
