"""FedADG's client (Zhang, Lei, Lu, Luo, "Federated Learning with Domain Generalization", arXiv
2111.10487; as Bai, Bagchi, Inouye's FedDG benchmark, ICLR 2024, runs it: ``src/client.py``
``FedADGClient``, ``src/models.py`` ``GeneDistrNet`` and ``Discriminator``; docs/methods.md §24).

A federated *generator* ``G`` (noise and a soft label → a feature vector; averaged by the server
like the model, :class:`fedtune.algorithms.server.fedadg.FedADGServer`) draws a reference feature
distribution; each client keeps its own *discriminator* ``D`` (the feature, or a generated one, with
its soft label → a score in (0, 1)) across rounds. A client's round:

1. ``local_steps`` plain cross-entropy steps (Bai et al.'s first ``local_epochs``);
2. ``fedadg_epochs`` passes over its data in batches, each batch (``y_s``: the one-hot label scaled
   to 0.6, ``u ~ U(0, 1)^fedadg_noise``, ``z`` the encoder features):

   a. the model: ``fedadg_alpha · CE_smooth0.2(logits, y) + (1 − fedadg_alpha) · mean((1 − D(y_s, z))²)``,
      one step of the round's optimiser;
   b. ``D``: ``−mean(D(y_s, G(u, y_s))² + (1 − D(y_s, z))²)`` with ``z`` from the model in eval mode,
      both inputs detached; SGD (``fedadg_disc_lr``, momentum 0.9, weight decay 1e-5, new each round);
   c. ``G``: ``mean((1 − D(y_s, G(u, y_s)))²)``; SGD (``fedadg_gen_lr``, same settings).

``fedadg_variant: bai`` runs Bai et al.'s code as it is: step c detaches ``G``'s output, so ``G`` never
trains, and the encoder stays in eval mode after step b for the rest of the pass (its batch-norm
layers stop updating). ``fixed`` (default) trains ``G`` and puts the model back in training mode.
The generator and the discriminator are built once from seeds of their own (the run's seed; the run's
seed and the client), so every client starts from the same ``G``. The round's loss is step 1's.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, batches, descend
from fedtune.algorithms.client.moon import FeatureTap, classifier_layer
from fedtune.algorithms.client.precision import autocast
from fedtune.algorithms.client.steps import batches_per_epoch
from fedtune.algorithms.declarations import (FEDADG_ALPHA, FEDADG_DISC_LR, FEDADG_DISC_WIDTH, FEDADG_EPOCHS,
                                             FEDADG_GEN_LR, FEDADG_LATENT, FEDADG_NOISE, FEDADG_VARIANT)
from fedtune.algorithms.server.fedadg import GENERATOR_KEY

DISCRIMINATOR_KEY = "fedadg.discriminator"
"""``ctx.state`` entry: the client's discriminator (its ``state_dict``, CPU tensors)."""
SOFT_LABEL = 0.6  # Bai et al.'s one-hot scale (y_onehot.scatter_(1, y, 0.6))
LABEL_SMOOTHING = 0.2  # their second-phase criterion's


class FeatureGenerator(nn.Module):
    """Bai et al.'s ``GeneDistrNet``: ``[u, y_s] → Linear(latent) → LeakyReLU → Linear(features) → ReLU``,
    linear weights Xavier-uniform with gain 0.5."""

    def __init__(self, num_classes: int, noise: int, features: int, latent: int = 4096):
        super().__init__()
        self.noise = int(noise)
        self.net = nn.Sequential(nn.Linear(self.noise + num_classes, latent), nn.LeakyReLU(),
                                 nn.Linear(latent, features), nn.ReLU())
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight, 0.5)

    def forward(self, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([u, y], dim=1))


class Discriminator(nn.Module):
    """Bai et al.'s ``Discriminator`` (``width`` 1024): a bias-free projection of ``[z, y_s]`` to
    ``width`` (its weight divided by its Frobenius norm at construction), ``Linear(width) → LeakyReLU →
    Linear(1) → Sigmoid``."""

    def __init__(self, features: int, num_classes: int, width: int = 1024):
        super().__init__()
        self.projection = nn.Linear(features + num_classes, width, bias=False)
        with torch.no_grad():
            self.projection.weight.div_(torch.norm(self.projection.weight))
        self.score = nn.Sequential(nn.Linear(width, width), nn.LeakyReLU(), nn.Linear(width, 1), nn.Sigmoid())

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.score(self.projection(torch.cat([z.reshape(z.shape[0], -1), y], dim=1)))


def _seeded(seed: int, build):
    """``build()`` with torch's CPU generator at ``seed``, the global state put back afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def flat_parameters(module: nn.Module) -> np.ndarray:
    """The module's parameters in order, one float32 vector."""
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in module.parameters()]).numpy()


def load_flat_parameters(module: nn.Module, flat: np.ndarray) -> None:
    """The inverse of :func:`flat_parameters` (a size mismatch is a ValueError)."""
    flat = torch.as_tensor(np.asarray(flat, np.float32))
    total = sum(p.numel() for p in module.parameters())
    if flat.numel() != total:
        raise ValueError(f"FedADG: the broadcast generator holds {flat.numel()} parameters, this model's has {total}")
    with torch.no_grad():
        start = 0
        for p in module.parameters():
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()


class FedADG(ClientMethod):
    """ERM steps, then the adversarial alignment of the encoder features to the generator's (module docstring)."""

    name = "fedadg"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.alpha, self.epochs = float(FEDADG_ALPHA.of(cfg)), int(FEDADG_EPOCHS.of(cfg))
        self.gen_lr, self.disc_lr = float(FEDADG_GEN_LR.of(cfg)), float(FEDADG_DISC_LR.of(cfg))
        self.noise, self.latent = int(FEDADG_NOISE.of(cfg)), int(FEDADG_LATENT.of(cfg))
        self.width = int(FEDADG_DISC_WIDTH.of(cfg))
        self.bai = FEDADG_VARIANT.of(cfg) == "bai"

    def nets(self, ctx: ClientContext) -> tuple[FeatureGenerator, Discriminator]:
        """The round's generator (the broadcast one, or the run's initial one) and the client's discriminator."""
        layer = classifier_layer(ctx.model)
        features, classes = layer.in_features, layer.out_features
        seed = int(self.cfg.seed)
        gen = _seeded(seed * 7919 + 17, lambda: FeatureGenerator(classes, self.noise, features, self.latent))
        if GENERATOR_KEY in ctx.payload:
            load_flat_parameters(gen, ctx.payload[GENERATOR_KEY])
        disc = _seeded(seed * 7919 + 1009 * (ctx.client_id + 1), lambda: Discriminator(features, classes, self.width))
        if DISCRIMINATOR_KEY in ctx.state:
            disc.load_state_dict(ctx.state[DISCRIMINATOR_KEY])
        return gen.to(ctx.device), disc.to(ctx.device)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        gen, disc = self.nets(ctx)
        opt = self.start_round(ctx)
        out = self.local_loop(ctx, lambda x, y: descend(opt, F.cross_entropy(model(x), y), ctx.record_step))
        if not math.isfinite(out.loss):
            return out
        gen_opt = torch.optim.SGD(gen.parameters(), lr=self.gen_lr, momentum=0.9, weight_decay=1e-5)
        disc_opt = torch.optim.SGD(disc.parameters(), lr=self.disc_lr, momentum=0.9, weight_decay=1e-5)
        gen.eval()
        disc.eval()
        sums = {"fedadg_align_loss": 0.0, "fedadg_disc_loss": 0.0, "fedadg_gen_loss": 0.0}
        n, steps = ctx.num_examples, 0
        tap = FeatureTap(model)
        try:
            for idx in batches(n, self.cfg.batch_size, self.epochs * batches_per_epoch(n, self.cfg.batch_size),
                               ctx.generator):
                ctx.rows = idx
                x, y = ctx.batch(idx)
                y_s = torch.zeros(len(y), gen.net[0].in_features - gen.noise, device=y.device)
                y_s.scatter_(1, y.view(-1, 1), SOFT_LABEL)
                u = torch.rand(len(y), gen.noise, generator=ctx.generator).to(y.device)
                with autocast(ctx.device, ctx.precision):  # a: the model towards D's "generated" side
                    logits = model(x)
                    align = torch.mean((1 - disc(y_s, tap.take().float())) ** 2)
                    loss = (self.alpha * F.cross_entropy(logits.float(), y, label_smoothing=LABEL_SMOOTHING)
                            + (1 - self.alpha) * align)
                value = descend(opt, loss, ctx.record_step)
                if not math.isfinite(value):
                    return ClientOutcome(loss=value, steps=out.steps + steps + 1)
                model.eval()  # b: the discriminator, on the encoder's eval-mode features
                with torch.no_grad(), autocast(ctx.device, ctx.precision):
                    model(x)
                    real = tap.take().float()
                    fake = gen(u, y_s).float()
                disc.train()
                disc_opt.zero_grad()
                disc_loss = -torch.mean(disc(y_s, fake) ** 2 + (1 - disc(y_s, real)) ** 2)
                disc_loss.backward()
                disc_opt.step()
                disc.eval()
                if not self.bai:
                    model.train()  # Bai et al.'s encoder stays in eval mode from here on
                gen.train()  # c: the generator
                gen_opt.zero_grad()
                fake = gen(u, y_s)
                gen_loss = torch.mean((1 - disc(y_s, fake.detach() if self.bai else fake)) ** 2)
                if not self.bai:  # Bai et al.'s .detach(): no gradient reaches G, it never moves
                    gen_loss.backward()
                    gen_opt.step()
                gen.eval()
                steps += 1
                for key, v in (("fedadg_align_loss", align), ("fedadg_disc_loss", disc_loss), ("fedadg_gen_loss", gen_loss)):
                    sums[key] += float(v.detach())
        finally:
            tap.remove()
        model.train()
        ctx.state[DISCRIMINATOR_KEY] = {k: v.detach().to("cpu", copy=True) for k, v in disc.state_dict().items()}
        out.extras[GENERATOR_KEY] = flat_parameters(gen)
        out.metrics = {**out.metrics, **{k: v / max(steps, 1) for k, v in sums.items()}}
        return out


__all__ = ["DISCRIMINATOR_KEY", "Discriminator", "FeatureGenerator", "FedADG", "flat_parameters",
           "load_flat_parameters"]
