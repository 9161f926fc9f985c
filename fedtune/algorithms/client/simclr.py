"""SimCLR on the client (docs/methods-seeds.md §3, docs/methods-protocol.md §5 UFDG): contrastive training without labels.

Each local step draws a mini-batch, makes two random views of every example
(:func:`augment`), runs both through the model (encoder + projector MLP, see
:func:`fedtune.models.build_model` with ``head="projector"``) in one forward pass, and descends
the NT-Xent loss (:func:`nt_xent`, Chen et al. 2020) with :class:`~fedtune.algorithms.client.optim.LocalSGD`.
Labels are never read. The whole model, projector included, is federated by the server rule;
evaluation is a linear probe on the frozen encoder's features (fitted on the coordinator).

Augmentations (plain torch, no torchvision: its import pulls ``torch._dynamo``, about 2 s per
fresh actor), drawn from the client's seeded generator so a run is reproducible:

* images ``[B, C, H, W]``: a random resized crop (area fraction in :data:`CROP_SCALE`, aspect
  ratio log-uniform in :data:`CROP_RATIO`, resized back to ``H x W`` by ``affine_grid`` /
  ``grid_sample``, bilinear, border padding). Three-channel images (photos) are also flipped
  horizontally with probability 1/2 and colour-jittered with probability :data:`JITTER_P`
  (brightness, contrast, saturation, strength :data:`JITTER_STRENGTH`; random greyscale with
  probability :data:`GREY_P`), as in SimCLR. One-channel images (digits, letters, glyphs) are
  neither flipped (a mirrored glyph is often another glyph) nor colour-jittered (no colour).
  The jitter works in the model's input space (inputs arrive normalised): brightness adds a
  multiple of each image's standard deviation, contrast scales around each image's per-channel
  mean, saturation blends with the mean over channels. With per-channel affine normalisation
  contrast is exact; brightness and saturation approximate torchvision's.
* vectors ``[B, D]`` (e.g. rect4): Gaussian jitter with standard deviation
  :data:`VECTOR_NOISE` times each feature's standard deviation over the batch.

Client optimisation is LocalSGD with the run's ``local_lr`` / ``local_momentum`` /
``weight_decay`` (the FedGaLA paper uses Adam at 3e-3; fedtune keeps one optimiser for every
client method so that hyperparameters mean the same everywhere).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import SIMCLR_PROJ_DIM, SIMCLR_TEMPERATURE
from fedtune.algorithms.client.gala import GatedClientMixin
from fedtune.errors import ConfigError

CROP_SCALE = (0.3, 1.0)  # area fraction of the random crop (SimCLR: 0.08..1; small images need more)
CROP_RATIO = (3 / 4, 4 / 3)  # aspect ratio (width / height) of the crop
JITTER_P = 0.8  # probability of colour jitter (3-channel images)
JITTER_STRENGTH = 0.4  # brightness / contrast / saturation factors in [1 - s, 1 + s]
GREY_P = 0.2  # probability of greyscale (3-channel images)
VECTOR_NOISE = 0.1  # vectors: noise std as a fraction of each feature's batch std



def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent (normalised temperature-scaled cross entropy) of ``B`` positive pairs.

    ``z1[i]`` and ``z2[i]`` are the projections of two views of example ``i``. All ``2B``
    projections are L2-normalised; each one is an anchor whose positive is its partner and whose
    negatives are the other ``2B - 2`` projections:
    ``ℓ_a = -log( exp(s_a,pos/τ) / Σ_{b≠a} exp(s_a,b/τ) )`` with cosine similarities ``s``;
    the loss is the mean of ``ℓ_a`` over the ``2B`` anchors.

    >>> import torch
    >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> round(float(nt_xent(z, z, 1.0)), 4)     # log(e + 2) - 1: positive cosine 1, negatives 0 and 0
    0.5514
    """
    if not temperature > 0:
        raise ValueError(f"nt_xent temperature: {temperature} is out of range; allowed: > 0")
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"nt_xent needs two [B, d] tensors of one shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = (z @ z.T) / temperature
    logits = logits.masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
    positives = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(logits, positives)


def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One random view of each example of ``x`` (see the module docstring for what is drawn).

    Random numbers come from ``generator`` (a CPU generator) and move to ``x``'s device.
    """
    if x.dim() == 4:
        return _augment_images(x, generator)
    if x.dim() == 2:
        return _augment_vectors(x, generator)
    raise ValueError(f"augment needs images [B, C, H, W] or vectors [B, D], got shape {tuple(x.shape)}")


def two_views(x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent random views of ``x`` (first view drawn first)."""
    return augment(x, generator), augment(x, generator)


def _uniform(generator, shape, lo: float, hi: float, device) -> torch.Tensor:
    return (lo + (hi - lo) * torch.rand(shape, generator=generator)).to(device)


def _augment_vectors(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    std = x.detach().std(dim=0, unbiased=False, keepdim=True)
    noise = torch.randn(tuple(x.shape), generator=generator).to(device=x.device, dtype=x.dtype)
    return x + VECTOR_NOISE * std * noise


def _augment_images(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    b, c = x.shape[0], x.shape[1]
    dev, dt = x.device, x.dtype
    area = _uniform(generator, (b,), *CROP_SCALE, dev)
    log_ratio = _uniform(generator, (b,), math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]), dev)
    ratio = torch.exp(log_ratio)
    crop_w = torch.sqrt(area * ratio).clamp(max=1.0)  # crop width as a fraction of the image width
    crop_h = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (2 * _uniform(generator, (b,), 0.0, 1.0, dev) - 1) * (1 - crop_w)  # crop stays inside
    cy = (2 * _uniform(generator, (b,), 0.0, 1.0, dev) - 1) * (1 - crop_h)
    flip = torch.ones(b, device=dev)
    if c == 3:
        flip = torch.where(_uniform(generator, (b,), 0.0, 1.0, dev) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3, device=dev, dtype=dt)
    theta[:, 0, 0] = (crop_w * flip).to(dt)
    theta[:, 0, 2] = cx.to(dt)
    theta[:, 1, 1] = crop_h.to(dt)
    theta[:, 1, 2] = cy.to(dt)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    if c == 3:
        out = _colour_jitter(out, generator)
    return out


def _colour_jitter(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    b, dev, dt = x.shape[0], x.device, x.dtype
    s = JITTER_STRENGTH
    u = torch.rand(b, 5, generator=generator).to(device=dev, dtype=dt)
    jitter = (u[:, 0] < JITTER_P).view(b, 1, 1, 1)
    bright = ((2 * u[:, 1] - 1) * s).view(b, 1, 1, 1)
    contrast = (1 - s + 2 * s * u[:, 2]).view(b, 1, 1, 1)
    saturation = (1 - s + 2 * s * u[:, 3]).view(b, 1, 1, 1)
    grey_now = (u[:, 4] < GREY_P).view(b, 1, 1, 1)
    y = x + bright * x.std(dim=(1, 2, 3), keepdim=True)
    mean = y.mean(dim=(2, 3), keepdim=True)
    y = mean + contrast * (y - mean)
    grey = y.mean(dim=1, keepdim=True)
    y = grey + saturation * (y - grey)
    x = torch.where(jitter, y, x)
    return torch.where(grey_now, x.mean(dim=1, keepdim=True).expand_as(x), x)


class SimCLRLoss:
    """The SimCLR objective of one mini-batch, for any client method that wants it:
    ``loss = SimCLRLoss(temperature)(model, xb, generator)`` draws two views of ``xb``, projects
    both with ``model`` (one forward pass over the ``2B`` views, so batch norm sees both) and
    returns :func:`nt_xent`. A gated variant (FedGaLA) reuses it with its own optimiser step.
    """

    def __init__(self, temperature: float):
        if not temperature > 0:
            raise ConfigError(f"field 'simclr_temperature': {temperature} is out of range; allowed: > 0")
        self.temperature = float(temperature)

    @classmethod
    def from_cfg(cls, cfg: RunConfig) -> SimCLRLoss:
        """The loss at the run's ``simclr_temperature``."""
        return cls(SIMCLR_TEMPERATURE.of(cfg))

    def __call__(self, model: nn.Module, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        v1, v2 = two_views(x, generator)
        z1, z2 = model(torch.cat([v1, v2])).chunk(2)
        return nt_xent(z1, z2, self.temperature)


def projector_head(cfg: RunConfig) -> dict[str, Any]:
    """``build_model`` keyword arguments of an unsupervised (SimCLR-style) run: the projector head."""
    return {"head": "projector", "proj_dim": SIMCLR_PROJ_DIM.of(cfg)}


class SimCLR(ClientMethod):
    """Federated SimCLR client (FedSimCLR, the FedGaLA paper's baseline): local SGD on NT-Xent."""

    name = "simclr"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.loss_fn = SimCLRLoss.from_cfg(cfg)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        loss_fn = self.loss_fn
        model, opt = ctx.model, self.start_round(ctx)
        # labels (y) are never read; the views draw from the data-order generator, on top of the
        # run's training augmentation (augment) when it has one
        return self.local_loop(ctx, lambda x, y: descend(opt, loss_fn(model, x, ctx.generator), ctx.record_step))


# FedGaLA's local alignment on the SimCLR loss (docs/methods-seeds.md §3, the paper's own setting): the
# step above, with the optimiser swapped for fedtune.algorithms.client.gala.GatedSGD by the mixin.


class GalaSimCLR(GatedClientMixin, SimCLR):
    """FedGaLA's client in the unsupervised setting: :class:`SimCLR` (views, NT-Xent, projector)
    whose every tensor-step is gated by ``gala_tau`` against the last global move
    (:class:`~fedtune.algorithms.client.gala.GatedSGD`; no gating in round 1). Metric ``gala_skipped``:
    the fraction of skipped tensor-steps this round."""

    name = "gala-simclr"
