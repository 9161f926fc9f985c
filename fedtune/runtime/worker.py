"""The client side of the runtime: a worker owns a fixed set of logical clients and their data.

:class:`ClientWorker` is a plain class. The Ray backend runs it as an actor
(:func:`client_actor_class`), the local backend calls it in-process; both execute the same code, so a
seed gives the same numbers on either. Data never leaves the worker and never sits whole on its
device: each split is an :class:`~fedtune.runtime.examples.Examples` (indices into the node's
decoded-image cache for image-folder datasets) fetched batch by batch. Weights arrive as a
(zero-copy, read-only) float32 vector and leave as one contiguous float32 array ``[k, M]``
holding the k trained clients' flat states.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import numpy as np

from fedtune.algorithms.client.steps import effective_batch_size
from fedtune.data.base import ClientSpec
from fedtune.data.registry import get_dataset
from fedtune.layout import FlatLayout
from fedtune.runtime.common import (assigned_gpu_ids, derive_seed, evaluate, pick_device, set_torch_threads,
                                    torch_threads)
from fedtune.runtime.fit_round import FitRound
from fedtune.runtime.messages import EvalReply, FeatureSet, FitReply, FoldReply, TargetShard


def seed_torch(seed: int, device: Any) -> None:
    """``torch.manual_seed(seed)`` for what ``device`` draws from. On a CPU worker only the CPU
    generator: the same stream, without ``torch.manual_seed``'s pass through every accelerator's
    seeding (on a CUDA-less build it formats a stack trace: ~200 µs a call against ~1.5 µs, once
    per client per round). Any other device seeds everything, as ``torch.manual_seed`` does."""
    import torch  # lazy: keeps torch out of this module's import

    if torch.device(device).type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def encode_split(model: Any, examples: Any, batch_size: int, precision: str = "fp32",
                 max_mib: float | None = None) -> FeatureSet:
    """Encoder features (:func:`fedtune.models.encode`, eval mode, no grad, un-augmented) of
    ``examples`` in batches of ``batch_size``, as float32 NumPy, with their labels as int64 NumPy."""
    # lazy: keeps torch out of this module's import
    import torch

    from fedtune.algorithms.client.precision import autocast
    from fedtune.models import encode

    model.eval()
    parts = []
    with torch.no_grad():
        for xb, _ in examples.batches(batch_size, max_mib):
            with autocast(xb.device, precision):
                parts.append(encode(model, xb).float().cpu().numpy())
            del xb
    feats = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    return FeatureSet(np.ascontiguousarray(feats, dtype=np.float32), examples.labels.numpy().astype(np.int64))


class ClientWorker:
    """Holds logical clients ``specs``; trains and evaluates them on request."""

    def __init__(self, cfg_dict: dict[str, Any], specs: list[ClientSpec], worker_index: int = 0,
                 shards: list[TargetShard] | None = None, manage_threads: bool = True,
                 source_bank: dict[str, np.ndarray] | None = None, owned: list[int] | None = None):
        # lazy: keeps torch out of this module's import
        from fedtune.algorithms.client.precision import check_device
        from fedtune.config import FederatedRunConfig
        from fedtune.models import build_model, check_model_size, freeze_batchnorm, prepare_for_device
        from fedtune.flat_weights import bind_flat
        from fedtune.runtime.augment import make_augment
        from fedtune.runtime.examples import client_examples

        t_init = time.time()
        self.cfg = FederatedRunConfig.from_validated(cfg_dict)
        self.worker_index = worker_index
        self.threads = torch_threads(self.cfg.client_cpus)
        if manage_threads:
            set_torch_threads(self.threads)
        import torch  # lazy: keeps torch out of this module's import

        t_torch = time.time()
        self.gpu_ids = assigned_gpu_ids()
        self.device = pick_device(bool(self.gpu_ids) or (self.cfg.backend == "local" and self.cfg.client_gpus > 0))
        self.precision = self.cfg.precision
        check_device(self.precision, self.device)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = bool(self.cfg.cudnn_benchmark)
        dataset = get_dataset(self.cfg.dataset, root=self.cfg.data_root, image_size=self.cfg.image_size,
                              data_seed=self.cfg.data_seed, cache_dir=self.cfg.cache_dir,
                              cache_key=self.cfg.cache_key, cache_wait_s=self.cfg.cache_wait_s)
        info = dataset.info
        resolved = self.cfg.resolved
        model_name = self.cfg.model or info.default_model
        self.method_spec = resolved.client_spec
        head = self.method_spec.head(self.cfg)
        # A model too large to build is refused before the data is decoded into the image cache.
        check_model_size(model_name, info.input_shape, info.num_classes, self.cfg.mlp_hidden, head)
        # channels_last only on CUDA clients (CPU clients keep today's layout and numbers)
        self.channels_last = bool(self.cfg.channels_last) and self.device.type == "cuda" and len(info.input_shape) == 3
        self.augment = make_augment(self.cfg.effective_augment, info.input_shape[-1] if info.is_image else None)
        self.specs = {s.client_id: s for s in specs}
        self.owned, self.roams = _owned_clients(self.specs, owned, worker_index)
        self.data: dict[int, dict[str, Any]] = {}  # client id -> split -> Examples
        for s in specs:
            self.data[s.client_id] = {split: client_examples(dataset, getattr(s, split), self.device, self.channels_last)
                                      for split in ("train", "val", "test")}
        # a method that samples from every source client's data (FedDG's amplitude bank): its examples
        # (the plan's FederatedPlan.source_train_pieces, which the pools pass to every worker)
        self.source_bank = None
        if self.method_spec.needs_source_bank:
            if source_bank is None:
                raise ValueError(f"client method {self.method_spec.name} samples the source bank: pass "
                                 "source_bank=plan.source_train_pieces() to its ClientWorker")
            self.source_bank = client_examples(dataset, source_bank, self.device, self.channels_last)
        self.shards: dict[int, tuple[str, Any]] = {}  # shard id -> (domain, Examples)
        self.shard_split = {sh.shard_id: sh.split for sh in shards or []}  # "test" | "probe" (ufdg)
        for sh in shards or []:
            self.shards[sh.shard_id] = (sh.domain, client_examples(dataset, {sh.domain: sh.indices}, self.device,
                                                                   self.channels_last))
        # Every worker builds the same initial model from the run's seed; the coordinator takes
        # its weights from worker 0 (so the coordinator process never needs torch).
        seed_torch(self.cfg.seed, self.device)
        # An unsupervised method's head (a projector) replaces the classifier (its declaration's head).
        self.model = build_model(model_name, input_shape=info.input_shape,
                                 num_classes=info.num_classes, mlp_hidden=self.cfg.mlp_hidden,
                                 pretrained_path=self.cfg.pretrained_path, weights=self.cfg.weights, **head)
        self.model = prepare_for_device(self.model, self.device, channels_last=self.channels_last)
        if self.cfg.freeze_batchnorm:
            freeze_batchnorm(self.model)
        self.layout = FlatLayout.of(self.model)
        # the state in one buffer: loading the weights and copying a trained state out are one copy each
        bind_flat(self.model, self.layout)
        self.method = resolved.client_method(self.cfg)
        # client method built for a round's overridden fields (in-run tuning's configurations), by override
        self._configured: dict[tuple[tuple[str, Any], ...], tuple[Any, Any]] = {}
        # What the server rule (and in-run tuning) asks of every participant around its training.
        self.hooks = self._hooks(resolved.client_hooks(self.cfg))
        self.client_state: dict[int, dict[str, Any]] = {s.client_id: {} for s in specs}
        self._held: dict[str, np.ndarray] = {}  # a folded round's float64 terms, kept across rounds (fit_fold)
        # Wall-clock stamps (time.time()) of this worker's start-up, for start-up diagnostics.
        self.startup = {"init_start": t_init, "torch_ready": t_torch, "ready": time.time()}

    def _hooks(self, places: tuple[str, ...]) -> list[Any]:
        """The server rule's client hooks (:mod:`fedtune.algorithms.client.hooks`), built for this
        worker's clients; none (nothing imported) for a rule that declares none."""
        if not places:
            return []
        # lazy: keeps torch out of this module's import
        from fedtune.algorithms.client.hooks import ClientRecord, WorkerView, load_hooks

        def evaluate_split(cid: int, split: str) -> tuple[float, float]:
            result = evaluate(self.model, self.data[cid][split], self.cfg.eval_batch_size, self.precision,
                              self.cfg.eval_batch_mib)
            return result.loss, result.acc

        clients = tuple(ClientRecord(cid, spec.role, len(self.data[cid]["train"]), len(self.data[cid]["val"]))
                        for cid, spec in self.specs.items())
        return load_hooks(places, WorkerView(self.cfg, self.model, self.layout, clients, evaluate_split))

    # ------------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        import torch  # lazy: keeps torch out of this module's import

        return {"pid": os.getpid(), "worker_index": self.worker_index, "device": str(self.device),
                "gpu_ids": [str(g) for g in self.gpu_ids], "torch_threads": torch.get_num_threads(),
                "clients": list(self.owned), "held": sorted(self.specs), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "placement_group_id": _placement_group_id(), "startup": self.startup}

    def initial_state(self) -> tuple[np.ndarray, Any, int]:
        """(initial flat weights, FlatLayout, number of model parameters)."""
        # lazy: keeps torch out of this module's import
        from fedtune.models import count_parameters
        from fedtune.flat_weights import get_flat

        return get_flat(self.model, self.layout), self.layout, count_parameters(self.model)

    def _load(self, weights: np.ndarray) -> None:
        from fedtune.flat_weights import set_flat  # lazy: keeps torch out of this module's import

        set_flat(self.model, self.layout, weights)

    def fit(self, weights: np.ndarray, payload: dict[str, np.ndarray], round: int, client_ids: list[int]) -> FitReply:
        """Train each of ``client_ids`` (ascending) from ``weights`` for one round; one reply with
        every trained state (:meth:`fit_stream` sends them one client at a time). Each client's
        metrics carry ``batch_size_effective`` (:func:`~fedtune.algorithms.client.steps.effective_batch_size`):
        ``batch_size``, or the client's whole training set when that is smaller."""
        client_ids = sorted(client_ids)
        states = np.empty((len(client_ids), self.layout.size), dtype=np.float32)
        reply = FitReply(client_ids, states, [], [], [], [], worker=self.worker_index)
        for row, cid in enumerate(client_ids):
            self._fit_client(weights, payload, round, cid, states[row], reply)
        return reply

    def fit_stream(self, weights: np.ndarray, payload: dict[str, np.ndarray], round: int,
                   client_ids: list[int], batch: int = 1) -> Iterator[FitReply]:
        """:meth:`fit` in replies of ``batch`` clients (ascending; :func:`stream_batch`), each sent
        as soon as its clients are trained: the coordinator adds them to the round's sums while the
        next ones train, and no worker holds more than one batch of states (a Ray streaming
        generator: ``num_returns="streaming"``). What the clients compute does not depend on
        ``batch``; it sets how many objects cross Ray a round."""
        ids = sorted(client_ids)
        for start in range(0, len(ids), max(1, int(batch))):
            group = ids[start:start + max(1, int(batch))]
            reply = FitReply(group, np.empty((len(group), self.layout.size), dtype=np.float32), [], [], [], [],
                             worker=self.worker_index)
            for row, cid in enumerate(group):
                self._fit_client(weights, payload, round, cid, reply.states[row], reply)
            yield reply

    def fit_fold(self, weights: np.ndarray, payload: dict[str, np.ndarray], round: int, client_ids: list[int],
                 feeds: dict[str, tuple[str, dict[int, float], bool]], before: list | None = None) -> FoldReply:
        """A *folded* fit round (docs/methods.md §0.1, :meth:`RayPool.fold_start
        <fedtune.runtime.pools.RayPool.fold_start>`): train ``client_ids`` (ascending, the next
        contiguous run of the round's participants) and carry the round's float64 sums (``feeds``,
        as the coordinator's :class:`~fedtune.runtime.fit_round.FitRound`) on through them, from
        the totals of the worker before this one (``before``: ``[its reply's ObjectRef]``, taken
        once this worker's clients are trained; None: the first, which starts from zero and adds
        each client as it is trained). The same additions in the same order as the coordinator's
        streamed sums, so the same bits; what leaves is one reply of sums instead of a state per
        client."""
        ids = sorted(client_ids)
        P = self.layout.num_params
        fit = FitRound(np.asarray(weights[:P]), self.layout.size, ids, None, feeds)
        held = None if before is None else self._held_scratch(fit.held_shapes())
        row = np.empty((1, self.layout.size), dtype=np.float32)
        for cid in ids:
            one = FitReply([cid], row, [], [], [], [], worker=self.worker_index)
            self._fit_client(weights, payload, round, cid, row[0], one)
            if held is None:
                fit.add(one)  # the first worker: into the sums at once
            else:
                fit.hold(one, held)  # the terms now, while the state is in cache; added once the sums before arrive
        if held is not None:
            import ray  # lazy: keeps ray out of this module's import

            fit.continue_from(ray.get(before[0]))
            fit.add_held(held)
        return fit.fold_reply(self.worker_index)

    def _held_scratch(self, shapes: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
        """Float64 ``[clients, size]`` scratch per sum for :meth:`FitRound.hold
        <fedtune.runtime.fit_round.FitRound.hold>`, kept across rounds (a fresh 100-MB array each
        round costs its page faults again)."""
        kept, out = self._held, {}
        for name, (rows, size) in shapes.items():
            buf = kept.get(name)
            if buf is None or buf.shape[1] != size or buf.shape[0] < rows:
                buf = np.empty((rows, size), dtype=np.float64)
            out[name] = buf
        self._held = out
        return out

    def _fit_client(self, weights: np.ndarray, payload: dict[str, np.ndarray], round: int, cid: int,
                    out: np.ndarray, reply: FitReply) -> None:
        """Client ``cid``'s local round from ``weights``: its trained state into ``out``, its
        numbers appended to ``reply``."""
        # lazy: keeps torch out of this module's import
        import torch

        from fedtune.algorithms.client.method import ClientContext
        # lazy: keeps torch out of this module's import
        from fedtune.algorithms.client.precision import grad_scaler
        from fedtune.flat_weights import get_flat

        t0 = time.perf_counter()
        spec = self.specs[cid]
        self._load(weights)
        reply.io_s += time.perf_counter() - t0
        overrides: dict[str, Any] = {}
        for hook in self.hooks:
            overrides.update(hook.round_overrides(cid, round, payload))
        cfg, method = self._configured_method(overrides)
        for hook in self.hooks:
            hook.before_seed(cid)
        seed = derive_seed(self.cfg.seed, cid, round)
        seed_torch(seed, self.device)
        gen = torch.Generator().manual_seed(seed)
        train = self.data[cid]["train"]
        ctx = ClientContext(model=self.model, data=train, cfg=cfg, round=round, client_id=cid,
                            role=spec.role, generator=gen, device=self.device, payload=payload,
                            state=self.client_state[cid], augment=self.augment, precision=self.precision,
                            scaler=grad_scaler(self.device, self.precision), source_bank=self.source_bank)
        for hook in self.hooks:
            hook.before_train(ctx)
        result = method.train(ctx)
        for hook in self.hooks:
            result.extras = {**result.extras, **hook.after_train(ctx, result)}
        if self.roams and self.client_state[cid]:
            raise RuntimeError(f"client method {self.method_spec.name} kept per-client state "
                               f"({sorted(self.client_state[cid])}) for client {cid} on a worker it roams to; a "
                               "method that keeps client state must declare keeps_client_state "
                               "(fedtune.algorithms.base.ClientMethodSpec), or set client_placement: fixed")
        t_out = time.perf_counter()
        get_flat(self.model, self.layout, out=out)
        reply.io_s += time.perf_counter() - t_out
        reply.num_examples.append(len(train))
        reply.losses.append(float(result.loss))
        reply.steps.append(result.steps)
        reply.extras.append(result.extras)
        # what ran, beside the configured hp.batch_size: the round's diag.batch_size_effective
        reply.metrics.append({**result.metrics, "batch_size_effective": float(
            effective_batch_size(len(train), cfg.batch_size))})
        reply.compute_s.append(time.perf_counter() - t0)

    def _configured_method(self, overrides: dict[str, Any]) -> tuple[Any, Any]:
        """The config and client method a round with ``overrides`` (a hook's
        :meth:`~fedtune.algorithms.client.hooks.ClientHook.round_overrides`) trains with: the run's
        own without any, else a validated copy of the config and the method built for it, kept for
        the next round that draws the same values."""
        if not overrides:
            return self.cfg, self.method
        key = tuple(sorted(overrides.items()))
        if key not in self._configured:
            cfg = self.cfg.replace(**overrides)
            self._configured[key] = (cfg, self.cfg.resolved.client_method(cfg))
        return self._configured[key]

    def probe(self, weights: np.ndarray, payload: dict[str, np.ndarray], round: int,
              client_ids: list[int]) -> list[tuple[int, dict[str, np.ndarray]]]:
        """Each of ``client_ids`` (ascending) runs its client method's ``probe`` at ``weights``, the
        round's new global model (:meth:`fedtune.algorithms.server.side.ServerSide.wants_probe`):
        ``[(client id, arrays)]``. Its generator is seeded from (seed, client, round) like the round's
        training; a probe changes neither the weights the next round loads nor the client's training."""
        # lazy: keeps torch out of this module's import
        import torch

        from fedtune.algorithms.client.method import ClientContext

        self._load(weights)
        out = []
        for cid in sorted(client_ids):
            ctx = ClientContext(model=self.model, data=self.data[cid]["train"], cfg=self.cfg, round=round,
                                client_id=cid, role=self.specs[cid].role,
                                generator=torch.Generator().manual_seed(derive_seed(self.cfg.seed, cid, round)),
                                device=self.device, payload=payload, state=self.client_state[cid],
                                precision=self.precision)
            out.append((cid, self.method.probe(ctx)))
        return out

    def evaluate(self, weights: np.ndarray, client_ids: list[int] | None = None) -> EvalReply:
        """Accuracy of ``weights`` on each client's validation (and fl test) split and on this
        worker's target-test and oracle shards (``shard_ids`` lists both; the coordinator tells
        them apart by the shard's ``split``).

        Unsupervised methods (no class logits, setting ufdg) get encoder features instead
        (:func:`encode_split`): each client's validation split (``val_features``) and each of
        this worker's shards, target-test and target-probe alike (``shard_features``); the
        coordinator fits the linear probes on them."""
        self._load(weights)
        ids = sorted(self.owned if client_ids is None else client_ids)
        bs = self.cfg.eval_batch_size
        mib = self.cfg.eval_batch_mib
        reply = EvalReply(ids, [], [])
        prec = self.precision
        if not self.method_spec.supervised:
            for cid in ids:
                reply.val_features.append(encode_split(self.model, self.data[cid]["val"], bs, prec, mib))
            for sid in sorted(self.shards):
                reply.shard_ids.append(sid)
                reply.shard_features.append(encode_split(self.model, self.shards[sid][1], bs, prec, mib))
            return reply
        for cid in ids:
            reply.val.append(evaluate(self.model, self.data[cid]["val"], bs, prec, mib))
            reply.test.append(evaluate(self.model, self.data[cid]["test"], bs, prec, mib))
        for sid in sorted(self.shards):
            if self.shard_split.get(sid, "test") == "probe":
                continue  # probe shards only matter to unsupervised (linear-probe) evaluation
            reply.shard_ids.append(sid)
            reply.shards.append(evaluate(self.model, self.shards[sid][1], bs, prec, mib))
        return reply

    def ping(self) -> int:
        return os.getpid()

    # --- Tune support: actor reuse and checkpoints (fedtune.tune.trial.trainable) ---------------------
    def reconfigure(self, cfg_dict: dict[str, Any], specs: list[ClientSpec], worker_index: int = 0,
                    shards: list[TargetShard] | None = None,
                    source_bank: dict[str, np.ndarray] | None = None,
                    owned: list[int] | None = None) -> dict[str, float]:
        """Become the worker of another run in this same process (Tune ``reuse_actors``).

        Runs the constructor again: the new config, clients, data, shards and model (built from the
        new seed), fresh per-client state. Only the process, its imports (torch) and its resources
        are kept, so the new run computes exactly what a freshly started worker would. Returns the
        new start-up stamps."""
        self.__init__(cfg_dict, specs, worker_index, shards, source_bank=source_bank, owned=owned)
        return dict(self.startup)

    def get_client_state(self) -> dict[int, dict[str, Any]]:
        """Every client's persistent ``ctx.state`` (checkpoints), tensors as NumPy arrays wrapped
        in ``{"__tensor__": array}`` so :meth:`set_client_state` can turn them back."""
        import torch  # lazy: keeps torch out of this module's import

        def export(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return {"__tensor__": v.detach().cpu().numpy().copy()}
            if isinstance(v, dict):
                return {k: export(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return type(v)(export(x) for x in v)
            return v

        return {cid: export(self.client_state[cid]) for cid in self.owned}

    def set_client_state(self, states: dict[int, dict[str, Any]]) -> None:
        """Restore :meth:`get_client_state`'s output (for the clients this worker owns; tensors go
        to this worker's device)."""
        import torch  # lazy: keeps torch out of this module's import

        def restore(v: Any) -> Any:
            if isinstance(v, dict):
                if set(v) == {"__tensor__"}:
                    return torch.from_numpy(np.array(v["__tensor__"])).to(self.device)
                return {k: restore(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return type(v)(restore(x) for x in v)
            return v

        for cid in self.owned:
            self.client_state[cid] = restore(states.get(cid, {}))


def _owned_clients(specs: dict[int, ClientSpec], owned: list[int] | None, worker_index: int) -> tuple[list[int], bool]:
    """The clients a worker owns (evaluates, and keeps the state of: ``owned``, default all it
    holds) and whether others roam to it to be trained (:mod:`fedtune.runtime.placement`; they must
    keep no state between rounds)."""
    mine = sorted(specs if owned is None else (int(c) for c in owned))
    if not set(mine) <= set(specs):
        raise ValueError(f"worker {worker_index} owns clients {sorted(set(mine) - set(specs))} whose data it does not hold")
    return mine, len(mine) < len(specs)


def _placement_group_id() -> str | None:
    try:
        import ray  # lazy: keeps ray out of this module's import

        if ray.is_initialized():
            pg = ray.get_runtime_context().get_placement_group_id()
            return str(pg) if pg else None
    except Exception:  # pragma: no cover
        pass
    return None


_actor_cls = None


def client_actor_class():
    """``ray.remote(ClientWorker)``, created on first use (importing this module needs no Ray)."""
    global _actor_cls
    if _actor_cls is None:
        import ray  # lazy: keeps ray out of this module's import

        _actor_cls = ray.remote(max_restarts=0, max_task_retries=0)(ClientWorker)
    return _actor_cls
