"""Server rules: how the coordinator combines client updates into the next global model.

A :class:`ServerRule` wraps aggregation math (plain NumPy functions: the shared ones in
:mod:`fedtune.algorithms.server.aggregate`, each family's own in its module) with its hyperparameters
and state; :class:`FedAvg` is the plain one. Conventions (docs/methods.md; the update and weight
conventions are :mod:`~fedtune.algorithms.server.aggregate`'s):

* Only the parameter part of the flat vector (``layout.num_params``) reaches
  :meth:`ServerRule.aggregate`; floating buffers (batch-norm statistics) go to
  :meth:`ServerRule.aggregate_buffers` after it (default: :func:`fedavg_buffers`, the weighted
  mean; the FDA rules follow their parameter rule, docs/methods-seeds.md §2). Integer buffers
  (``num_batches_tracked``) are not in the flat vector and stay as each model has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.server.aggregate import fedavg_buffers, mean_weights, server_step, weighted_sum
from fedtune.algorithms.base import HParam, RunConfig, read_hparams
from fedtune.algorithms.declarations import CLIENT_WEIGHTING


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
    float32 weights loses ``d`` below half an ulp of ``θ``, docs/methods-server.md §14)."""

    params: np.ndarray  # new global parameters, float32 [num_params]
    diagnostics: dict[str, Any]  # becomes diag.<name> columns
    direction: np.ndarray | None = None  # the rule's direction d, float64 [num_params] (None: no server optimiser)


class ServerRule:
    """Base class. Subclasses set ``name`` and implement :meth:`aggregate`; what the rule declares
    (hyperparameters, ``needs_target_client``, its default ``global_lr``, the client hooks it
    needs) is its :class:`~fedtune.algorithms.base.ServerRuleSpec` in
    :mod:`fedtune.algorithms.declarations`.

    ``cfg`` is the validated :class:`~fedtune.config.FederatedRunConfig`; a rule reads its own
    hyperparameters once, typed, when it is built: named in :attr:`reads` (``{"kappa": OMG_KAPPA}``:
    ``self.kappa`` is ``OMG_KAPPA.of(cfg)``), or in ``__init__``. Server rules are NumPy only: the
    coordinator, which never imports torch, builds them.
    """

    name: ClassVar[str]
    reads: ClassVar[dict[str, HParam[Any]]] = {}
    """Attribute -> hyperparameter, read when the rule is built (:func:`~fedtune.algorithms.base.read_hparams`)."""

    def __init__(self, cfg: RunConfig, layout: Any):
        self.cfg = cfg
        self.layout = layout
        read_hparams(self, cfg)

    @property
    def threads(self) -> int:
        """Threads for this rule's passes over the updates: the coordinator's whole CPUs
        (``coordinator_cpus``; at least 1, since with 0 the coordinator shares a client's bundle).
        They change a round's server time, never a bit (:mod:`fedtune.algorithms.server.blocked`)."""
        return max(1, int(getattr(self.cfg, "coordinator_cpus", 0) or 0))

    @property
    def global_lr(self) -> float:
        """This run's server learning rate (``cfg.effective_global_lr``: ``global_lr``, else the
        rule's declared default)."""
        return self.cfg.effective_global_lr

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
        parameters (:func:`~fedtune.algorithms.server.aggregate.server_step` forms them from it); without it
        only ``server_optimizer: sgd`` can run.
        """
        raise NotImplementedError

    def streamed_weights(self, weights: np.ndarray) -> np.ndarray | None:
        """The weights ``w_u`` of a rule whose whole round is one weighted sum of the updates,
        ``d = Σ_u w_u Δ_u``, and of the buffers, given the FedAvg weights ``p_u`` of the round's
        sampled participants; ``None`` (the default) for a rule that needs every update at once.

        With weights the coordinator never holds the ``[U, M]`` updates: it adds each update to
        the sum as it arrives (:class:`~fedtune.algorithms.server.blocked.RowSum`, the bits of
        :func:`~fedtune.algorithms.server.aggregate.weighted_sum`) and calls
        :meth:`streamed_result` with ``d``."""
        return None

    def streamed_result(self, params: np.ndarray, direction: np.ndarray) -> AggregateResult:
        """The round of a rule with :meth:`streamed_weights`, from the streamed sum ``d``."""
        raise NotImplementedError(f"server rule {self.name} declares no streamed sum")

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




class FedAvg(ServerRule):
    """``θ ← θ + global_lr · Σ_u w_u Δ_u``, ``w`` the example weights ``p_u`` or ``1/U``
    (``client_weighting``; docs/methods-baselines.md §7.4, §8.5); the buffers are averaged with the same ``w``."""

    name = "fedavg"

    def __init__(self, cfg: RunConfig, layout: Any):
        super().__init__(cfg, layout)
        self.weighting = CLIENT_WEIGHTING.of(cfg)

    def aggregate_buffers(self, buffers, client_buffers, weights, *, info):
        return fedavg_buffers(client_buffers, mean_weights(weights, self.weighting))

    def streamed_weights(self, weights):
        # a subclass with its own aggregate (FedGMA's mask) needs the whole matrix
        return mean_weights(weights, self.weighting) if type(self).aggregate is FedAvg.aggregate else None

    def streamed_result(self, params, direction):
        return AggregateResult(server_step(params, direction, self.global_lr), {}, direction)

    def aggregate(self, params, updates, weights, *, extras, round, info):
        d = weighted_sum(updates, mean_weights(weights, self.weighting), threads=self.threads)  # fedavg_step's sum
        return self.streamed_result(params, d)
