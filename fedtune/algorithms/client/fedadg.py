"""FedADG's client (Zhang, Lei, Shi, Huang, Chen, "Federated Learning with Domain Generalization",
arXiv 2111.10487; the authors' code ``github:wzml/FedADG``: ``pacs-ours/localTrain.py`` and
``pacs-ours/Nets.py`` (PACS), ``src/localTrain.py`` and ``models/Nets.py`` (VLCS); Bai, Bagchi,
Inouye's FedDG benchmark, ICLR 2024: ``src/client.py`` ``FedADGClient``, ``src/models.py``;
docs/methods-benchmark.md §24).

A federated *generator* ``G`` (noise and a soft label → a feature vector; averaged by the server
like the model, :class:`fedtune.algorithms.server.fedadg.FedADGServer`) draws a reference feature
distribution; each client keeps its own *discriminator* ``D`` (the feature, or a generated one, with
its soft label → a score in (0, 1)) across rounds. A client's round, at the defaults (the authors'
PACS code):

1. ``local_steps`` steps of the label-smoothed cross-entropy ``CE_s`` (their ``before_train``:
   ``LabelSmoothingLoss``, 1 − s at the class and s/(K − 1) elsewhere, s = ``fedadg_label_smoothing``);
2. ``fedadg_epochs`` passes over its data in batches, each batch (``y_s``: the one-hot label scaled
   to ``fedadg_soft_label``, ``u ~ U(0, 1)^fedadg_noise``, ``z`` the encoder features, the
   classifier's input):

   a. ``D``: ``mean((1 − D(y_s, G(u, y_s)))² + D(y_s, z)²)``, ``z`` from the model in eval mode, both
      inputs detached; SGD (``fedadg_disc_lr``, momentum 0.9, weight decay 1e-5, new each round);
   b. the model, in training mode again: ``α · CE_s(logits, y) + (1 − α) · mean((1 − D(y_s, z))²)``,
      α = ``fedadg_alpha``, one step of the round's optimiser;
   c. ``G``: ``mean(D(y_s, G(u, y_s))²)``; SGD (``fedadg_gen_lr``, the same settings).

Each difference from their VLCS code and from Bai et al.'s is one hyperparameter
(``fedadg_order``, ``fedadg_disc_loss``, ``fedadg_gen_loss``, ``fedadg_disc_arch``,
``fedadg_model_mode``, ``fedadg_pretrain_loss``, ``fedadg_smoothing_form``, the numbers), and
``fedadg_variant`` (``authors`` | ``authors_vlcs`` | ``bai``) sets those a whole reading differs on.
The generator and the discriminator are built once from seeds of their own (the run's seed; the
run's seed and the client), so every client starts from the same ``G``; they compute in the
model's parameter dtype. The round's loss is step 1's.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, batches, descend
from fedtune.algorithms.client.fediir import classifier_layer
from fedtune.algorithms.client.moon import FeatureTap
from fedtune.algorithms.client.precision import autocast
from fedtune.algorithms.client.steps import batches_per_epoch
from fedtune.algorithms.fedadg_declarations import (FEDADG_ALPHA, FEDADG_DISC_ARCH, FEDADG_DISC_LOSS,
                                                    FEDADG_DISC_LR, FEDADG_DISC_WIDTH, FEDADG_EPOCHS, FEDADG_GEN_LOSS,
                                                    FEDADG_GEN_LR, FEDADG_LABEL_SMOOTHING, FEDADG_LATENT,
                                                    FEDADG_MODEL_MODE, FEDADG_NOISE, FEDADG_ORDER,
                                                    FEDADG_PRETRAIN_LOSS, FEDADG_SMOOTHING_FORM, FEDADG_SOFT_LABEL)
from fedtune.algorithms.server.fedadg import GENERATOR_KEY

DISCRIMINATOR_KEY = "fedadg.discriminator"
"""``ctx.state`` entry: the client's discriminator (its ``state_dict``, CPU tensors)."""


class FeatureGenerator(nn.Module):
    """The authors' (and Bai et al.'s) ``GeneDistrNet``: ``[u, y_s] → Linear(latent) → LeakyReLU →
    Linear(features) → ReLU``, linear weights Xavier-uniform with gain 0.5."""

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
    """``arch="pacs"`` (the authors' PACS ``Discriminator``): a bias-free projection ``P z`` to
    ``width``, then ``[P z, y_s] → Linear(width) → LeakyReLU → Linear(1) → Sigmoid``, every linear
    weight Kaiming-uniform (their ``initialize_params`` runs after the projection's division by its
    norm, which it undoes). ``arch="vlcs"`` (their VLCS one, Bai et al.'s): a bias-free projection of
    ``[z, y_s]`` to ``width``, its weight divided by its Frobenius norm, then ``Linear(width) →
    LeakyReLU → Linear(1) → Sigmoid``, PyTorch's initialisation. Width 1024 in all three codes."""

    def __init__(self, features: int, num_classes: int, width: int = 1024, arch: str = "pacs"):
        super().__init__()
        self.pacs = arch == "pacs"
        self.projection = nn.Linear(features + (0 if self.pacs else num_classes), width, bias=False)
        with torch.no_grad():
            self.projection.weight.div_(torch.norm(self.projection.weight))
        self.score = nn.Sequential(nn.Linear(width + (num_classes if self.pacs else 0), width), nn.LeakyReLU(),
                                   nn.Linear(width, 1), nn.Sigmoid())
        if self.pacs:
            for layer in (self.score[0], self.score[2], self.projection):
                nn.init.kaiming_uniform_(layer.weight)

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        z = z.reshape(z.shape[0], -1)
        if self.pacs:
            return self.score(torch.cat([self.projection(z), y], dim=1))
        return self.score(self.projection(torch.cat([z, y], dim=1)))


def smoothed_cross_entropy(logits: torch.Tensor, y: torch.Tensor, s: float, form: str) -> torch.Tensor:
    """The mean cross-entropy against smoothed labels: ``form="authors"`` their ``LabelSmoothingLoss``
    (``1 − s`` at the class, ``s/(K − 1)`` at each other), ``"torch"`` PyTorch's ``label_smoothing``
    (``1 − s + s/K`` and ``s/K``)."""
    if form == "torch":
        return F.cross_entropy(logits, y, label_smoothing=s)
    k = logits.shape[1]
    target = torch.full_like(logits, s / max(k - 1, 1)).scatter_(1, y.view(-1, 1), 1.0 - s)
    return torch.mean(torch.sum(-target * F.log_softmax(logits, dim=1), dim=1))


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
    """Label-smoothed local steps, then the adversarial alignment of the encoder features to the
    generator's (module docstring)."""

    name = "fedadg"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.alpha, self.epochs = float(FEDADG_ALPHA.of(cfg)), int(FEDADG_EPOCHS.of(cfg))
        self.gen_lr, self.disc_lr = float(FEDADG_GEN_LR.of(cfg)), float(FEDADG_DISC_LR.of(cfg))
        self.noise, self.latent = int(FEDADG_NOISE.of(cfg)), int(FEDADG_LATENT.of(cfg))
        self.width, self.arch = int(FEDADG_DISC_WIDTH.of(cfg)), FEDADG_DISC_ARCH.of(cfg)
        self.soft, self.smoothing = float(FEDADG_SOFT_LABEL.of(cfg)), float(FEDADG_LABEL_SMOOTHING.of(cfg))
        self.form, self.pretrain = FEDADG_SMOOTHING_FORM.of(cfg), FEDADG_PRETRAIN_LOSS.of(cfg)
        self.disc_first = FEDADG_ORDER.of(cfg) == "disc_first"
        self.least_squares = FEDADG_DISC_LOSS.of(cfg) == "least_squares"
        self.train_gen = FEDADG_GEN_LOSS.of(cfg) == "squared"
        self.back_to_train = FEDADG_MODEL_MODE.of(cfg) == "train"

    def nets(self, ctx: ClientContext) -> tuple[FeatureGenerator, Discriminator]:
        """The round's generator (the broadcast one, or the run's initial one) and the client's
        discriminator, in the model's parameter dtype."""
        layer = classifier_layer(ctx.model)
        features, classes, dtype = layer.in_features, layer.out_features, layer.weight.dtype
        seed = int(self.cfg.seed)
        gen = _seeded(seed * 7919 + 17, lambda: FeatureGenerator(classes, self.noise, features, self.latent))
        if GENERATOR_KEY in ctx.payload:
            load_flat_parameters(gen, ctx.payload[GENERATOR_KEY])
        disc = _seeded(seed * 7919 + 1009 * (ctx.client_id + 1),
                       lambda: Discriminator(features, classes, self.width, self.arch))
        if DISCRIMINATOR_KEY in ctx.state:
            disc.load_state_dict(ctx.state[DISCRIMINATOR_KEY])
        return gen.to(ctx.device, dtype), disc.to(ctx.device, dtype)

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return smoothed_cross_entropy(logits.to(dtype), y, self.smoothing, self.form)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        layer = classifier_layer(model)
        classes, dtype = layer.out_features, layer.weight.dtype
        gen, disc = self.nets(ctx)
        opt = self.start_round(ctx)
        if self.pretrain == "plain":  # Bai et al.'s first local epochs
            out = self.cross_entropy_loop(ctx, opt)
        else:
            out = self.local_loop(ctx, lambda x, y: descend(opt, self.cross_entropy(model(x), y, dtype),
                                                            ctx.record_step))
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
                y_s = torch.zeros(len(y), classes, device=y.device, dtype=dtype)
                y_s.scatter_(1, y.view(-1, 1), self.soft)
                u = torch.rand(len(y), gen.noise, generator=ctx.generator, dtype=torch.float32).to(y.device, dtype)
                if self.disc_first:  # the authors': D on this batch before the model moves
                    sums["fedadg_disc_loss"] += self.disc_step(ctx, model, tap, gen, disc, disc_opt, x, y_s, u, dtype)
                value, align = self.model_step(ctx, model, tap, disc, opt, x, y, y_s, dtype)
                if not math.isfinite(value):
                    return ClientOutcome(loss=value, steps=out.steps + steps + 1)
                if not self.disc_first:  # Bai et al.'s: the model first
                    sums["fedadg_disc_loss"] += self.disc_step(ctx, model, tap, gen, disc, disc_opt, x, y_s, u, dtype)
                sums["fedadg_gen_loss"] += self.gen_step(gen, disc, gen_opt, y_s, u)
                sums["fedadg_align_loss"] += align
                steps += 1
        finally:
            tap.remove()
        model.train()
        ctx.state[DISCRIMINATOR_KEY] = {k: v.detach().to("cpu", copy=True) for k, v in disc.state_dict().items()}
        out.extras[GENERATOR_KEY] = flat_parameters(gen)
        out.metrics = {**out.metrics, **{k: v / max(steps, 1) for k, v in sums.items()}}
        return out

    def model_step(self, ctx: ClientContext, model: nn.Module, tap: FeatureTap, disc: Discriminator, opt,
                   x: torch.Tensor, y: torch.Tensor, y_s: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
        """The model towards ``D``'s side of the generated features: ``α CE_s + (1 − α) mean((1 − D(y_s, z))²)``,
        one step of the round's optimiser, in the mode the model is in. Returns (loss, alignment term)."""
        with autocast(ctx.device, ctx.precision):
            logits = model(x)
            align = torch.mean((1 - disc(y_s, tap.take().to(dtype))) ** 2)
            loss = self.alpha * self.cross_entropy(logits, y, dtype) + (1 - self.alpha) * align
        return descend(opt, loss, ctx.record_step), float(align.detach())

    def disc_step(self, ctx: ClientContext, model: nn.Module, tap: FeatureTap, gen: FeatureGenerator,
                  disc: Discriminator, disc_opt: torch.optim.Optimizer, x: torch.Tensor, y_s: torch.Tensor,
                  u: torch.Tensor, dtype: torch.dtype) -> float:
        """One SGD step of ``D``: generated features towards 1, the encoder's (in eval mode) towards 0;
        the model is put back in training mode unless ``fedadg_model_mode: eval_after_disc``."""
        model.eval()
        with torch.no_grad(), autocast(ctx.device, ctx.precision):
            model(x)
            real = tap.take().to(dtype)
            fake = gen(u, y_s).to(dtype)
        if self.back_to_train:
            model.train()
        disc.train()
        disc_opt.zero_grad()
        if self.least_squares:  # the authors' PACS code
            loss = torch.mean((1 - disc(y_s, fake)) ** 2 + disc(y_s, real) ** 2)
        else:  # their VLCS code, Bai et al.'s
            loss = -torch.mean(disc(y_s, fake) ** 2 + (1 - disc(y_s, real)) ** 2)
        loss.backward()
        disc_opt.step()
        disc.eval()
        return float(loss.detach())

    def gen_step(self, gen: FeatureGenerator, disc: Discriminator, gen_opt: torch.optim.Optimizer,
                 y_s: torch.Tensor, u: torch.Tensor) -> float:
        """``squared``: one SGD step of ``G`` on ``mean(D(y_s, G(u, y_s))²)`` (the generated features
        towards ``D``'s side of the encoder's). ``frozen``: the loss their VLCS code and Bai et al.'s
        compute, ``mean((1 − D(y_s, G(u, y_s).detach()))²)``, which no gradient of ``G`` reaches."""
        if not self.train_gen:
            with torch.no_grad():
                return float(torch.mean((1 - disc(y_s, gen(u, y_s))) ** 2))
        gen.train()
        gen_opt.zero_grad()
        loss = torch.mean(disc(y_s, gen(u, y_s)) ** 2)
        loss.backward()
        gen_opt.step()
        gen.eval()
        return float(loss.detach())


__all__ = ["DISCRIMINATOR_KEY", "Discriminator", "FeatureGenerator", "FedADG", "flat_parameters",
           "load_flat_parameters", "smoothed_cross_entropy"]
