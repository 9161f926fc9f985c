"""MOON client method (Li, He, Song, *Model-Contrastive Federated Learning*, CVPR 2021, Sec. 3, Eqs. 1-3).

Each local step minimises, on a batch ``(x_i, y_i)_{i=1..B}`` (the paper's Eq. 3)::

    CE(model(x), y) + moon_mu · (1/B) Σ_i ℓ_con(x_i)

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )   (Eq. 1)

with ``sim`` the cosine similarity, ``τ = moon_temperature``, ``z`` the representation of ``x_i``
by the model being trained, ``z_glob`` by the frozen global model this client received this round
and ``z_prev`` by the frozen model this client ended its previous round with (:func:`model_contrastive_loss`).
Only ``z`` carries a gradient. As in the authors' code (github.com/QinbinLi/MOON, ``main.py``,
``train_net_fedcon``), the two frozen models run in eval mode (batch norm on its running
statistics) and ``ℓ_con`` is averaged over the batch.

The representation ``z``: the authors' network is base encoder → projection head (a 2-layer MLP,
``out_dim`` 256) → output layer, and ``z`` is the projection head's output. fedtune's models have
no projection head: ``z`` is the **encoder features**, the input of the model's classifier (the
last ``nn.Linear`` in module order: what :func:`fedtune.models.encode` returns), read with a
forward pre-hook on the classifier (:class:`FeatureTap`) so one forward pass gives both ``z`` and
the logits. This is the authors' ``--use_project_head 0`` network (``ModelFedCon_noheader``:
``z = h``), not their default ``1``; a departure (docs/methods-baselines.md §10).

The previous model is kept per client in ``ctx.state[STATE_KEY]``: a CPU copy of the trained
model's whole ``state_dict`` (parameters and buffers, as ``torch.Tensor``\\s, which the checkpoint
code saves), written at the end of every round the client trains. The frozen global and previous
models are two copies of the model made once per method instance (:meth:`MOON._frozen`) and
re-loaded each round with ``load_state_dict``, never a copy per step.

Before a client has a previous model (its first round) there is no negative. The authors' code
then has an empty model pool (``old_nets_pool`` starts empty with ``model_buffer_size = 1``, the
``load_first_net`` branch builds ``old_nets`` but never appends it), so the logits of their
cross-entropy hold the positive alone and ``ℓ_con = −log(e^s/e^s) = 0`` with zero gradient: the
first round is plain local SGD. fedtune does the same exactly by not computing the term at all,
so MOON's first round is ``sgd`` bit for bit (and ``moon_mu = 0`` is ``sgd`` bit for bit in
every round; nothing is stored then).

Departures from the authors' code (docs/methods-baselines.md §10):

* ``z`` is the encoder features, not a projection head's output (above).
* Partial participation: the authors' pool holds a copy of *every* party's network after each
  round, so a party sampled for the first time after round 1 uses its never-trained random
  initialisation as ``z_prev``; fedtune treats any client without a previous model as in its
  first round (no negative).
* ``model_buffer_size`` (more than one previous model as negatives) is not offered; the authors'
  default and every experiment of the paper use 1.

The reported training loss is the cross-entropy only (comparable across methods); ``diag.moon_con``
is the round's mean of ``ℓ_con`` over its steps (unweighted by ``moon_mu``; 0 in a client's first
round). The batch gradient given to ``ctx.record_step`` is that of the whole objective.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.fediir import classifier_layer
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import MOON_MU, MOON_TEMPERATURE


STATE_KEY = "moon.prev"
"""``ctx.state`` entry: the client's model at the end of its last round, ``{state_dict key: CPU tensor}``."""


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """MOON's ``ℓ_con`` (the paper's Eq. 1) averaged over the batch: rows of ``z`` are pulled towards
    the same rows of ``z_glob`` and pushed from those of ``z_prev`` (all ``[B, d]``; the batch's
    ``sim`` is the cosine similarity along ``d``, ``eps = 1e-8`` as ``torch.nn.CosineSimilarity``).

    >>> z = torch.tensor([[1.0, 0.0]])
    >>> round(float(model_contrastive_loss(z, z, -z, 0.5)), 6)   # -log(e^2 / (e^2 + e^-2))
    0.01815
    """
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], dim=1)
    logits = logits / float(temperature)
    return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


class FeatureTap:
    """A forward pre-hook on ``model``'s classifier (:func:`classifier_layer`) that keeps the input
    of its latest call: after ``logits = model(x)``, :meth:`take` gives the encoder features ``z``
    of that same forward pass (in the autograd graph). :meth:`remove` takes the hook off."""

    def __init__(self, model: nn.Module):
        self.seen: torch.Tensor | None = None
        self._handle = classifier_layer(model).register_forward_pre_hook(self._keep)

    def _keep(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.seen = args[0]

    def take(self) -> torch.Tensor:
        z, self.seen = self.seen, None
        if z is None:
            raise RuntimeError("MOON's feature tap saw no forward pass of the classifier")
        return z

    def remove(self) -> None:
        self._handle.remove()


def _signature(model: nn.Module) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in model.state_dict().items())


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of every ``state_dict`` entry of ``model`` (what :data:`STATE_KEY` holds)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class MOON(ClientMethod):
    name = "moon"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.mu, self.temperature = MOON_MU.of(cfg), MOON_TEMPERATURE.of(cfg)
        self._copies: dict[str, tuple[nn.Module, FeatureTap]] = {}
        self._copies_of: tuple | None = None

    def _frozen(self, model: nn.Module, role: str, state: dict[str, torch.Tensor]) -> tuple[nn.Module, FeatureTap]:
        """The reusable frozen copy ``role`` ("global" or "prev") of ``model``'s architecture, in eval
        mode without gradients, holding ``state``; made once (again only if the architecture changes)."""
        sig = _signature(model)
        if self._copies_of != sig:
            for _, tap in self._copies.values():
                tap.remove()
            self._copies, self._copies_of = {}, sig
        if role not in self._copies:
            twin = copy.deepcopy(model).eval().requires_grad_(False)
            self._copies[role] = (twin, FeatureTap(twin))
        twin, tap = self._copies[role]
        twin.load_state_dict(state)
        return twin, tap

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        if self.mu == 0.0:  # plain CE: exactly sgd, nothing kept
            return self.cross_entropy_loop(ctx, self.start_round(ctx), metrics=lambda steps: {"moon_con": 0.0})
        prev_state = ctx.state.get(STATE_KEY)
        frozen = None
        if prev_state is not None:
            frozen = (self._frozen(model, "global", model.state_dict()), self._frozen(model, "prev", prev_state))
        opt = self.start_round(ctx)
        tap = FeatureTap(model) if frozen is not None else None
        total = {"con": 0.0}

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            logits = model(x)
            ce = F.cross_entropy(logits, y)
            loss = ce
            if frozen is not None:
                z = tap.take()
                with torch.no_grad():
                    (glob, glob_tap), (prev, prev_tap) = frozen
                    glob(x)
                    prev(x)
                    z_glob, z_prev = glob_tap.take(), prev_tap.take()
                con = model_contrastive_loss(z.float(), z_glob.float(), z_prev.float(), self.temperature)
                loss = ce + self.mu * con
                total["con"] += float(con.detach())
            value = descend(opt, loss, ctx.record_step)
            return float(ce.detach()) if math.isfinite(value) else value

        try:
            out = self.local_loop(ctx, step, lambda steps: {"moon_con": total["con"] / max(steps, 1)})
        finally:
            if tap is not None:
                tap.remove()
        ctx.state[STATE_KEY] = snapshot(model)
        return out


__all__ = ["MOON", "STATE_KEY", "FeatureTap",
           "model_contrastive_loss", "snapshot"]
