"""Server rules: how the coordinator combines client updates into the next global model.

A :class:`ServerRule` wraps aggregation math (plain NumPy functions: the shared ones in
:mod:`fedtune.algorithms.aggregate`, each family's own in its module) with its hyperparameters
and state; :class:`FedAvg` is the plain one. Conventions (docs/methods.md; the update and weight
conventions are :mod:`~fedtune.algorithms.aggregate`'s):

* Only the parameter part of the flat vector (``layout.num_params``) reaches
  :meth:`ServerRule.aggregate`; floating buffers (batch-norm statistics) go to
  :meth:`ServerRule.aggregate_buffers` after it (default: :func:`fedavg_buffers`, the weighted
  mean; the FDA rules follow their parameter rule, docs/methods.md §2). Integer buffers
  (``num_batches_tracked``) are not in the flat vector and stay as each model has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.aggregate import WEIGHTINGS, fedavg_buffers, mean_weights, server_step, weighted_sum
from fedtune.algorithms.base import HParam


@dataclass(frozen=True)
class RoundInfo:
    """Who sent the rows of ``updates`` (row ``u`` = ``client_ids[u]``), for rules that treat
    clients differently (FedDA/FedGP: the FDA target client has role ``"target"``)."""

    client_ids: tuple[int, ...]
    roles: tuple[str, ...]  # "source" | "target"
    steps: tuple[int, ...]  # local optimiser steps each client took this round
    num_examples: tuple[int, ...]

    @classmethod
    def sources(cls, num: int, steps: int = 1, examples: int = 1) -> "RoundInfo":
        """``num`` plain source clients (tests and benchmarks)."""
        return cls(tuple(range(num)), ("source",) * num, (steps,) * num, (examples,) * num)


@dataclass
class AggregateResult:
    """A rule's round: ``params = θ + η·d`` rounded to float32 (what ``server_optimizer: sgd``
    keeps, bit for bit), and ``direction``, the rule's ``d`` itself in float64, which an adaptive
    server optimiser steps along (never ``(params − θ)/η``: at small ``η`` that difference of
    float32 weights loses ``d`` below half an ulp of ``θ``, docs/methods.md §14)."""

    params: np.ndarray  # new global parameters, float32 [num_params]
    diagnostics: dict[str, Any]  # becomes diag.<name> columns
    direction: np.ndarray | None = None  # the rule's direction d, float64 [num_params] (None: no server optimiser)


class ServerRule:
    """Base class. Subclasses set ``name``/``hparams`` and implement :meth:`aggregate`.

    ``cfg`` is the validated :class:`~fedtune.config.FederatedRunConfig`; a rule reads its own
    hyperparameters once, typed, when it is built (``self.kappa = OMG_KAPPA.of(cfg)`` in
    ``__init__``; a classmethod such as :meth:`check_config` reads ``OMG_KAPPA.of(cfg)`` too).
    Server rules are NumPy only: the coordinator, which never imports torch, builds them.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    hparams: ClassVar[tuple[HParam, ...]] = ()
    needs_target_client: ClassVar[bool] = False  # FedDA/FedGP: only in the fda setting
    # Auto-β: the FDA target client returns extras["step_updates"], float32 [B, num_params], its
    # raw step −local_lr·∇_b on each of its B local batches; every source returns
    # extras["mean_step_update"], float32 [num_params], the mean of its raw per-batch steps.
    wants_target_steps: ClassVar[bool] = False
    # FedGA: every participant also returns the validation loss and accuracy of the global model it
    # received and of its trained model (extras "ga_loss_global", "ga_loss_local", "ga_acc_global",
    # "ga_acc_local", float64 [1]; eval mode, un-augmented; NaN for an empty split).
    wants_generalization_gap: ClassVar[bool] = False
    # This rule's default for the run's ``global_lr`` field when the user leaves it unset.
    default_global_lr: ClassVar[float] = 1.0

    def __init__(self, cfg: Any, layout: Any):
        self.cfg = cfg
        self.layout = layout

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Raise a ConfigError where ``cfg`` (its hyperparameters already checked one by one) cannot
        run with this rule: cross-field conditions, checked once when the config is validated."""

    @classmethod
    def effective_global_lr(cls, cfg: Any) -> float:
        """The server learning rate a run with ``cfg`` uses: ``cfg.global_lr`` if set, else this
        rule's :attr:`default_global_lr` (the one source of truth; :attr:`global_lr` and the
        config's ``hp.global_lr`` column read it)."""
        return float(cfg.global_lr) if cfg.global_lr is not None else float(cls.default_global_lr)

    @classmethod
    def wants_target_steps_for(cls, cfg: Any) -> bool:
        """Whether a run with ``cfg`` needs the clients' raw per-batch steps (the target's
        ``step_updates``, the sources' ``mean_step_update``; FedDA/FedGP: only with
        ``gp_beta = "auto"``); the default is the class attribute :attr:`wants_target_steps`."""
        return bool(cls.wants_target_steps)

    @property
    def threads(self) -> int:
        """Threads for this rule's passes over the updates: the coordinator's whole CPUs
        (``coordinator_cpus``; at least 1, since with 0 the coordinator shares a client's bundle).
        They change a round's server time, never a bit (:mod:`fedtune.algorithms.blocked`)."""
        return max(1, int(getattr(self.cfg, "coordinator_cpus", 0) or 0))

    @property
    def global_lr(self) -> float:
        """This run's server learning rate (:meth:`effective_global_lr`)."""
        return self.effective_global_lr(self.cfg)

    def payload(self, round: int) -> dict[str, np.ndarray]:
        """Arrays broadcast to clients with the weights this round (e.g. FedGaLA's reference)."""
        return {}

    def aggregate(self, params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *,
                  extras: list[dict[str, np.ndarray]], round: int, info: RoundInfo) -> AggregateResult:
        """New global parameters from the round's updates.

        ``updates`` is ``[U, num_params]`` float32, one row per participant in ascending client id;
        it is the coordinator's scratch buffer, valid during this call only: copy what you keep.
        ``weights`` are the FedAvg weights ``p_u``; ``extras[u]`` the arrays client ``u``'s method
        returned (e.g. per-batch displacements); ``info`` who sent each row (ids, roles, steps).
        A rule whose step is ``θ + η·d`` returns ``d`` (float64) as ``direction`` beside the
        parameters (:func:`~fedtune.algorithms.aggregate.server_step` forms them from it); without it
        only ``server_optimizer: sgd`` can run.
        """
        raise NotImplementedError

    def aggregate_buffers(self, buffers: np.ndarray, client_buffers: np.ndarray, weights: np.ndarray, *,
                          info: RoundInfo) -> np.ndarray:
        """New floating buffers (batch-norm running statistics), float32 ``[S]``, called right after
        :meth:`aggregate` in the same round.

        ``buffers`` are the global model's (``[S]``), ``client_buffers`` the participants' after
        local training (``[U, S]``, rows as in ``aggregate``), ``weights`` the FedAvg ``p_u``. The
        default is their weighted mean :func:`fedavg_buffers`; the FDA rules override it."""
        return fedavg_buffers(client_buffers, weights)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the rule (checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


CLIENT_WEIGHTING = HParam("client_weighting", "examples",
                          "FedAvg's mean of the participants' models and batch-norm buffers: examples = weights "
                          "n_u / sum n (McMahan et al.); uniform = 1/U each (FedSR's and FedIIR's authors, the "
                          "default of the presets fedsr and fediir)", kind="choice", choices=WEIGHTINGS, variant=True)


class FedAvg(ServerRule):
    """``θ ← θ + global_lr · Σ_u w_u Δ_u``, ``w`` the example weights ``p_u`` or ``1/U``
    (``client_weighting``; docs/methods.md §7.4, §8.5); the buffers are averaged with the same ``w``."""

    name = "fedavg"
    description = "FedAvg: θ ← θ + global_lr · Σ w_u Δ_u, w_u = p_u or 1/U (client_weighting)"
    hparams = (CLIENT_WEIGHTING,)

    def __init__(self, cfg: Any, layout: Any):
        super().__init__(cfg, layout)
        self.weighting = CLIENT_WEIGHTING.of(cfg)

    def aggregate_buffers(self, buffers, client_buffers, weights, *, info):
        return fedavg_buffers(client_buffers, mean_weights(weights, self.weighting))

    def aggregate(self, params, updates, weights, *, extras, round, info):
        weights = mean_weights(weights, self.weighting)
        d = weighted_sum(updates, weights, threads=self.threads)  # fedavg_step's sum: the same bits
        return AggregateResult(server_step(params, d, self.global_lr), {}, d)
