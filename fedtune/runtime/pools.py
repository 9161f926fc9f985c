"""The client pools the coordinator drives, and what happens when a client actor dies.

A pool trains and evaluates the logical clients for the :class:`~fedtune.runtime.coordinator.Coordinator`:
:class:`LocalPool` (every client in this process, one after another: the sequential reference)
or :class:`RayPool` (client actors, one per worker slot, weights through the object store,
zero-copy). Both answer the same calls (``initial_state``, ``publish``, ``fit``, ``evaluate`` +
``collect_evaluation``, ``shutdown``) with the same :mod:`~fedtune.runtime.messages`, so a seed
gives the same numbers on either.

Logical clients are owned by the workers in runs of consecutive ids for the whole run, target shard ``j``
by worker ``j % num_workers`` (:func:`assign_clients`, :func:`assign_shards`): the owner evaluates
it and trains it, unless the run's clients roam (:mod:`fedtune.runtime.placement`: every worker
holds every client's data and each round's participants are dealt out by cost,
:meth:`RayPool.trainers`). A client actor that dies is handled by the run's ``on_client_failure``
policy: ``retry`` (restart it and call again), ``skip`` (restart it, leave its clients out of this
call) or ``fail`` (:class:`ClientFailure`).

>>> assign_clients(5, 2)
[[0, 1, 2], [3, 4]]
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any, Callable, Iterator

import numpy as np

from fedtune.algorithms.client.steps import batch_size_note
from fedtune.data.base import FederatedPlan
from fedtune.runtime.common import set_torch_threads
from fedtune.runtime.messages import EvalReply, FitReply, FoldReply, TargetShard, eval_shards
from fedtune.runtime.remote_errors import input_error_of, ray_get
from fedtune.runtime.worker import ClientWorker


class ClientFailure(RuntimeError):
    """A client actor died and the failure policy says to stop (or its retry failed too)."""


class _ActorDied(Exception):
    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


FoldCalls = list  # [(worker, its run of client ids, the ObjectRef of its FoldReply)], in chain order


def assign_clients(num_clients: int, num_workers: int) -> list[list[int]]:
    """Worker ``w`` owns the ``w``-th of ``num_workers`` runs of consecutive client ids (sizes
    differing by at most one, the larger first) for the whole run: the clients of a round that a
    worker trains follow the previous worker's, so a folded round (:meth:`RayPool.fold_start`) can
    carry its sums from one worker to the next. Which worker owns a client never changes a number.

    >>> assign_clients(5, 2), assign_clients(2, 3)
    ([[0, 1, 2], [3, 4]], [[0], [1], []])
    """
    base, extra = divmod(num_clients, num_workers)
    bounds = [w * base + min(w, extra) for w in range(num_workers + 1)]
    return [list(range(bounds[w], bounds[w + 1])) for w in range(num_workers)]


STREAM_BATCHES = 2
"""Replies a client actor sends per round at most (:func:`stream_batch`): two let the coordinator sum
the first half of a worker's clients while it trains the second; each more reply costs a few ms of
the raylet's, the worker's and the coordinator's CPU (measured at 100 clients on 2 cores: 2 replies
per worker 0.19 s/round, 4 replies 0.205, 1 reply 0.21; at 20 clients a round one reply was
fastest, 0.053 s against 0.067 with 4)."""

STREAM_MIN_BYTES = 16 << 20
"""Fewest bytes of trained states worth a reply of their own: a worker with fewer sends them in one."""

STREAM_BATCH_BYTES = 64 << 20
"""Most bytes of trained states in one reply (a large model's clients go one per reply)."""


FOLD_MAX_STATE_BYTES = 4 << 20
"""Largest trained state (about a million float32 weights) a folded round takes (:meth:`RayPool.fold_start`):
where a state's own transfer outweighs Ray's per-object cost (1–5 ms a reply on 2 cores,
docs/evidence-speed.md), streaming it overlaps that transfer with the other clients' training and
keeps no float64 terms on the actors. A bound by reasoning: the folded rounds were measured on
states of 0.34 and 1.08 MB."""

FOLD_TAIL_BYTES = 64 << 20
"""Most bytes of trained states the workers after the first fold in a folded round
(:meth:`RayPool.fold_start`): each keeps its clients' float64 terms (twice the states' bytes) until
the sums before it arrive and then adds them, one worker after another, after the training; a
round with more (a large model, many clients a worker) streams its states to the coordinator, which
adds them while the workers train."""


def stream_batch(num_clients: int, state_bytes: int) -> int:
    """Clients per reply of a worker training ``num_clients`` this round: ``num_clients /
    STREAM_BATCHES`` rounded up, but at least ``STREAM_MIN_BYTES`` and at most
    ``STREAM_BATCH_BYTES`` of states, at most ``num_clients`` and at least 1.

    >>> mb = 1 << 20
    >>> stream_batch(50, mb), stream_batch(10, mb), stream_batch(500, mb), stream_batch(50, 45 * mb), stream_batch(0, 8)
    (25, 10, 64, 1, 1)
    """
    size = max(1, int(state_bytes))
    want = max(math.ceil(num_clients / STREAM_BATCHES), STREAM_MIN_BYTES // size)
    return max(1, min(want, STREAM_BATCH_BYTES // size, num_clients))


def assign_shards(shards: list[TargetShard], num_workers: int) -> list[list[TargetShard]]:
    """Target-test shard ``j`` is evaluated by worker ``j % num_workers``."""
    return [[s for s in shards if s.shard_id % num_workers == w] for w in range(num_workers)]


def warn_if_batch_exceeds_clients(cfg_dict: dict[str, Any], plan: FederatedPlan) -> str | None:
    """Log (once per run: its pool is made once) and return the warning of a ``batch_size`` above
    every client's training set (:func:`~fedtune.algorithms.client.steps.batch_size_note`); None otherwise.
    The run goes on: each client trains full-batch, recorded as ``diag.batch_size_effective``."""
    note = batch_size_note(int(cfg_dict["batch_size"]), [c.num_train for c in plan.clients],
                           cfg_dict.get("local_steps"), int(cfg_dict.get("local_epochs", 1)))
    if note is not None:
        logging.getLogger("fedtune").warning(note)
    return note


# ------------------------------------------------------------------------------------------------
class PoolBase:
    """What every pool shares: :meth:`fit_stream` from a pool's ``fit`` (a pool that can send
    each client as soon as it is trained overrides it)."""

    folds = False  # whether this pool can fold a round (RayPool.fold_start); in process it never does

    def fold_runs(self, client_ids) -> list[tuple[int, list[int]]] | None:
        """The workers of a folded round and their runs of clients (:meth:`RayPool.fold_runs`);
        None: this pool streams every round (in process the states cross nothing, and the streamed
        sums are the same bits)."""
        return None

    def fold_start(self, weights, payload, round, runs, feeds) -> FoldCalls:  # pragma: no cover - fold_runs gave none
        raise NotImplementedError

    def fold_finish(self, calls: FoldCalls, skipped: list[int]) -> list[FoldReply] | None:  # pragma: no cover - fold_runs gave none
        raise NotImplementedError

    def fold_abandon(self, calls: FoldCalls) -> None:  # pragma: no cover - fold_runs gave none
        raise NotImplementedError

    def fit_stream(self, weights, payload, round, client_ids, skipped: list[int]) -> Iterator[FitReply]:
        """The round's trained clients one reply each (:meth:`FitReply.split`), ascending client
        id; clients left out by ``on_client_failure=skip`` are appended to ``skipped``."""
        replies, left_out = self.fit(weights, payload, round, client_ids)
        skipped.extend(left_out)
        yield from sorted((one for reply in replies for one in reply.split()), key=lambda r: r.client_ids[0])


class LocalPool(PoolBase):
    """All clients in this process, trained one after another (the reference sequential backend)."""

    def __init__(self, cfg_dict: dict[str, Any], plan: FederatedPlan, client_threads: int):
        warn_if_batch_exceeds_clients(cfg_dict, plan)
        self._set_threads = lambda: set_torch_threads(client_threads)
        self._set_threads()
        self.worker = ClientWorker(cfg_dict, list(plan.clients), 0, eval_shards(plan),
                                   manage_threads=False, source_bank=plan.source_train_pieces())
        self.num_workers = 1
        self.restarts = 0

    def initial_state(self):
        return self.worker.initial_state()

    def publish(self, weights: np.ndarray) -> np.ndarray:
        return weights

    def fit(self, weights, payload, round, client_ids) -> tuple[list[FitReply], list[int]]:
        self._set_threads()
        return [self.worker.fit(weights, payload, round, list(client_ids))], []

    def fit_stream(self, weights, payload, round, client_ids, skipped: list[int]) -> Iterator[FitReply]:
        self._set_threads()
        yield from self.worker.fit_stream(weights, payload, round, list(client_ids))

    def probe(self, weights, payload, round, client_ids) -> dict[int, dict[str, np.ndarray]]:
        self._set_threads()
        return dict(self.worker.probe(weights, payload, round, list(client_ids)))

    def evaluate(self, weights) -> Any:
        self._set_threads()
        return self.worker.evaluate(weights)

    def collect_evaluation(self, pending) -> list[EvalReply]:
        return [pending]

    def shutdown(self) -> None:
        pass

    def handles(self) -> list:
        return []


class RayPool(PoolBase):
    """Client actors, one per worker slot; failure handling per ``on_client_failure``."""

    folds = True

    def __init__(self, actors: list, factory: Callable[[int], Any], assignment: list[list[int]], policy: str):
        """``factory(w)`` makes client actor ``w`` again after a death (an
        :class:`~fedtune.runtime.actor_factory.ActorFactory`; its ``costs``, when it has them, deal
        roaming clients)."""
        self.actors = list(actors)
        self.factory = factory
        self.assignment = assignment
        self.policy = policy
        self.num_workers = len(actors)
        self.restarts = 0
        self.state_bytes = 0
        self.costs = getattr(factory, "costs", None)  # a plain callable making actor w: owners train
        self.roaming = self.costs is not None

    def trainers(self, client_ids) -> dict[int, list[int]]:
        """Who trains whom this call: ``{worker: ascending client ids}``, the owners, or with roaming
        clients the participants dealt out by cost (:func:`~fedtune.runtime.placement.deal_clients`)."""
        wanted = sorted(set(int(c) for c in client_ids))
        if self.roaming:
            # lazy: keeps yaml out of this module's import
            from fedtune.runtime.placement import deal_clients

            return deal_clients(wanted, self.costs, self.num_workers)
        chosen = set(wanted)
        mine = {w: [c for c in owned if c in chosen] for w, owned in enumerate(self.assignment)}
        return {w: ids for w, ids in mine.items() if ids}

    def initial_state(self):
        # bad input in a worker's __init__: the error itself, not Ray's wrapper
        return ray_get(self.actors[0].initial_state.remote())

    def publish(self, weights: np.ndarray):
        import ray  # lazy: keeps ray out of this module's import

        if isinstance(weights, np.ndarray):  # the global model, not a payload: a trained state's size
            self.state_bytes = int(weights.nbytes)
        return ray.put(weights)

    def _restart(self, w: int) -> None:
        import ray  # lazy: keeps ray out of this module's import

        try:
            ray.kill(self.actors[w], no_restart=True)
        except Exception:
            pass
        self.actors[w] = self.factory(w)
        self.restarts += 1

    def _call_all(self, method: str, per_worker_args: dict[int, tuple]) -> tuple[dict[int, Any], list[int]]:
        """Call ``method`` on the given workers; handle dead actors; return replies and skipped workers."""
        refs = {w: getattr(self.actors[w], method).remote(*args) for w, args in per_worker_args.items()}
        replies, dead = {}, []
        for w, ref in refs.items():
            try:
                replies[w] = self._get(lambda: ref)
            except _ActorDied:
                dead.append(w)
        skipped = []
        for w in dead:
            if self._recover(w, method, per_worker_args[w], replies):
                skipped.append(w)
        return replies, skipped

    def _recover(self, w: int, method: str, args: tuple, replies: dict[int, Any]) -> bool:
        """The failure policy for dead actor ``w``: ``fail`` raises :class:`ClientFailure`; ``skip``
        restarts it and returns True (its clients sit this call out); ``retry`` restarts it and
        calls ``method`` again into ``replies`` (a second death raises :class:`ClientFailure`)."""
        # lazy: keeps ray out of this module's import
        import ray
        from ray.exceptions import RayActorError, RayError

        # the clients of this call (roaming: those dealt to it), else (evaluate) the ones it owns
        clients = args[3] if method in ("fit", "probe") and len(args) > 3 else self.assignment[w]
        if self.policy == "fail":
            raise ClientFailure(f"client actor {w} (clients {clients}) died during {method}; "
                                "on_client_failure=fail stops the run (retry or skip would go on)")
        self._restart(w)
        if self.policy == "skip":
            return True
        try:
            replies[w] = ray.get(getattr(self.actors[w], method).remote(*args))
        except RayError as exc:
            err = input_error_of(exc)  # bad input found by the restarted actor: itself, not a second death
            if err is not None:
                raise err from None
            if not isinstance(exc, RayActorError):
                raise
            raise ClientFailure(f"client actor {w} (clients {clients}) died during {method}, was restarted, "
                                f"and died again on the retry: {exc}") from None
        return False

    def fit(self, weights_ref, payload, round, client_ids) -> tuple[list[FitReply], list[int]]:
        args = {w: (weights_ref, payload, round, mine) for w, mine in self.trainers(client_ids).items()}
        replies, skipped_workers = self._call_all("fit", args)
        skipped = sorted(c for w in skipped_workers for c in args[w][3])
        return [replies[w] for w in sorted(replies)], skipped

    def fit_stream(self, weights_ref, payload, round, client_ids, skipped: list[int]) -> Iterator[FitReply]:
        """Every worker trains its clients among ``client_ids`` at once (a streaming generator per
        actor, :meth:`~fedtune.runtime.worker.ClientWorker.fit_stream`); the replies are taken in
        ascending client id, each as soon as its client is trained, so the coordinator sums while
        the workers train and at most the clients trained ahead of that order wait in the object
        store. A dead actor meets ``on_client_failure``: ``fail`` raises, ``skip`` leaves out its
        clients not yet received (appended to ``skipped``), ``retry`` restarts it and trains
        those again (a second death raises :class:`ClientFailure`)."""
        wanted = sorted(set(int(c) for c in client_ids))
        pending = self.trainers(wanted)
        owner = {c: w for w, ids in pending.items() for c in ids}
        streams = {w: self._stream(w, weights_ref, payload, round, ids) for w, ids in pending.items()}
        received: dict[int, deque] = {w: deque() for w in pending}  # a reply's clients not yet taken
        retried: set[int] = set()
        for cid in wanted:
            w = owner[cid]
            if cid in skipped:
                continue
            while True:
                try:
                    if not received[w]:
                        received[w].extend(self._next(streams[w]).split())
                    reply = received[w].popleft()
                    break
                except _ActorDied as exc:
                    rest = [c for c in pending[w] if c >= cid]
                    if self.policy == "fail":
                        raise ClientFailure(f"client actor {w} (clients {pending[w]}) died during fit; "
                                            "on_client_failure=fail stops the run (retry or skip would go on)") from None
                    if self.policy == "retry" and w in retried:
                        raise ClientFailure(f"client actor {w} (clients {pending[w]}) died during fit, was "
                                            f"restarted, and died again on the retry: {exc.cause}") from None
                    self._restart(w)
                    if self.policy == "skip":
                        skipped.extend(rest)
                        reply = None
                        break
                    retried.add(w)
                    streams[w] = self._stream(w, weights_ref, payload, round, rest)
            if reply is None:
                continue
            if reply.client_ids != [cid]:  # pragma: no cover - the worker yields its clients ascending
                raise RuntimeError(f"client actor {w} sent client {reply.client_ids} where {cid} was due")
            yield reply

    def fold_runs(self, client_ids) -> list[tuple[int, list[int]]] | None:
        """The workers of a folded round in chain order, each with its run of consecutive
        participants (:func:`~fedtune.runtime.placement.deal_contiguous` when clients roam, else
        the owners'); None when a worker's clients would not follow the previous worker's, when a
        state is over :data:`FOLD_MAX_STATE_BYTES`, or when the workers after the first would fold
        more than :data:`FOLD_TAIL_BYTES` of states."""
        wanted = sorted(set(int(c) for c in client_ids))
        if self.roaming:
            # lazy: keeps yaml out of this module's import
            from fedtune.runtime.placement import deal_contiguous

            dealt = deal_contiguous(wanted, self.costs, self.num_workers)
        else:
            dealt = self.trainers(wanted)
        runs = sorted(dealt.items(), key=lambda item: item[1][0])
        if not runs or any(a[1][-1] > b[1][0] for a, b in zip(runs, runs[1:])):
            return None
        if self.state_bytes > FOLD_MAX_STATE_BYTES:
            return None
        if sum(len(ids) for _, ids in runs[1:]) * max(self.state_bytes, 1) > FOLD_TAIL_BYTES:
            return None
        return runs

    def fold_start(self, weights_ref, payload, round, runs: list[tuple[int, list[int]]], feeds) -> FoldCalls:
        """A folded fit round (docs/methods.md §0.1) sent to the workers: they train their runs of
        consecutive participants at once, and each carries the round's float64 sums on from the
        worker before it (:meth:`~fedtune.runtime.worker.ClientWorker.fit_fold`, the previous
        reply's ObjectRef passed along): one reply of sums per worker crosses Ray instead of a
        state per client, the same additions in the same order as the coordinator's streamed sums.
        ``runs``: :meth:`fold_runs`'s for the round's participants. Returns the calls in chain order
        for :meth:`fold_finish` (or :meth:`fold_abandon`)."""
        calls, before = [], None
        for w, ids in runs:
            ref = self.actors[w].fit_fold.remote(weights_ref, payload, round, ids, feeds,
                                                 None if before is None else [before])
            calls.append((w, ids, ref))
            before = ref
        return calls

    def fold_finish(self, calls: FoldCalls, skipped: list[int]) -> list[FoldReply] | None:
        """The replies of :meth:`fold_start`'s calls, in chain order; None when a worker died:
        ``on_client_failure`` ``fail`` raises :class:`ClientFailure`, ``skip`` restarts it and
        appends its clients to ``skipped``, ``retry`` restarts it; then the caller takes the round
        from :meth:`fit_stream` (which meets a second death with the policy again)."""
        replies = []
        for w, ids, ref in calls:
            try:
                replies.append(self._get(lambda: ref))
            except _ActorDied:  # the first to fail is the one that died: every worker before it answered
                if self.policy == "fail":
                    raise ClientFailure(f"client actor {w} (clients {ids}) died during fit; "
                                        "on_client_failure=fail stops the run (retry or skip would go on)") from None
                self._drain([ref for _, _, ref in calls[len(replies) + 1:]])
                self._restart(w)
                if self.policy == "skip":
                    skipped.extend(ids)
                return None
        return replies

    def fold_abandon(self, calls: FoldCalls) -> None:
        """Wait out :meth:`fold_start`'s calls whose replies are not wanted (a round run ahead that
        the run did not take: docs/methods.md §0.1), their errors taken here; a worker that died
        meanwhile is met by the next call with the policy."""
        self._drain([ref for _, _, ref in calls])

    @staticmethod
    def _drain(refs: list) -> None:
        """Wait out the calls after a dead worker in a folded round's chain (they fail once they ask
        for its sums, or their actor died too): their errors are taken here, not reported by Ray as
        unhandled; the streamed round that follows meets any dead actor among them."""
        import ray  # lazy: keeps ray out of this module's import

        for ref in refs:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - an expected failure of an abandoned call
                pass

    def _stream(self, w: int, weights_ref, payload, round, ids: list[int]):
        batch = stream_batch(len(ids), self.state_bytes)
        return self.actors[w].fit_stream.options(num_returns="streaming").remote(weights_ref, payload, round, ids,
                                                                               batch)

    @classmethod
    def _next(cls, stream) -> FitReply:
        """The next reply of an actor's stream; a dead actor is :class:`_ActorDied`, bad input its own error."""
        return cls._get(lambda: next(stream))

    @staticmethod
    def _get(ref: Callable[[], Any]) -> Any:
        """``ray.get(ref())``: a dead actor is :class:`_ActorDied`, bad input its own error, any other
        Ray error raised as it is."""
        # lazy: keeps ray out of this module's import
        import ray
        from ray.exceptions import RayActorError, RayError

        try:
            return ray.get(ref())
        except RayError as exc:
            err = input_error_of(exc)
            if err is not None:  # bad input (an undecodable image ...): a restart would fail again
                raise err from None
            if not isinstance(exc, RayActorError):
                raise
            raise _ActorDied(exc) from None

    def probe(self, weights_ref, payload, round, client_ids) -> dict[int, dict[str, np.ndarray]]:
        """Each worker's ``probe`` of its clients among ``client_ids``; ``{client id: arrays}``
        (a skipped worker's clients are absent)."""
        wanted = set(int(c) for c in client_ids)
        args = {w: (weights_ref, payload, round, [c for c in owned if c in wanted])
                for w, owned in enumerate(self.assignment) if any(c in wanted for c in owned)}
        replies, _ = self._call_all("probe", args)
        return {cid: arrays for w in sorted(replies) for cid, arrays in replies[w]}

    def evaluate(self, weights_ref):
        return {w: (weights_ref,) for w in range(self.num_workers)}

    def collect_evaluation(self, pending) -> list[EvalReply]:
        replies, _ = self._call_all("evaluate", pending)
        return [replies[w] for w in sorted(replies)]

    def shutdown(self) -> None:
        import ray  # lazy: keeps ray out of this module's import

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass

    def handles(self) -> list:
        return list(self.actors)
