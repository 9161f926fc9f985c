"""The server side of the runtime: the coordinator and the client pools it drives.

The :class:`Coordinator` holds the global model (a flat float32 vector) and the server rule's
state. One call of :meth:`Coordinator.run_round` samples the round's participants, broadcasts
the weights, collects the trained states, aggregates them with the server rule (batch-norm
buffers by FedAvg), and has the workers evaluate the new model (each client's validation split,
and fixed shards of the held-out target test set). It talks to clients only through a pool:
:class:`LocalPool` (in-process, sequential) or :class:`RayPool` (client actors; weights through
the object store, zero-copy).

The coordinator is NumPy only: it never imports torch, so its actor starts in a fraction of a
second and takes no CPU from the clients' torch imports at launch.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedtune.algorithms.server import RoundInfo
from fedtune.data.base import FederatedPlan
from fedtune.runtime.common import EvalCounts, torch_threads
from fedtune.runtime.worker import (
    ClientWorker,
    EvalReply,
    FeatureSet,
    FitReply,
    TargetShard,
    eval_shards,
)


class ClientFailure(RuntimeError):
    """A client actor died and the failure policy says to stop (or its retry failed too)."""


# fedtune's bad-input errors, by the name Ray prints in a remote traceback: raised inside an actor
# (its __init__ or a method) they are re-raised as themselves, one line, as on the local backend.
_INPUT_ERRORS = {"fedtune.config.ConfigError": ("fedtune.config", "ConfigError"),
                 "fedtune.data.base.DataError": ("fedtune.data.base", "DataError")}


def input_error_of(exc: BaseException) -> BaseException | None:
    """The fedtune ConfigError/DataError behind a Ray error, or None.

    A ``RayTaskError`` (a method raised) carries the original exception as ``cause`` (walked
    through nested actors). An ``ActorDiedError`` from a failed ``__init__`` carries only the
    creation task's traceback as text (Ray keeps no cause object): its last line
    ``fedtune.data.base.DataError: <message>`` is parsed and the error rebuilt with that message.
    """
    import importlib

    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        seen += 1
        for qualname, (module, name) in _INPUT_ERRORS.items():
            cls = getattr(importlib.import_module(module), name)
            if type(e) is cls:
                return e
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException) and cause is not e:
            e = cause
            continue
        break
    text = str(exc)
    best: tuple[int, str, str] | None = None
    for qualname in _INPUT_ERRORS:
        i = text.rfind(qualname + ": ")
        if i >= 0 and (best is None or i > best[0]):
            best = (i, qualname, text[i + len(qualname) + 2:])
    if best is None:
        return None
    module, name = _INPUT_ERRORS[best[1]]
    message = best[2].strip().split("\n\nThe above exception", 1)[0].strip()
    return getattr(importlib.import_module(module), name)(message)


def assign_clients(num_clients: int, num_workers: int) -> list[list[int]]:
    """Logical client ``c`` lives on worker ``c % num_workers`` for the whole run."""
    return [[c for c in range(num_clients) if c % num_workers == w] for w in range(num_workers)]


def assign_shards(shards: list[TargetShard], num_workers: int) -> list[list[TargetShard]]:
    """Target-test shard ``j`` is evaluated by worker ``j % num_workers``."""
    return [[s for s in shards if s.shard_id % num_workers == w] for w in range(num_workers)]


# ------------------------------------------------------------------------------------------------
class LocalPool:
    """All clients in this process, trained one after another (the reference sequential backend)."""

    def __init__(self, cfg_dict: dict[str, Any], plan: FederatedPlan, client_threads: int):
        from fedtune.runtime.common import set_torch_threads

        self._set_threads = lambda: set_torch_threads(client_threads)
        self._set_threads()
        self.worker = ClientWorker(cfg_dict, list(plan.clients), 0, eval_shards(plan),
                                   manage_threads=False)
        self.num_workers = 1
        self.restarts = 0

    def initial_state(self):
        return self.worker.initial_state()

    def publish(self, weights: np.ndarray) -> np.ndarray:
        return weights

    def fit(self, weights, payload, round, client_ids) -> tuple[list[FitReply], list[int]]:
        self._set_threads()
        return [self.worker.fit(weights, payload, round, list(client_ids))], []

    def evaluate(self, weights) -> Any:
        self._set_threads()
        return self.worker.evaluate(weights)

    def collect_evaluation(self, pending) -> list[EvalReply]:
        return [pending]

    def shutdown(self) -> None:
        pass


class ActorFactory:
    """Re-creates client actor ``w`` in its placement-group bundle (used on failure)."""

    def __init__(self, cfg_dict, assignment, plan, pg, bundle_of_worker, cpus, gpus):
        self.cfg_dict, self.assignment, self.plan = cfg_dict, assignment, plan
        self.shards = assign_shards(eval_shards(plan), len(assignment))
        self.pg, self.bundle_of_worker, self.cpus, self.gpus = pg, bundle_of_worker, cpus, gpus

    def __call__(self, w: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from fedtune.runtime.worker import client_actor_class

        specs = [self.plan.clients[c] for c in self.assignment[w]]
        strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=self.bundle_of_worker[w],
                                                    placement_group_capture_child_tasks=True)
        return client_actor_class().options(
            num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy,
            name=None, max_concurrency=1,
        ).remote(self.cfg_dict, specs, w, self.shards[w])


class RayPool:
    """Client actors, one per worker slot; failure handling per ``on_client_failure``."""

    def __init__(self, actors: list, factory: ActorFactory, assignment: list[list[int]], policy: str):
        self.actors = list(actors)
        self.factory = factory
        self.assignment = assignment
        self.policy = policy
        self.num_workers = len(actors)
        self.restarts = 0

    def initial_state(self):
        import ray
        from ray.exceptions import RayError

        try:
            return ray.get(self.actors[0].initial_state.remote())
        except RayError as exc:  # bad input in a worker's __init__: the error itself, not Ray's wrapper
            err = input_error_of(exc)
            if err is not None:
                raise err from None
            raise

    def publish(self, weights: np.ndarray):
        import ray

        return ray.put(weights)

    def _restart(self, w: int) -> None:
        import ray

        try:
            ray.kill(self.actors[w], no_restart=True)
        except Exception:
            pass
        self.actors[w] = self.factory(w)
        self.restarts += 1

    def _call_all(self, method: str, per_worker_args: dict[int, tuple]) -> tuple[dict[int, Any], list[int]]:
        """Call ``method`` on the given workers; handle dead actors; return replies and skipped workers."""
        import ray
        from ray.exceptions import RayActorError, RayError

        refs = {w: getattr(self.actors[w], method).remote(*args) for w, args in per_worker_args.items()}
        replies, dead = {}, []
        for w, ref in refs.items():
            try:
                replies[w] = ray.get(ref)
            except RayError as exc:
                err = input_error_of(exc)
                if err is not None:  # bad input (an undecodable image ...): a restart would fail again
                    raise err from None
                if not isinstance(exc, RayActorError):
                    raise
                dead.append(w)
        skipped = []
        for w in dead:
            clients = self.assignment[w]
            if self.policy == "fail":
                raise ClientFailure(f"client actor {w} (clients {clients}) died during {method}; "
                                    "on_client_failure=fail stops the run (retry or skip would go on)")
            self._restart(w)
            if self.policy == "skip":
                skipped.append(w)
                continue
            try:
                replies[w] = ray.get(getattr(self.actors[w], method).remote(*per_worker_args[w]))
            except RayActorError as exc:
                raise ClientFailure(f"client actor {w} (clients {clients}) died during {method}, was restarted, "
                                    f"and died again on the retry: {exc}") from None
        return replies, skipped

    def fit(self, weights_ref, payload, round, client_ids) -> tuple[list[FitReply], list[int]]:
        wanted = set(int(c) for c in client_ids)
        args = {}
        for w, owned in enumerate(self.assignment):
            mine = [c for c in owned if c in wanted]
            if mine:
                args[w] = (weights_ref, payload, round, mine)
        replies, skipped_workers = self._call_all("fit", args)
        skipped = sorted(c for w in skipped_workers for c in args[w][3])
        return [replies[w] for w in sorted(replies)], skipped

    def evaluate(self, weights_ref):
        return {w: (weights_ref,) for w in range(self.num_workers)}

    def collect_evaluation(self, pending) -> list[EvalReply]:
        replies, _ = self._call_all("evaluate", pending)
        return [replies[w] for w in sorted(replies)]

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass

    def handles(self) -> list:
        return list(self.actors)


# ------------------------------------------------------------------------------------------------
# Linear-probe evaluation of unsupervised encoders (ufdg): NumPy + scikit-learn, never torch.
PROBE_C = 1.0  # inverse L2 strength of the probe's logistic regression (sklearn's default)
PROBE_MAX_ITER = 1000  # lbfgs iterations (deterministic; a non-converged fit is still a fixed function of its input)
PROBE_MIN_PROB = 1e-12  # probabilities are clipped here for the log-loss (classes unseen by the probe get 0)


def preload_probe() -> None:
    """Import what :class:`LinearProbe` needs (scikit-learn: about a second, more on a busy
    machine); the coordinator runs it in a thread while the client actors start."""
    try:
        import sklearn.linear_model
        import sklearn.preprocessing  # noqa: F401
    except ImportError:  # pragma: no cover - the real import in LinearProbe.fit reports it
        pass


class LinearProbe:
    """A deterministic multinomial logistic-regression probe on frozen features.

    Features are standardised with the fitting set's mean and standard deviation (sklearn's
    ``StandardScaler``: constant features are left unscaled), then sklearn's
    ``LogisticRegression(solver="lbfgs", C=PROBE_C, max_iter=PROBE_MAX_ITER)`` (multinomial for
    more than two classes) is fitted, in float64, with BLAS limited to one thread so the result
    is bit-identical in any process. A fitting set with a single class gives the constant
    predictor of that class; an empty or non-finite one gives no probe (NaN metrics).

    >>> x = np.array([[0.0, 1.0], [0.1, 0.9], [1.0, 0.0], [0.9, 0.2]])
    >>> probe = LinearProbe.fit(x, np.array([0, 0, 1, 1]))
    >>> probe.predict(np.array([[0.0, 1.2], [1.3, 0.1]])).tolist()
    [0, 1]
    """

    def __init__(self, scaler: Any, model: Any, constant: int | None):
        self.scaler, self.model, self.constant = scaler, model, constant

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> LinearProbe | None:
        import warnings

        from threadpoolctl import threadpool_limits

        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.int64)
        if len(y) == 0 or not np.isfinite(x).all():
            return None
        classes = np.unique(y)
        if len(classes) == 1:
            return cls(None, None, int(classes[0]))
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        with threadpool_limits(limits=1), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            scaler = StandardScaler().fit(x)
            model = LogisticRegression(C=PROBE_C, solver="lbfgs", max_iter=PROBE_MAX_ITER)
            model.fit(scaler.transform(x), y)
        return cls(scaler, model, None)

    def proba(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(classes [K], probabilities [n, K]) of the examples ``x``."""
        from threadpoolctl import threadpool_limits

        x = np.asarray(x, dtype=np.float64)
        if self.constant is not None:
            return np.array([self.constant]), np.ones((len(x), 1))
        with threadpool_limits(limits=1):
            return self.model.classes_, self.model.predict_proba(self.scaler.transform(x))

    def predict(self, x: np.ndarray) -> np.ndarray:
        classes, p = self.proba(x)
        return classes[np.argmax(p, axis=1)]

    def counts(self, x: np.ndarray, y: np.ndarray) -> EvalCounts:
        """Correct predictions and summed log-loss on ``(x, y)`` (probabilities clipped at
        :data:`PROBE_MIN_PROB`)."""
        y = np.asarray(y, dtype=np.int64)
        out = EvalCounts()
        if len(y) == 0:
            return out
        classes, p = self.proba(x)
        pred = classes[np.argmax(p, axis=1)]
        col = {int(c): i for i, c in enumerate(classes)}
        p_true = np.array([p[i, col[int(t)]] if int(t) in col else 0.0 for i, t in enumerate(y)])
        out.correct = int((pred == y).sum())
        out.count = len(y)
        out.loss_sum = float(-np.log(np.maximum(p_true, PROBE_MIN_PROB)).sum())
        return out


def _probe_scores(fit: list[FeatureSet], score: dict[str, list[FeatureSet]]) -> dict[str, EvalCounts | None]:
    """Fit a :class:`LinearProbe` on the concatenated ``fit`` sets; counts per key of ``score``
    (None per key when there is no probe: nothing to fit on, or non-finite features)."""
    fit = [f for f in fit if len(f.y)]
    probe = None
    if fit:
        probe = LinearProbe.fit(np.concatenate([f.x for f in fit]), np.concatenate([f.y for f in fit]))
    out: dict[str, EvalCounts | None] = {}
    for key, sets in score.items():
        sets = [f for f in sets if len(f.y)]
        if probe is None or not sets:
            out[key] = None
            continue
        x = np.concatenate([f.x for f in sets])
        out[key] = probe.counts(x, np.concatenate([f.y for f in sets])) if np.isfinite(x).all() else None
    return out


def _acc_loss(c: EvalCounts | None) -> tuple[float, float]:
    return (math.nan, math.nan) if c is None else (c.acc, c.loss)


def probe_metrics(evals: list[EvalReply], plan: FederatedPlan, shards: list[TargetShard]) -> dict[str, Any]:
    """Linear-probe metrics of an unsupervised encoder (setting ufdg) from the workers' features.

    * ``target_acc`` / ``target_loss`` (and ``target_acc.<d>`` per target domain): a
      :class:`LinearProbe` fitted on the features of ``plan.target_probe`` (the ``probe_fraction``
      of the target domain's labels, stratified) and scored on the target-test shards. Those
      target labels fit the probe and nothing else: they are never used for selection.
    * ``val_acc`` / ``val_loss`` (and ``val_acc.<d>`` per source domain), the honest selection
      metric: a linear probe fitted on one half of the source clients' validation features and
      scored on the other half. The halves are fixed and seed-independent: inside each source
      client's validation split (in its stored order), even positions fit the probe, odd positions
      score it, so every client (and domain) is on both sides. A client with one validation
      example only fits.

    * ``oracle_acc`` / ``oracle_loss`` (when the plan has an oracle slice): the target probe scored
      on the oracle slice's shards (the ``oracle`` selection protocol; never part of ``target_acc``).

    ``val_loss`` / ``target_loss`` are the probes' mean log-loss on the scored examples. Missing
    or unusable features (no fitting examples, non-finite features) give NaN.
    Sets are concatenated in client-id and shard order, so the metrics do not depend on how many
    workers computed the features (or on the backend).
    """
    val: dict[int, FeatureSet] = {}
    feats: dict[int, FeatureSet] = {}
    for reply in evals:
        val.update(zip(reply.client_ids, reply.val_features))
        feats.update(zip(reply.shard_ids, reply.shard_features))
    fit_val: list[FeatureSet] = []
    score_val: dict[str, list[FeatureSet]] = {"*": []}
    for cid in sorted(val):
        spec = plan.clients[cid]
        if spec.role != "source":
            continue
        f = val[cid]
        fit_val.append(FeatureSet(f.x[0::2], f.y[0::2]))
        odd = FeatureSet(f.x[1::2], f.y[1::2])
        score_val["*"].append(odd)
        if spec.domain is not None:
            score_val.setdefault(f"val_acc.{spec.domain}", []).append(odd)
    probe_sets = [feats[sh.shard_id] for sh in shards if sh.split == "probe" and sh.shard_id in feats]
    score_target: dict[str, list[FeatureSet]] = {"*": []}
    for sh in shards:  # shard order
        if sh.split == "test" and sh.shard_id in feats:
            score_target["*"].append(feats[sh.shard_id])
            score_target.setdefault(f"target_acc.{sh.domain}", []).append(feats[sh.shard_id])
        elif sh.split == "oracle" and sh.shard_id in feats:  # the oracle slice: its own key, never target_acc
            score_target.setdefault("oracle", []).append(feats[sh.shard_id])
    out: dict[str, Any] = {}
    v = _probe_scores(fit_val, score_val)
    out["val_acc"], out["val_loss"] = _acc_loss(v.pop("*"))
    for key in sorted(v):
        out[key] = _acc_loss(v[key])[0]
    t = _probe_scores(probe_sets, score_target)
    tgt = t.pop("*")
    oracle = t.pop("oracle", None)
    for key in sorted(t):
        out[key] = _acc_loss(t[key])[0]
    out["target_acc"], out["target_loss"] = _acc_loss(tgt)
    if any(sh.split == "oracle" for sh in shards):
        out["oracle_acc"], out["oracle_loss"] = _acc_loss(oracle)
    return out


# ------------------------------------------------------------------------------------------------
@dataclass
class RoundResult:
    round: int
    metrics: dict[str, Any]
    status: str  # "ok" | "diverged"


class Coordinator:
    """Global model, server rule, target evaluation; drives one round at a time.

    In setting ufdg (unsupervised client methods) evaluation is a linear probe on the frozen
    encoder (:func:`probe_metrics`): ``target_acc`` from a probe fitted on the target-probe split
    (used for nothing else) and scored on the target-test shards; ``val_acc``, the honest
    selection metric, from a probe fitted on the even positions and scored on the odd positions
    of each source client's validation split (a fixed, seed-independent split)."""

    def __init__(self, cfg_dict: dict[str, Any], plan: FederatedPlan, pool_spec: dict[str, Any]):
        from fedtune.algorithms import resolve
        from fedtune.config import RunConfig

        self.cfg = cfg = RunConfig.from_dict(cfg_dict)
        self.plan = plan
        if plan.setting == "ufdg":  # the probe's scikit-learn import (seconds) overlaps the workers' start-up
            import threading

            threading.Thread(target=preload_probe, name="preload-sklearn", daemon=True).start()
        self.pool = self._make_pool(pool_spec)
        weights, self.layout, self.num_model_params = self.pool.initial_state()
        self.weights = np.array(weights, dtype=np.float32)  # own, writable copy
        resolved = resolve(cfg)
        self.rule = resolved.server_rule(cfg, self.layout)
        self.needs_global_move = resolved.client_method.needs_global_move
        self.global_move: np.ndarray | None = None  # θ^t − θ^(t−1), kept only when a client method needs it
        self.shards = eval_shards(plan)  # target-test shards, then ufdg's target-probe shards
        self.weights_ref = self.pool.publish(self.weights)

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
        return self.pool.handles() if isinstance(self.pool, RayPool) else []

    def run_round(self, round: int, evaluate: bool = True) -> RoundResult:
        from fedtune.algorithms import fedavg_weights
        from fedtune.data import sample_participants

        cfg, layout = self.cfg, self.layout
        t_round = time.perf_counter()
        participants = sample_participants(self.plan.num_clients, self.plan.participation, cfg.seed, round)

        # --- clients train --------------------------------------------------------------------
        t0 = time.perf_counter()
        payload = dict(self.rule.payload(round))
        if self.needs_global_move and self.global_move is not None:
            payload["global_move"] = self.global_move
        replies, skipped = self.pool.fit(self.weights_ref, self.pool.publish(payload) if payload else {},
                                         round, participants.tolist())
        client_s = time.perf_counter() - t0

        rows: dict[int, tuple[FitReply, int]] = {}
        for reply in replies:
            for i, cid in enumerate(reply.client_ids):
                rows[cid] = (reply, i)
        order = sorted(rows)
        metrics: dict[str, Any] = {"num_participants": len(order), "skipped_clients": len(skipped)}
        if not order:
            raise ClientFailure(f"round {round}: no client update arrived (skipped: {skipped})")

        # --- server aggregates -----------------------------------------------------------------
        t0 = time.perf_counter()
        n = np.array([rows[c][0].num_examples[rows[c][1]] for c in order], dtype=np.float64)
        losses = np.array([rows[c][0].losses[rows[c][1]] for c in order], dtype=np.float64)
        p = fedavg_weights(n)
        train_loss = float(np.sum(p * losses))
        status = "ok"
        if not math.isfinite(train_loss):
            status = "diverged"
        else:
            P = layout.num_params
            theta = self.weights[:P]
            updates = self._update_buffer(len(order), P)
            for u, c in enumerate(order):
                reply, i = rows[c]
                np.subtract(reply.states[i, :P], theta, out=updates[u])
            extras = [rows[c][0].extras[rows[c][1]] for c in order]
            info = RoundInfo(tuple(order), tuple(self.plan.clients[c].role for c in order),
                             tuple(int(rows[c][0].steps[rows[c][1]]) for c in order),
                             tuple(int(x) for x in n))
            result = self.rule.aggregate(theta, updates, p, extras=extras, round=round, info=info)
            new = np.empty_like(self.weights)
            new[:P] = result.params
            if layout.size > P:
                new[P:] = self.rule.aggregate_buffers(self.weights[P:], np.stack([rows[c][0].states[rows[c][1], P:]
                                                                                  for c in order]), p, info=info)
            for key, value in result.diagnostics.items():
                metrics[f"diag.{key}"] = value
            # Client methods' own metrics (e.g. skipped tensor-steps): example-weighted means.
            client_metrics = [rows[c][0].metrics[rows[c][1]] for c in order]
            for key in sorted({k for m in client_metrics for k in m}):
                vals = [(w, m[key]) for w, m in zip(p, client_metrics) if key in m]
                metrics[f"diag.{key}"] = float(sum(w * v for w, v in vals) / sum(w for w, _ in vals))
            if not np.isfinite(new).all():
                status = "diverged"
            else:
                if self.needs_global_move:
                    self.global_move = new[:P] - self.weights[:P]
                self.weights = new
        server_s = time.perf_counter() - t0
        client_compute_s = float(sum(sum(r.compute_s) for r in replies))
        critical_s = float(max(sum(r.compute_s) for r in replies))  # the busiest worker's training time
        client_io_s = float(max(r.io_s for r in replies))  # the busiest worker's weight copies in/out
        del rows, replies  # release the object-store buffers of the client states

        # --- evaluation on the workers: client validation splits and target-test shards ------------
        t0 = time.perf_counter()
        publish_s = 0.0
        if status == "ok":
            t_pub = time.perf_counter()
            self.weights_ref = self.pool.publish(self.weights)
            publish_s = time.perf_counter() - t_pub
            if evaluate:
                evals = self.pool.collect_evaluation(self.pool.evaluate(self.weights_ref))
                metrics.update(self._eval_metrics(evals))
        eval_s = time.perf_counter() - t0

        w_bytes = self.weights.nbytes
        metrics.update({
            "train_loss": train_loss,
            "wall_s": time.perf_counter() - t_round,
            "client_s": client_s,
            "client_compute_s": client_compute_s,
            "client_critical_s": critical_s,
            "client_io_s": client_io_s,
            "publish_s": publish_s,
            "server_s": server_s,
            "eval_s": eval_s,
            "bytes_moved": int(w_bytes * (self.pool.num_workers + len(order))),
            "actor_restarts": self.pool.restarts,
        })
        return RoundResult(round, metrics, status)

    def _update_buffer(self, rows: int, size: int) -> np.ndarray:
        """A [rows, size] float32 scratch kept across rounds (no fresh 100s-of-MB allocation per round)."""
        buf = getattr(self, "_updates", None)
        if buf is None or buf.shape[1] != size or buf.shape[0] < rows:
            buf = self._updates = np.empty((rows, size), np.float32)
        return buf[:rows]

    def _eval_metrics(self, evals: list[EvalReply]) -> dict[str, Any]:
        """Round metrics from the workers' evaluation replies.

        Supervised runs: accuracy and cross-entropy summed over the replies' counts:
        ``val_acc`` over the *source* clients' validation splits only; ``target_val_acc`` over the
        FDA target client's validation split (selection protocol ``target-val``; never part of
        ``val_acc``); ``target_acc`` over the target-test shards (fl: every client's test split);
        ``oracle_acc`` over the oracle-slice shards (never part of ``target_acc``). Setting
        ufdg (unsupervised client methods, no class logits): linear probes on the workers'
        encoder features, see :func:`probe_metrics` (``val_acc`` = a probe fitted on the even
        and scored on the odd positions of the sources' validation splits; ``target_acc`` = a
        probe fitted on the target-probe split and scored on the target-test shards)."""
        if self.plan.setting == "ufdg":
            return probe_metrics(evals, self.plan, self.shards)
        val_all, test_all = EvalCounts(), EvalCounts()
        val_dom: dict[str, EvalCounts] = {}
        per_client: dict[int, tuple[EvalCounts, EvalCounts]] = {}
        shards: dict[int, EvalCounts] = {}
        for reply in evals:
            for cid, v, t in zip(reply.client_ids, reply.val, reply.test):
                per_client[cid] = (v, t)
            shards.update(zip(reply.shard_ids, reply.shards))
        target: dict[str, EvalCounts] = {}
        oracle = EvalCounts()
        for sh in self.shards:  # shard order: layout-independent sums
            if sh.shard_id in shards:
                if sh.split == "oracle":
                    oracle.add(shards[sh.shard_id])
                elif sh.split == "test":
                    target.setdefault(sh.domain, EvalCounts()).add(shards[sh.shard_id])
        target_val = EvalCounts()
        has_target_client = False
        for cid in sorted(per_client):  # fixed order: sums do not depend on the actor layout
            v, t = per_client[cid]
            spec = self.plan.clients[cid]
            if spec.role == "source":
                val_all.add(v)
                if spec.domain is not None:
                    val_dom.setdefault(spec.domain, EvalCounts()).add(v)
            elif spec.role == "target":  # fda: the target client's own held-out labels
                has_target_client = True
                target_val.add(v)
            test_all.add(t)
        out: dict[str, Any] = {"val_acc": val_all.acc, "val_loss": val_all.loss}
        for d in sorted(val_dom):
            out[f"val_acc.{d}"] = val_dom[d].acc
        if has_target_client:
            out["target_val_acc"], out["target_val_loss"] = target_val.acc, target_val.loss
        if any(sh.split == "oracle" for sh in self.shards):
            out["oracle_acc"], out["oracle_loss"] = oracle.acc, oracle.loss
        if self.plan.setting == "fl":
            out["target_acc"], out["target_loss"] = test_all.acc, test_all.loss
        else:
            tgt = EvalCounts()
            for d in sorted(target):
                tgt.add(target[d])
                out[f"target_acc.{d}"] = target[d].acc
            out["target_acc"], out["target_loss"] = tgt.acc, tgt.loss
        return out

    def shutdown(self) -> None:
        self.pool.shutdown()

    # --- Tune support: checkpoints and actor reuse (fedtune.tune.trainable) -------------------
    def get_state(self) -> dict[str, Any]:
        """The server side of a checkpoint: global weights (float32), the server rule's
        ``state_dict()`` and the last global move (None unless a client method needs it).
        Participant sampling and client seeds derive from (seed, round), so no RNG state."""
        return {"weights": self.weights.copy(), "rule": self.rule.state_dict(),
                "global_move": None if self.global_move is None else self.global_move.copy()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Load :meth:`get_state`'s output and publish the weights for the next round."""
        weights = np.array(state["weights"], dtype=np.float32)
        if weights.shape != self.weights.shape:
            raise ValueError(f"checkpoint holds {weights.size} weights but this run's model has "
                             f"{self.weights.size}: it belongs to another model or dataset")
        self.weights = weights
        self.rule.load_state_dict(state["rule"])
        move = state.get("global_move")
        self.global_move = None if move is None else np.array(move, dtype=np.float32)
        self.weights_ref = self.pool.publish(self.weights)

    def reconfigure(self, cfg_dict: dict[str, Any], plan: FederatedPlan, pool_spec: dict[str, Any]) -> None:
        """Start over as the coordinator of another run on already re-configured client actors
        (Tune ``reuse_actors``): the constructor again, without shutting the pool's actors down."""
        self.__init__(cfg_dict, plan, pool_spec)
