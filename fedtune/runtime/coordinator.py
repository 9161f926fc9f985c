"""The server side of a federated run: the :class:`Coordinator` and its rounds.

The coordinator holds the global model (a flat float32 vector) and the server rule's state.
One call of :meth:`Coordinator.run_round` is split as Flower splits a round:

1. a *fit round* (:meth:`~Coordinator._fit_round`): sample the round's participants, broadcast
   the weights (and the server rule's payload), collect the trained states;
2. the *aggregate* (:meth:`~Coordinator._aggregate_fit`): the server rule combines the updates
   (and the batch-norm buffers), and a NaN/Inf loss or model, or an exploded loss
   (:func:`loss_exploded`), marks the round diverged;
3. an *evaluate round* (:meth:`~Coordinator._evaluate_round`): the workers evaluate the new model
   (each client's validation split, and fixed shards of the held-out target test set), and the
   replies become metrics (:mod:`fedtune.runtime.evaluation`).

It talks to clients only through a pool (:mod:`fedtune.runtime.pools`): in-process, sequential,
or client actors with weights through the object store, zero-copy.

The coordinator is NumPy only: it never imports torch, so its actor starts in a fraction of a
second and takes no CPU from the clients' torch imports at launch.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedtune.algorithms.server.blocked import one_blas_thread, subtract_rows
from fedtune.algorithms import SERVER_OPTIMIZERS
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.algorithms.server.side import server_side_of
from fedtune.data.base import FederatedPlan
from fedtune.results.status import DIVERGED, OK
from fedtune.runtime.checkpoint import check_identity, run_identity
from fedtune.runtime.common import torch_threads
from fedtune.runtime.evaluation import client_metric_means, eval_metrics, preload_probe
from fedtune.runtime.messages import EvalReply, FitReply, eval_shards
from fedtune.runtime.pools import LocalPool, RayPool
from fedtune.runtime.pools import ClientFailure


# A finite training loss this many times round 1's (or 1, if that was smaller) is an explosion:
# the round is marked diverged like a NaN/Inf loss (server_beta2 near 1: 2.3 -> 2.4e24, finite).
LOSS_EXPLOSION_FACTOR = 1e3


def loss_exploded(loss: float, first_loss: float | None) -> bool:
    """Whether a round's training ``loss`` exploded: ``|loss| > LOSS_EXPLOSION_FACTOR ·
    max(|first_loss|, 1)``, ``first_loss`` the run's first round's (None: this is the first).
    The floor of 1 keeps a small first loss (a pretrained model) from making ordinary noise an
    explosion.

    >>> loss_exploded(2.4e24, 2.3), loss_exploded(1500.0, 0.01), loss_exploded(2500.0, 2.3)
    (True, True, True)
    >>> loss_exploded(999.0, 0.01), loss_exploded(2000.0, 2.3), loss_exploded(1e30, None)
    (False, False, False)
    """
    if first_loss is None:
        return False
    return abs(loss) > LOSS_EXPLOSION_FACTOR * max(abs(float(first_loss)), 1.0)


@dataclass
class RoundResult:
    round: int
    metrics: dict[str, Any]
    status: str  # OK | DIVERGED (fedtune.results.status)


@dataclass
class FitRound:
    """The replies of one fit round, by client: ``order`` lists the clients whose update arrived,
    ascending (so what follows never depends on which worker trained whom)."""

    replies: list[FitReply]
    skipped: list[int]  # sampled clients whose worker died and was skipped (on_client_failure=skip)
    seconds: float  # wall time of the fit phase: payload, broadcast, training, states back
    rows: dict[int, tuple[FitReply, int]] = field(init=False)
    order: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.rows = {cid: (reply, i) for reply in self.replies for i, cid in enumerate(reply.client_ids)}
        self.order = sorted(self.rows)

    def of(self, name: str) -> list:
        """Field ``name`` of :class:`FitReply` (``states``, ``losses``, ``extras`` ...) per client, in ``order``."""
        return [getattr(reply, name)[i] for reply, i in (self.rows[c] for c in self.order)]

    def timings(self) -> dict[str, float]:
        """``client_compute_s`` (all training), ``client_critical_s`` (the busiest worker's
        training time), ``client_io_s`` (the busiest worker's weight copies in and out)."""
        return {"client_compute_s": float(sum(sum(r.compute_s) for r in self.replies)),
                "client_critical_s": float(max(sum(r.compute_s) for r in self.replies)),
                "client_io_s": float(max(r.io_s for r in self.replies))}


class Coordinator:
    """Global model, server rule, target evaluation; drives one round at a time.

    In setting ufdg (unsupervised client methods) evaluation is a linear probe on the frozen
    encoder (:func:`~fedtune.runtime.evaluation.probe_metrics`): ``target_acc`` from a probe
    fitted on the target-probe split (used for nothing else) and scored on the target-test
    shards; ``val_acc``, the honest selection metric, from a probe fitted on the even positions
    and scored on the odd positions of each source client's validation split (a fixed,
    seed-independent split)."""

    def __init__(self, cfg_dict: dict[str, Any], plan: FederatedPlan, pool_spec: dict[str, Any]):
        """The server rule and, where the client method keeps state on the server, its
        :class:`~fedtune.algorithms.server.side.ServerSide` (looked up by name: the client method,
        and torch, are never imported here)."""
        from fedtune.config import FederatedRunConfig

        self.cfg = cfg = FederatedRunConfig.from_validated(cfg_dict)
        self.plan = plan
        if plan.setting == "ufdg":  # the probe's scikit-learn import (seconds) overlaps the workers' start-up
            import threading

            threading.Thread(target=preload_probe, name="preload-sklearn", daemon=True).start()
        self.pool = self._make_pool(pool_spec)
        weights, self.layout, self.num_model_params = self.pool.initial_state()
        self.weights = np.array(weights, dtype=np.float32)  # own, writable copy
        self.rule = cfg.resolved.server_rule(cfg, self.layout)  # NumPy only: the client method stays unimported
        self.side = server_side_of(cfg, self.layout, plan.num_clients, domains=plan.domains,
                                   train_domains=plan.train_domain_ids())
        self.optimizer = SERVER_OPTIMIZERS[cfg.server_optimizer](cfg, self.rule.global_lr)
        self.first_loss: float | None = None  # round 1's training loss, the scale of loss_exploded
        self.shards = eval_shards(plan)  # target-test shards, then ufdg's target-probe shards
        self._publish()

    def _make_pool(self, spec: dict[str, Any]):
        if spec["kind"] == "local":
            return LocalPool(self.cfg.to_dict(), self.plan, torch_threads(self.cfg.client_cpus))
        return RayPool(spec["actors"], spec["factory"], spec["assignment"], self.cfg.on_client_failure)

    # ------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        from fedtune.runtime.worker import _placement_group_id

        return {"num_params": self.num_model_params, "flat_size": self.layout.size,
                "num_workers": self.pool.num_workers, "pid": os.getpid(),
                "placement_group_id": _placement_group_id()}

    def client_handles(self) -> list:
        return self.pool.handles()

    def run_round(self, round: int, evaluate: bool = True) -> RoundResult:
        """Round ``round``: a fit round, the server rule's aggregate, then (unless the round
        diverged) the new model is published and, when ``evaluate``, evaluated. Returns the
        round's metrics (counts, ``diag.*``, evaluation, timings) and status."""
        t_round = time.perf_counter()
        fit = self._fit_round(round)
        metrics: dict[str, Any] = {"num_participants": len(fit.order), "skipped_clients": len(fit.skipped)}
        if not fit.order:
            raise ClientFailure(f"round {round}: no client update arrived (skipped: {fit.skipped})")

        t0 = time.perf_counter()
        train_loss, status, diagnostics = self._aggregate_fit(round, fit)
        metrics.update(diagnostics)
        server_s = time.perf_counter() - t0
        client_s, timings, participants, cohort = fit.seconds, fit.timings(), len(fit.order), list(fit.order)
        del fit  # release the object-store buffers of the client states

        t0 = time.perf_counter()
        publish_s = 0.0
        if status == OK:
            publish_s = self._publish()
            if self.side is not None and self.side.wants_probe():
                metrics.update(self._probe_round(round, cohort))
            if evaluate:
                metrics.update(self._evaluate_round())
        eval_s = time.perf_counter() - t0

        metrics.update({
            "train_loss": train_loss,
            "wall_s": time.perf_counter() - t_round,
            "client_s": client_s,
            **timings,
            "publish_s": publish_s,
            "server_s": server_s,
            "eval_s": eval_s,
            "bytes_moved": int(self.weights.nbytes * (self.pool.num_workers + participants)),
            "actor_restarts": self.pool.restarts,
        })
        return RoundResult(round, metrics, status)

    def _fit_round(self, round: int) -> FitRound:
        """The round's participants train from the global model (with the server rule's payload,
        and the last global move where the client method needs it); their replies, by client."""
        from fedtune.data.partition import sample_participants

        participants = sample_participants(self.plan.num_clients, self.plan.participation, self.cfg.seed, round)
        t0 = time.perf_counter()
        payload = dict(self.rule.payload(round))
        if self.side is not None:
            side = self.side.payload(round)
            clash = sorted(set(side) & set(payload))
            if clash:
                raise RuntimeError(f"payload keys {clash} are sent by both the server rule {self.rule.name} and "
                                   f"the client method {self.side.name}'s server side")
            payload.update(side)
        replies, skipped = self.pool.fit(self.weights_ref, self.pool.publish(payload) if payload else {},
                                         round, participants.tolist())
        return FitRound(replies, skipped, time.perf_counter() - t0)

    def _aggregate_fit(self, round: int, fit: FitRound) -> tuple[float, str, dict[str, Any]]:
        """The server side of the round (Flower's strategy ``aggregate_fit``) and its divergence
        check: the example-weighted training loss and, unless it is NaN/Inf or exploded
        (:func:`loss_exploded` against the first round's), the server rule's new global model,
        taken only when it is finite. Returns (train loss, round status, ``diag.*`` metrics); a
        diverged round keeps the old global model."""
        from fedtune.algorithms.server.aggregate import fedavg_weights

        n = np.array(fit.of("num_examples"), dtype=np.float64)
        losses = np.array(fit.of("losses"), dtype=np.float64)
        p = fedavg_weights(n)
        train_loss = float(np.sum(p * losses))
        if not math.isfinite(train_loss) or loss_exploded(train_loss, self.first_loss):
            return train_loss, DIVERGED, {}
        if self.first_loss is None:
            self.first_loss = train_loss
        new, diagnostics = self._server_rule_step(round, fit, n, p)
        if not np.isfinite(new).all():
            return train_loss, DIVERGED, diagnostics
        self.weights = new
        return train_loss, OK, diagnostics

    def _server_rule_step(self, round: int, fit: FitRound, n: np.ndarray,
                          p: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The new flat model from the clients' states: parameters by the server rule's
        ``aggregate`` of the updates ``θ_u − θ``, buffers by its ``aggregate_buffers``; and the
        ``diag.*`` metrics (the rule's diagnostics, then the client methods' own metrics)."""
        P = self.layout.num_params
        theta = self.weights[:P]
        states = fit.of("states")
        updates = subtract_rows(states, theta, self._update_buffer(len(fit.order), P), threads=self.rule.threads)
        info = RoundInfo(tuple(fit.order), tuple(self.plan.clients[c].role for c in fit.order),
                         tuple(int(s) for s in fit.of("steps")), tuple(int(x) for x in n))
        extras = fit.of("extras")
        result = self.rule.aggregate(theta, updates, p, extras=extras, round=round, info=info)
        # one BLAS thread: the optimiser's and server side's sums and norms give the same bits on
        # every backend (a multi-threaded BLAS sums in another order in another process)
        with one_blas_thread():
            if self.side is not None:  # a server side may replace the rule's step (a uniform mean)
                result = self.side.proposal(theta, result, updates, info=info)
            params, side_diagnostics = self.optimizer.step(theta, result.params, result.direction, round), {}
            if self.side is not None:
                params, side_diagnostics = self.side.update(theta, params, updates, p, extras=extras, round=round,
                                                            info=info)
        new = np.empty_like(self.weights)
        new[:P] = params
        if self.layout.size > P:
            new[P:] = self.rule.aggregate_buffers(self.weights[P:], np.stack([s[P:] for s in states]), p, info=info)
        diagnostics = {f"diag.{key}": value for key, value in {**result.diagnostics, **side_diagnostics}.items()}
        diagnostics.update(client_metric_means(p, fit.of("metrics")))
        return new, diagnostics

    def _probe_round(self, round: int, cohort: list[int]) -> dict[str, Any]:
        """The server side's second call of the round's participants, at the published new model
        (:meth:`~fedtune.algorithms.server.side.ServerSide.wants_probe`): their ``probe`` arrays,
        ascending client id, to :meth:`~fedtune.algorithms.server.side.ServerSide.after_probe`;
        its ``diag.*`` metrics. A participant whose worker was skipped sends none."""
        payload = self.side.payload(round)
        replies = self.pool.probe(self.weights_ref, self.pool.publish(payload) if payload else {}, round, cohort)
        with one_blas_thread():
            diagnostics = self.side.after_probe([replies[c] for c in sorted(replies)], round)
        return {f"diag.{key}": value for key, value in diagnostics.items()}

    def _update_buffer(self, rows: int, size: int) -> np.ndarray:
        """A [rows, size] float32 scratch kept across rounds (no fresh 100s-of-MB allocation per round)."""
        buf = getattr(self, "_updates", None)
        if buf is None or buf.shape[1] != size or buf.shape[0] < rows:
            buf = self._updates = np.empty((rows, size), np.float32)
        return buf[:rows]

    def _publish(self) -> float:
        """Put the global model where the workers read it (the next broadcast); returns the seconds."""
        t0 = time.perf_counter()
        self.weights_ref = self.pool.publish(self.weights)
        return time.perf_counter() - t0

    def _evaluate_round(self) -> dict[str, Any]:
        """The workers evaluate the published global model; the round's evaluation metrics."""
        return self._eval_metrics(self.pool.collect_evaluation(self.pool.evaluate(self.weights_ref)))

    def _eval_metrics(self, evals: list[EvalReply]) -> dict[str, Any]:
        """Round metrics from the workers' evaluation replies: :func:`fedtune.runtime.evaluation.eval_metrics`."""
        return eval_metrics(evals, self.plan, self.shards)

    def shutdown(self) -> None:
        self.pool.shutdown()

    # --- Tune support: checkpoints and actor reuse (fedtune.tune.trial.trainable) -------------------
    def get_state(self) -> dict[str, Any]:
        """The server side of a checkpoint: global weights (float32), the server rule's
        ``state_dict()``, the client method's server side's (None when it has none) and the
        server optimizer's (its name and moments); the first round's training loss (the scale of
        :func:`loss_exploded`). Participant sampling and client seeds derive from (seed, round), so no RNG state."""
        rule, side = self.rule.state_dict(), None if self.side is None else self.side.state_dict()
        return {"weights": self.weights.copy(), "rule": rule, "side": side,
                "optimizer": {"name": self.optimizer.name, "state": self.optimizer.state_dict()},
                "first_loss": self.first_loss, "identity": run_identity(self.cfg, rule, side, self.optimizer.name)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Load :meth:`get_state`'s output and publish the weights for the next round. A checkpoint
        of another method is refused in one line (:func:`~fedtune.runtime.checkpoint.check_identity`)."""
        check_identity(state, run_identity(self.cfg, self.rule.state_dict(),
                                           None if self.side is None else self.side.state_dict(), self.optimizer.name))
        weights = np.array(state["weights"], dtype=np.float32)
        if weights.shape != self.weights.shape:
            raise ValueError(f"checkpoint holds {weights.size} weights but this run's model has "
                             f"{self.weights.size}: it belongs to another model or dataset")
        side = state.get("side")
        if (side is None) != (self.side is None):
            raise ValueError(f"checkpoint {'has no' if side is None else 'holds a'} client-method server side but "
                             f"this run's client method {self.cfg.resolved.client_method_name} "
                             f"{'keeps' if self.side is not None else 'keeps no'} server state: it belongs to "
                             "another algorithm")
        optimizer = state.get("optimizer") or {"name": "sgd", "state": {}}  # written before server optimizers: sgd
        if optimizer["name"] != self.optimizer.name:
            raise ValueError(f"checkpoint was written with server_optimizer {optimizer['name']}, this run uses "
                             f"{self.optimizer.name}: it belongs to another configuration")
        self.weights = weights
        self.first_loss = state.get("first_loss")  # None (an older checkpoint): the next round's loss
        self.optimizer.load_state_dict(optimizer["state"])
        self.rule.load_state_dict(state["rule"])
        if self.side is not None:
            self.side.load_state_dict(side)
        self._publish()

    def reconfigure(self, cfg_dict: dict[str, Any], plan: FederatedPlan, pool_spec: dict[str, Any]) -> None:
        """Start over as the coordinator of another run on already re-configured client actors
        (Tune ``reuse_actors``): the constructor again, without shutting the pool's actors down."""
        self.__init__(cfg_dict, plan, pool_spec)
