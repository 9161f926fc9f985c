"""The server side of a federated run: the :class:`Coordinator` and its rounds.

The coordinator holds the global model (a flat float32 vector) and the server rule's state.
One call of :meth:`Coordinator.run_round` is split as Flower splits a round:

1. a *fit round* (:meth:`~Coordinator._fit_round`): sample the round's participants, broadcast
   the weights (and the server rule's payload), take each client's trained state as it arrives
   (ascending client id): into float64 sums when the rule and the client method's server side
   need only those (FedAvg, FedDyn, Scaffold: :class:`FitRound`), else into a row of the updates;
2. the *aggregate* (:meth:`~Coordinator._aggregate_fit`): the server rule combines the updates
   (and the batch-norm buffers), and a NaN/Inf loss or model, or an exploded loss
   (:func:`loss_exploded`), marks the round diverged;
3. an *evaluate round* (:meth:`~Coordinator._evaluate_round`): the workers evaluate the new model
   (each client's validation split, and fixed shards of the held-out target test set), and the
   replies become metrics (:mod:`fedtune.runtime.evaluation`);
4. where the next round is a folded round that only the coordinator's state decides, its fit is
   sent before this round returns (:meth:`~Coordinator._run_ahead`), so the actors train while
   the driver writes this round's row.

It talks to clients only through a pool (:mod:`fedtune.runtime.pools`): in-process, sequential,
or client actors with weights through the object store, zero-copy.

The coordinator is NumPy only: it never imports torch, so its actor starts in a fraction of a
second and takes no CPU from the clients' torch imports at launch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedtune.algorithms import SERVER_OPTIMIZERS
from fedtune.algorithms.server.aggregate import fedavg_weights
from fedtune.algorithms.server.blocked import one_blas_thread
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.algorithms.server.side import server_side_of
from fedtune.data.base import FederatedPlan
from fedtune.data.partition import sample_participants
from fedtune.results.status import DIVERGED, OK
from fedtune.runtime.checkpoint import check_identity, run_identity
from fedtune.runtime.common import torch_threads
from fedtune.runtime.evaluation import client_metric_means, eval_metrics, preload_probe
from fedtune.runtime.fit_round import FitRound
from fedtune.runtime.messages import EvalReply, eval_shards
from fedtune.runtime.pools import ClientFailure, LocalPool, RayPool
from fedtune.runtime.worker import _placement_group_id


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
class _Ahead:
    """A folded fit round sent before its :meth:`Coordinator.run_round` (:meth:`Coordinator._run_ahead`)."""
    round: int
    weights_ref: Any  # the published weights it trains from: another publish abandons it
    planned: list[int]
    feeds: dict[str, tuple[str, dict[int, float], bool]]
    payload_ref: Any
    calls: Any  # RayPool.fold_start's
    started: float  # time.perf_counter() when it was sent


@dataclass
class RoundResult:
    round: int
    metrics: dict[str, Any]
    status: str  # OK | DIVERGED (fedtune.results.status)


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
        from fedtune.config import FederatedRunConfig  # lazy: keeps yaml out of this module's import

        self.cfg = cfg = FederatedRunConfig.from_validated(cfg_dict)
        self.plan = plan
        if plan.setting == "ufdg":  # the probe's scikit-learn import (seconds) overlaps the workers' start-up

            threading.Thread(target=preload_probe, name="preload-sklearn", daemon=True).start()
        self.pool = self._make_pool(pool_spec)
        weights, self.layout, self.num_model_params = self.pool.initial_state()
        self.weights = np.array(weights, dtype=np.float32)  # own, writable copy
        self.rule = cfg.resolved.server_rule(cfg, self.layout)  # NumPy only: the client method stays unimported
        self.side = server_side_of(cfg, self.layout, plan.num_clients, domains=plan.domains,
                                   train_domains=plan.train_domain_ids())
        self.optimizer = SERVER_OPTIMIZERS[cfg.server_optimizer](cfg, self.rule.global_lr)
        # in-run tuning of the clients' knobs (fedtune.algorithms.server.tuner), None without: it adds
        # to the broadcast, takes its entries out of the replies and steps after the fit round
        self.tuner = cfg.resolved.in_run_tuner(cfg)
        self.first_loss: float | None = None  # round 1's training loss, the scale of loss_exploded
        self.folded_rounds = 0  # fit rounds the workers folded (RayPool.fold_start), for diagnostics and tests
        self.rounds_ahead = 0  # folded rounds taken as run ahead (_run_ahead), for diagnostics and tests
        self.run_ahead = True  # send the next folded round before returning a round (tests turn it off)
        self._ahead: _Ahead | None = None
        # what training a client leaves on its worker: per-client state (a method that keeps it) or client hooks
        from fedtune.runtime.placement import keeps_client_state  # lazy: keeps yaml out of this module's import

        self._worker_state = bool(keeps_client_state(cfg) or cfg.resolved.client_hooks(cfg))
        self.shards = eval_shards(plan)  # target-test shards, then ufdg's target-probe shards
        self._publish()

    def _make_pool(self, spec: dict[str, Any]):
        if spec["kind"] == "local":
            return LocalPool(self.cfg.to_dict(), self.plan, torch_threads(self.cfg.client_cpus))
        return RayPool(spec["actors"], spec["factory"], spec["assignment"], self.cfg.on_client_failure)

    # ------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"num_params": self.num_model_params, "flat_size": self.layout.size,
                "num_workers": self.pool.num_workers, "pid": os.getpid(),
                "placement_group_id": _placement_group_id(),
                "client_placement": "roaming" if getattr(self.pool, "roaming", False) else "fixed"}

    def client_handles(self) -> list:
        return self.pool.handles()

    def run_round(self, round: int, evaluate: bool = True) -> RoundResult:
        """Round ``round``: a fit round, the server rule's aggregate, then (unless the round
        diverged) the new model is published and, when ``evaluate``, evaluated. Returns the
        round's metrics (counts, ``diag.*``, evaluation, timings) and status."""
        t_round = time.perf_counter()
        fit = self._fit_round(round)
        t_round = min(t_round, fit.started)  # a round run ahead started before this call
        metrics: dict[str, Any] = {"num_participants": len(fit.order), "skipped_clients": len(fit.skipped)}
        if not fit.order:
            raise ClientFailure(f"round {round}: no client update arrived (skipped: {fit.skipped})")

        t0 = time.perf_counter()
        train_loss, status, diagnostics = self._aggregate_fit(round, fit)
        metrics.update(diagnostics)
        if self.tuner is not None:
            metrics.update({f"diag.{key}": value for key, value in self.tuner.end_round().items()})
            metrics.update(self.tuner.columns())
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
        if status == OK:
            self._run_ahead(round + 1)

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
        and the last global move where the client method needs it); their replies, taken one
        client at a time as they arrive (:class:`FitRound`): summed on the fly when the rule's
        round is one weighted sum and the client method keeps no server side, else kept as rows.
        A round run ahead (:meth:`_run_ahead`) for this round and these weights is taken as sent;
        any other is abandoned."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (ahead.round != round or ahead.weights_ref is not self.weights_ref):
            self.pool.fold_abandon(ahead.calls)
            ahead = None
        if ahead is None:
            t0 = time.perf_counter()
            planned, feeds = self._planned(round)
            runs = self.pool.fold_runs(planned) if feeds is not None and self.tuner is None else None
            payload_ref = self._payload_ref(round, planned)
            calls = None if runs is None else self.pool.fold_start(self.weights_ref, payload_ref, round, runs, feeds)
        else:
            t0, planned, feeds, payload_ref, calls = ahead.started, ahead.planned, ahead.feeds, ahead.payload_ref, ahead.calls
        P = self.layout.num_params
        fit = FitRound(self.weights[:P], self.layout.size, planned,
                       None if feeds is not None else self._update_buffer(len(planned), P), feeds)
        fit.started = t0
        if calls is not None and self._fold(fit, calls):
            self.rounds_ahead += ahead is not None
            fit.seconds = time.perf_counter() - t0
            return fit
        for reply in self.pool.fit_stream(self.weights_ref, payload_ref, round,
                                          [c for c in planned if c not in fit.skipped], fit.skipped):
            if feeds is not None and reply.num_examples[0] != self.plan.clients[reply.client_ids[0]].num_train:
                raise RuntimeError(f"client {reply.client_ids[0]} trained on {reply.num_examples[0]} examples, its "
                                   f"plan says {self.plan.clients[reply.client_ids[0]].num_train}")
            if self.tuner is not None:
                for extras in reply.extras:
                    self.tuner.take(extras)
            fit.add(reply)
        fit.seconds = time.perf_counter() - t0
        return fit

    def _planned(self, round: int) -> tuple[list[int], dict[str, tuple[str, dict[int, float], bool]] | None]:
        """The round's participants (ascending) and its streamed sums (:meth:`_streamed_feeds`)."""
        planned = sorted(sample_participants(self.plan.num_clients, self.cfg.participation_at(round), self.cfg.seed,
                                             round).tolist())
        return planned, self._streamed_feeds(planned)

    def _payload_ref(self, round: int, planned: list[int]) -> Any:
        """The round's broadcast beside the weights: the server rule's payload, the client method's
        server side's and the in-run tuner's, published ({} when empty). Called once a round."""
        payload = dict(self.rule.payload(round))
        if self.side is not None:
            side = self.side.payload(round)
            clash = sorted(set(side) & set(payload))
            if clash:
                raise RuntimeError(f"payload keys {clash} are sent by both the server rule {self.rule.name} and "
                                   f"the client method {self.side.name}'s server side")
            payload.update(side)
        if self.tuner is not None:
            payload.update(self.tuner.payload(round, planned, self.plan.num_clients))
        return self.pool.publish(payload) if payload else {}

    def _fold(self, fit: FitRound, calls: Any) -> bool:
        """A streamed round folded on the workers (docs/methods.md §0.1): each carries the sums on
        through its clients and one reply of sums per worker comes back
        (:meth:`~fedtune.runtime.pools.RayPool.fold_finish`), into ``fit``; False when a worker
        died (``fit.skipped`` then holds the clients ``on_client_failure=skip`` leaves out) and the
        round is to be streamed."""
        replies = self.pool.fold_finish(calls, fit.skipped)
        if replies is None:
            return False
        for reply in replies:
            for cid, n in zip(reply.client_ids, reply.num_examples):
                if n != self.plan.clients[cid].num_train:
                    raise RuntimeError(f"client {cid} trained on {n} examples, its plan says "
                                       f"{self.plan.clients[cid].num_train}")
            fit.take_fold(reply)
        fit.end_fold(replies[-1])
        self.folded_rounds += 1
        return True

    def _run_ahead(self, round: int) -> None:
        """Send round ``round``'s folded fit to the workers now, while this round's result goes
        back to the driver and its row is written (docs/methods.md §0.1, "Rounds run ahead"): the
        next :meth:`run_round` takes it as sent, or abandons it when the run went elsewhere (a
        loaded checkpoint, a new configuration). Only where nothing but the coordinator's state
        decides the round and nothing on the workers changes by training it: a folded round, no
        in-run tuner, a client method that keeps no per-client state, no client hooks, and a
        round the run will take (at most ``rounds``)."""
        if (not self.run_ahead or not self.pool.folds or round > self.cfg.rounds or self.tuner is not None
                or self._worker_state):
            return
        t0 = time.perf_counter()
        planned, feeds = self._planned(round)
        runs = None if feeds is None else self.pool.fold_runs(planned)
        if runs is None:
            return
        payload_ref = self._payload_ref(round, planned)
        calls = self.pool.fold_start(self.weights_ref, payload_ref, round, runs, feeds)
        self._ahead = _Ahead(round, self.weights_ref, planned, feeds, payload_ref, calls, t0)

    def _abandon_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self.pool.fold_abandon(ahead.calls)

    def _streamed_feeds(self, planned: list[int]) -> dict[str, tuple[str, dict[int, float], bool]] | None:
        """The sums of a streamed round (:class:`FitRound`'s ``feeds``): the server rule's weighted
        sum of the updates and of the buffers, weights from the sampled participants' example
        counts (:meth:`~fedtune.algorithms.server.rule.ServerRule.streamed_weights`), and the
        server side's (:meth:`~fedtune.algorithms.server.side.ServerSide.streamed_sums`), as
        ``side.<name>``; None when either needs the whole matrix."""
        n = np.array([self.plan.clients[c].num_train for c in planned], dtype=np.float64)
        if not planned or n.sum() <= 0:
            return None
        weights = self.rule.streamed_weights(fedavg_weights(n))
        side = {} if self.side is None else self.side.streamed_sums()
        if weights is None or side is None:
            return None
        rule_w = dict(zip(planned, (float(w) for w in weights)))
        feeds = {"rule.update": ("update", rule_w, True), "rule.buffers": ("buffers", rule_w, True)}
        for name, spec in side.items():
            feeds[f"side.{name}"] = (spec.source, dict.fromkeys(planned, spec.weight(len(planned))), spec.mean)
        return feeds

    def _aggregate_fit(self, round: int, fit: FitRound) -> tuple[float, str, dict[str, Any]]:
        """The server side of the round (Flower's strategy ``aggregate_fit``) and its divergence
        check: the example-weighted training loss and, unless it is NaN/Inf or exploded
        (:func:`loss_exploded` against the first round's), the server rule's new global model,
        taken only when it is finite. Returns (train loss, round status, ``diag.*`` metrics); a
        diverged round keeps the old global model."""
        n = np.array(fit.num_examples, dtype=np.float64)
        losses = np.array(fit.losses, dtype=np.float64)
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
        ``aggregate`` of the updates ``θ_u − θ`` (or its streamed sum), buffers by its
        ``aggregate_buffers`` (or their streamed sum); and the ``diag.*`` metrics (the rule's
        diagnostics, then the client methods' own metrics)."""
        P = self.layout.num_params
        theta = self.weights[:P]
        new = np.empty_like(self.weights)
        info = RoundInfo(tuple(fit.order), tuple(self.plan.clients[c].role for c in fit.order),
                         tuple(fit.steps), tuple(int(x) for x in n))
        if fit.streamed:
            sums = fit.totals()
            side_sums = {name[len("side."):]: total for name, total in sums.items() if name.startswith("side.")}
            with one_blas_thread():
                result = self.rule.streamed_result(theta, sums["rule.update"])
                if self.side is not None:
                    result = self.side.streamed_proposal(theta, result, side_sums, info=info)
                params, side_diagnostics = self.optimizer.step(theta, result.params, result.direction, round), {}
                if self.side is not None:
                    params, side_diagnostics = self.side.streamed_update(theta, params, side_sums, round=round,
                                                                         info=info)
            new[:P] = params
            new[P:] = sums["rule.buffers"].astype(np.float32)
        else:
            updates = fit.updates
            result = self.rule.aggregate(theta, updates, p, extras=fit.extras, round=round, info=info)
            # one BLAS thread: the optimiser's and server side's sums and norms give the same bits on
            # every backend (a multi-threaded BLAS sums in another order in another process)
            with one_blas_thread():
                if self.side is not None:  # a server side may replace the rule's step (a uniform mean)
                    result = self.side.proposal(theta, result, updates, info=info)
                params, side_diagnostics = self.optimizer.step(theta, result.params, result.direction, round), {}
                if self.side is not None:
                    params, side_diagnostics = self.side.update(theta, params, updates, p, extras=fit.extras,
                                                                round=round, info=info)
            new[:P] = params
            if self.layout.size > P:
                new[P:] = self.rule.aggregate_buffers(self.weights[P:], fit.buffers, p, info=info)
        diagnostics = {f"diag.{key}": value for key, value in {**result.diagnostics, **side_diagnostics}.items()}
        diagnostics.update(client_metric_means(p, fit.metrics))
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
        self._ahead = None  # the actors go: nothing to wait for
        self.pool.shutdown()

    # --- Tune support: checkpoints and actor reuse (fedtune.tune.trial.trainable) -------------------
    def get_state(self) -> dict[str, Any]:
        """The server side of a checkpoint: global weights (float32), the server rule's
        ``state_dict()``, the client method's server side's (None when it has none) and the
        server optimizer's (its name and moments); the first round's training loss (the scale of
        :func:`loss_exploded`). Participant sampling and client seeds derive from (seed, round), so no RNG state."""
        rule, side = self.rule.state_dict(), None if self.side is None else self.side.state_dict()
        state = {"weights": self.weights.copy(), "rule": rule, "side": side,
                 "optimizer": {"name": self.optimizer.name, "state": self.optimizer.state_dict()},
                 "first_loss": self.first_loss, "identity": run_identity(self.cfg, rule, side, self.optimizer.name)}
        if self.tuner is not None:
            state["tuner"] = self.tuner.state_dict()
        return state

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
        if (state.get("tuner") is None) != (self.tuner is None):  # refused before anything is loaded
            raise ValueError(f"checkpoint {'has no' if state.get('tuner') is None else 'holds an'} in-run tuner but "
                             f"this run {'has one' if self.tuner is not None else 'has none'}: it belongs to another "
                             "configuration")
        if self.tuner is not None:  # refuses another run's configurations before it changes anything
            self.tuner.load_state_dict(state["tuner"])
        self._abandon_ahead()  # a round run ahead of the state this replaces
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
        self._abandon_ahead()
        self.__init__(cfg_dict, plan, pool_spec)
