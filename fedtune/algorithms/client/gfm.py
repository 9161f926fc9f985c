"""GFM (global flat minima via global-model-constrained adversarial augmentation) and GCA.

Seed 004, Algorithm 1; docs/methods-seeds.md §4. Per client and round, starting from the global ``θ``:

1. every local step ``e = 1..E``: draw a batch ``(x, y)``, augment it with the client's
   augmenter ``x̃ = a(x; φ)`` (φ frozen, no gradient), take one model step on ``(x̃, y)`` —
   a SAM step (:func:`fedtune.algorithms.client.sam.sam_step`, radius ``sam_rho``) for ``gfm``, a plain
   local-SGD step for ``gca`` (the paper's "GCA" ablation: the augmentation without SAM);
2. when ``e % gfm_interval == 0`` (the counter restarts every round, as in Algorithm 1), one
   update of φ on the same batch (fresh noise) that *maximises*
   ``L(f(a(x;φ); θ_local)) − L(f(a(x;φ); θ_global))``: hard for the local model, still recognised
   by the global model. ``θ_global`` is a frozen copy of the model as received this round;
   both models run in train mode (batch statistics, as TeachAugment's teacher) and neither's
   batch-norm buffers change. The step is Adam with decoupled weight decay
   :data:`AUG_WEIGHT_DECAY` (TeachAugment's AdamW, whose settings the paper keeps), learning rate
   ``gfm_aug_lr`` (TeachAugment's 1e-3), through the functional ``torch.optim.adam.adam``.
   The paper writes the φ update after the θ step on the same batch; so does this code.

The reported training loss is the model's loss on the augmented batch at ``θ`` (before the step),
the quantity the model step minimises.

The augmenter φ and its Adam moments persist per client across rounds in ``ctx.state`` as plain
data only (:func:`augmenter_state`: float32 NumPy arrays and numbers, no module or optimiser
object), so they go into fedtune's checkpoints (which store NumPy arrays and JSON values, never
pickle). Each ``train`` call rebuilds the augmenter and its Adam state from them
(:func:`restore_augmenter`) unless the method instance still holds the module it wrote that very
state from (a per-client cache, checked by the identity of the state dict), and writes the new
state back when it returns. A fresh process given the same ``ctx.state`` continues bit-identically.
The state is lost when the client's actor is restarted without a checkpoint
(``on_client_failure: retry/skip``): the client then starts again from an identity augmenter, so
such a run is not bit-identical to an uninterrupted one. The initial φ is seeded from
``(seed, client_id)``, the augmentation noise from ``(seed, client_id, round)``: runs are
reproducible and backend-independent.

Diagnostics (example-weighted means over clients → ``diag.*`` columns): ``gfm_aug_local_loss``,
``gfm_aug_global_loss`` (means over the round's augmenter updates; absent in a round without
one), ``gfm_aug_updates`` (updates this round), and for ``gfm`` ``sam_sharpness``
(mean ``L(θ+ε) − L(θ)``, see :mod:`fedtune.algorithms.client.sam`).

GFM and GCA need images ``(N, C, H, W)``; on vector data (``rect4``) the first ``train`` call
raises a :class:`~fedtune.errors.ConfigError` naming the dataset (the method is built from the
config alone, which does not know the input shape).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import GFM_AUG_LR, GFM_COLOR_SCALE, GFM_GEOMETRY_SCALE, GFM_INTERVAL, SAM_RHO
from fedtune.algorithms.client.optim import FunctionalAdam
from fedtune.algorithms.client.precision import autocast_off
from fedtune.algorithms.client.sam import SamDescent, frozen_buffers
from fedtune.errors import ConfigError


AUG_WEIGHT_DECAY = 1e-2  # TeachAugment's AdamW weight decay for the augmenter (decoupled; pulls φ to identity)
AUG_BETAS = (0.9, 0.999)
AUG_EPS = 1e-8
STATE_KEY = "gfm_augmenter"


def triangle_wave(v: torch.Tensor) -> torch.Tensor:
    """``tri(v) = acos(cos πv)/π``: the period-2 triangle wave, ``v`` on ``[0, 1]``, ``2 − v`` on
    ``[1, 2]``, folding any value back into ``[0, 1]``.

    Computed piecewise from ``v mod 2`` (equal to the acos form, exact on ``[0, 1]``): the acos
    form loses ~``sqrt(float eps)`` ≈ 3e-4 near 0 and 1 and has an infinite derivative at the
    peaks, where TeachAugment patches the gradient by hand; here the gradient is ±1 everywhere
    (the left derivative at the peaks).

    >>> import torch
    >>> triangle_wave(torch.tensor([-0.25, 0.0, 0.3, 1.0, 1.25, 2.5])).tolist()
    [0.25, 0.0, 0.30000001192092896, 1.0, 0.75, 0.5]
    """
    r = torch.remainder(v, 2.0)
    return torch.where(r <= 1.0, r, 2.0 - r)


def _module_seed(*parts: int) -> int:
    """A 63-bit seed from integers, identical in every process (as the runtime's derive_seed)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0] >> 1)


class Augmenter(nn.Module):
    """TeachAugment's (Suzuki, 2022) colour + geometry augmenter, as GFM uses it (App. D.2).

    ``Augmenter(in_channels, color_scale=0.2, geometry_scale=0.125, noise_dim=128, hidden=128)``.
    Sizes: TeachAugment's (colour width 128, noise dimension 128, noise MLPs 128→512→512): 0.68M
    parameters for RGB, which the GFM paper keeps ("other hyperparameters ... kept the same as
    (Suzuki, 2022)", App. D). Its Table 7 reports space in units of the model size ``M``: GFM's
    local space is 2.25M against FedSAM's M with ResNet-18, i.e. the frozen global copy (M) and
    0.25·M ≈ 2.8 million numbers for the augmenter (0.12·M with ResNet-50, ≈23.9·M with the
    Digits-DG ConvNet: the same ≈2.8 million), not 0.25 million parameters; what beyond the
    augmenter's parameters that count includes (Adam moments, gradients, the replay buffer) the
    paper does not say.
    ``forward(x, noise)`` maps normalised images ``x`` ``[B, C, H, W]`` to augmented ones:

    * value range: the triangle wave expects ``[0, 1]``, fedtune's images are normalised
      (``(raw − mean)/std``). The augmenter holds per-channel bounds ``value_lo/value_hi``
      (buffers; :meth:`set_value_range`, GFM sets them to the client's training-data min/max
      per channel, i.e. the normalisation's image of ``[0, 1]`` as far as the data reaches)
      and works on ``u = (x − lo)/(hi − lo)``; the result is mapped back with ``lo + (hi − lo)·u``
      (:meth:`value_map`). Geometry also acts on ``u``, so the zero padding of ``grid_sample`` is
      the darkest value.
    * colour: per-pixel logits from 1×1 convolutions over the (normalised) image
      (C→hidden→hidden→2C, LeakyReLU 0.2) plus a global branch from the noise vector
      (noise_dim→4·noise_dim→4·noise_dim→2, shared by all channels), added, then
      ``α = 1 + color_scale·(σ(·) − ½)``, ``β = σ(·) − ½`` (TeachAugment scales α only), and
      ``u ← tri(α ⊙ u + β)``;
    * geometry: a residual affine ``A = geometry_scale·(σ(g(noise)) − ½)`` (2×3, noise MLP as
      above), ``u ← grid_sample(u, affine_grid(A + I))`` (bilinear, zero padding,
      ``align_corners=False``).

    The three output layers are zero-initialised, so at initialisation ``α = 1, β = 0, A = 0``
    and the augmenter is the identity (exactly, up to float rounding of the range map and of
    the bilinear sampling at pixel centres). Left out of TeachAugment, by choice: batch norm
    and dropout in the hidden layers (a client with a single example still trains on a batch of
    one), the class-label context input, the stochastic "random apply" gates, the colour
    regulariser and the replay buffer of past augmenters (TeachAugment's ``sampling_freq`` and
    ``n_chunk``: the GFM paper's "sampling augmentation frequency 10" and "4 data splits", App. D,
    which in TeachAugment store a copy of φ every 10 epochs and augment each quarter of a batch
    with a copy drawn from that buffer; docs/methods-seeds.md §4.3 lists them as departures). Plain torch ops only (no
    torchvision: its import costs ~2 s).
    """

    def __init__(self, in_channels: int, color_scale: float = 0.2, geometry_scale: float = 0.125,
                 noise_dim: int = 128, hidden: int = 128, generator: torch.Generator | None = None):
        super().__init__()
        self.in_channels, self.noise_dim = int(in_channels), int(noise_dim)
        self.color_scale, self.geometry_scale = float(color_scale), float(geometry_scale)
        # Registration order (colour, then geometry, then buffers) fixes the init draws and the
        # state_dict order: keep it.
        self.color_body = nn.Sequential(
            nn.Conv2d(in_channels, hidden, 1, bias=False), nn.LeakyReLU(0.2),
            nn.Conv2d(hidden, hidden, 1, bias=False), nn.LeakyReLU(0.2))
        self.color_out = nn.Conv2d(hidden, 2 * in_channels, 1, bias=False)
        self.color_noise_body = self._noise_mlp()
        self.color_noise_out = nn.Linear(4 * self.noise_dim, 2, bias=False)
        self.geometry_body = self._noise_mlp()
        self.geometry_out = nn.Linear(4 * self.noise_dim, 6, bias=False)
        self.register_buffer("value_lo", torch.zeros(in_channels))
        self.register_buffer("value_hi", torch.ones(in_channels))
        self.register_buffer("identity", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
        self.reset(generator)

    def _noise_mlp(self) -> nn.Sequential:
        """noise_dim → 4·noise_dim → 4·noise_dim (LeakyReLU 0.2): the body of a noise branch."""
        wide = 4 * self.noise_dim
        return nn.Sequential(nn.Linear(self.noise_dim, wide, bias=False), nn.LeakyReLU(0.2),
                             nn.Linear(wide, wide, bias=False), nn.LeakyReLU(0.2))

    def reset(self, generator: torch.Generator | None = None) -> None:
        """TeachAugment's init: Kaiming-normal (a=0.2, fan_out) hidden layers, zero output layers."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.kaiming_normal_(m.weight, 0.2, "fan_out", generator=generator)
            for m in (self.color_out, self.color_noise_out, self.geometry_out):
                m.weight.zero_()

    def set_value_range(self, lo: torch.Tensor, hi: torch.Tensor) -> None:
        """Per-channel values that map to 0 and 1 for the triangle wave (see the class doc)."""
        with torch.no_grad():
            self.value_lo.copy_(torch.as_tensor(lo, dtype=self.value_lo.dtype).reshape(-1))
            self.value_hi.copy_(torch.as_tensor(hi, dtype=self.value_hi.dtype).reshape(-1))

    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.randn(batch, self.noise_dim, generator=generator, device=self.value_lo.device)

    def transforms(self, x: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(α [B,C,H,W], β [B,C,H,W], A [B,2,3])`` for images ``x`` and noise ``[B, noise_dim]``."""
        b, c = x.shape[0], self.in_channels
        pixel = self.color_out(self.color_body(x))  # [B, 2C, H, W]
        glob = self.color_noise_out(self.color_noise_body(noise)).reshape(b, 2, 1, 1)
        alpha = 1.0 + self.color_scale * (torch.sigmoid(pixel[:, :c] + glob[:, :1]) - 0.5)
        beta = torch.sigmoid(pixel[:, c:] + glob[:, 1:]) - 0.5
        residual = self.geometry_scale * (torch.sigmoid(self.geometry_out(self.geometry_body(noise))) - 0.5)
        return alpha, beta, residual.reshape(b, 2, 3)

    def value_map(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lo, span)`` shaped ``[1, C, 1, 1]``: ``u = (x − lo)/span`` (a channel of zero span
        maps with span 1)."""
        lo = self.value_lo.reshape(1, -1, 1, 1)
        span = self.value_hi.reshape(1, -1, 1, 1) - lo
        return lo, torch.where(span > 0, span, torch.ones_like(span))

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"augmenter for {self.in_channels}-channel images got input of shape {tuple(x.shape)}")
        if noise is None:
            noise = self.sample_noise(x.shape[0], generator)
        alpha, beta, residual = self.transforms(x, noise)
        lo, span = self.value_map()
        u = (x - lo) / span
        u = triangle_wave(alpha * u + beta)
        grid = F.affine_grid(residual + self.identity, list(u.shape), align_corners=False)
        u = F.grid_sample(u, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return lo + span * u


def new_augmenter(in_channels: int, *, color_scale: float = 0.2, geometry_scale: float = 0.125,
                  noise_dim: int = 128, hidden: int = 128, generator: torch.Generator | None = None) -> Augmenter:
    """An identity-initialised :class:`Augmenter` (``generator`` seeds its hidden layers)."""
    return Augmenter(in_channels, color_scale=color_scale, geometry_scale=geometry_scale,
                              noise_dim=noise_dim, hidden=hidden, generator=generator)


class AugmenterAdam(FunctionalAdam):
    """The augmenter's optimiser: Adam with decoupled weight decay (AdamW, TeachAugment's
    settings :data:`AUG_BETAS`, :data:`AUG_EPS`, default weight decay :data:`AUG_WEIGHT_DECAY`),
    ``maximize=True``: it ascends the objective it is given the gradient of."""

    def __init__(self, params, lr: float, weight_decay: float = AUG_WEIGHT_DECAY):
        super().__init__(params, lr, weight_decay, betas=AUG_BETAS, eps=AUG_EPS, decoupled_weight_decay=True,
                         maximize=True)


def augmenter_state(augmenter: Augmenter, opt: AugmenterAdam) -> dict[str, Any]:
    """The augmenter and its Adam state as plain data (for ``ctx.state`` and checkpoints): fresh
    float32 NumPy copies of every ``state_dict`` entry (``aug.<name>``: parameters and buffers),
    of the Adam moments and step counts (``adam.exp_avg.<name>``, ``adam.exp_avg_sq.<name>``,
    ``adam.step.<name>``, per parameter name), and the construction settings as plain numbers
    (``in_channels``, ``noise_dim``, ``hidden``, ``color_scale``, ``geometry_scale``, ``lr``,
    ``weight_decay``). :func:`restore_augmenter` turns it back, bit-identically.

    >>> import torch
    >>> aug = new_augmenter(1, noise_dim=4, hidden=2, generator=torch.Generator().manual_seed(0))
    >>> state = augmenter_state(aug, AugmenterAdam(aug.parameters(), lr=0.1))
    >>> state["aug.color_out.weight"].shape, state["adam.step.color_out.weight"].dtype, state["lr"]
    ((2, 2, 1, 1), dtype('float32'), 0.1)
    """

    def plain(t: torch.Tensor) -> np.ndarray:
        return np.array(t.detach().cpu().numpy(), dtype=np.float32, copy=True)

    state: dict[str, Any] = {
        "in_channels": int(augmenter.in_channels), "noise_dim": int(augmenter.noise_dim),
        "hidden": int(augmenter.color_body[0].out_channels), "color_scale": float(augmenter.color_scale),
        "geometry_scale": float(augmenter.geometry_scale), "lr": float(opt.lr),
        "weight_decay": float(opt.weight_decay),
    }
    for name, value in augmenter.state_dict().items():
        state[f"aug.{name}"] = plain(value)
    by_param = {id(p): name for name, p in augmenter.named_parameters()}
    for p, m, v, step in zip(opt.params, opt.exp_avgs, opt.exp_avg_sqs, opt.steps):
        name = by_param[id(p)]
        state[f"adam.exp_avg.{name}"] = plain(m)
        state[f"adam.exp_avg_sq.{name}"] = plain(v)
        state[f"adam.step.{name}"] = plain(step)
    return state


def restore_augmenter(state: dict[str, Any], device: Any = "cpu") -> tuple[Augmenter, AugmenterAdam]:
    """The augmenter (on ``device``) and its :class:`AugmenterAdam` from :func:`augmenter_state`'s
    output; the arrays are copied (the module never shares memory with ``state``). Adam step
    counts stay on the CPU, as :class:`AugmenterAdam` keeps them.

    >>> import torch
    >>> aug = new_augmenter(1, noise_dim=4, hidden=2, generator=torch.Generator().manual_seed(0))
    >>> opt = AugmenterAdam(aug.parameters(), lr=0.1)
    >>> back, back_opt = restore_augmenter(augmenter_state(aug, opt))
    >>> all(torch.equal(a, b) for a, b in zip(aug.state_dict().values(), back.state_dict().values()))
    True
    """
    # A throwaway generator: the hidden layers' init is overwritten, and the global RNG stays untouched.
    aug = new_augmenter(int(state["in_channels"]), color_scale=float(state["color_scale"]),
                        geometry_scale=float(state["geometry_scale"]), noise_dim=int(state["noise_dim"]),
                        hidden=int(state["hidden"]), generator=torch.Generator().manual_seed(0))
    aug.load_state_dict({name: torch.from_numpy(np.array(state[f"aug.{name}"], dtype=np.float32))
                         for name in aug.state_dict()})
    aug = aug.to(device)
    opt = AugmenterAdam(aug.parameters(), lr=float(state["lr"]), weight_decay=float(state["weight_decay"]))
    names = [name for name, p in aug.named_parameters() if p.requires_grad]

    def tensor(key: str, like: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.array(state[key], dtype=np.float32)).to(like.device)

    opt.exp_avgs = [tensor(f"adam.exp_avg.{n}", p) for n, p in zip(names, opt.params)]
    opt.exp_avg_sqs = [tensor(f"adam.exp_avg_sq.{n}", p) for n, p in zip(names, opt.params)]
    opt.steps = [tensor(f"adam.step.{n}", s) for n, s in zip(names, opt.steps)]
    return aug, opt


def augmenter_objective(augmenter: Augmenter, x: torch.Tensor, y: torch.Tensor, local_model: nn.Module,
                        global_model: nn.Module, noise: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """``(L_local − L_global, L_local, L_global)`` on ``a(x; φ, noise)`` (cross-entropy, both models
    as they are: in train mode, batch-norm buffers move unless the caller freezes them, as
    :func:`augmenter_update` does)."""
    xa = augmenter(x, noise)
    local = F.cross_entropy(local_model(xa), y)
    glob = F.cross_entropy(global_model(xa), y)
    return local - glob, float(local.detach()), float(glob.detach())


def augmenter_update(augmenter: Augmenter, opt: AugmenterAdam, x: torch.Tensor, y: torch.Tensor,
                     local_model: nn.Module, global_model: nn.Module, noise: torch.Tensor) -> tuple[float, float]:
    """One ascent step of φ on ``L_local − L_global`` (Algorithm 1, lines 11-12). Gradients reach
    φ only (``torch.autograd.grad``): the models' ``.grad`` are untouched. Returns
    ``(L_local, L_global)`` before the step; φ is left unchanged if either is not finite."""
    # Batch-norm buffers of both models are restored after the backward pass (frozen_buffers).
    with frozen_buffers(local_model), frozen_buffers(global_model):
        objective, local, glob = augmenter_objective(augmenter, x, y, local_model, global_model, noise)
        if not (math.isfinite(local) and math.isfinite(glob)):
            return local, glob
        with autocast_off(objective.device.type):
            grads = torch.autograd.grad(objective, opt.params, allow_unused=True)
    opt.step([torch.zeros_like(p) if g is None else g for p, g in zip(opt.params, grads)])
    return local, glob


class GCA(ClientMethod):
    """Global-model-constrained adversarial augmentation with plain local SGD (GFM without SAM)."""

    name = "gca"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.interval = GFM_INTERVAL.of(cfg)
        self.aug_lr = GFM_AUG_LR.of(cfg)
        self.color_scale = GFM_COLOR_SCALE.of(cfg)
        self.geometry_scale = GFM_GEOMETRY_SCALE.of(cfg)
        self.rho: float | None = None  # GFM: the SAM radius (GCA steps without SAM)
        # client id -> (the ctx.state dict last written, its live augmenter, its Adam): saves the
        # rebuild while ctx.state still holds that very dict; never the source of truth.
        self._cache: dict[int, tuple[dict[str, Any], Augmenter, AugmenterAdam]] = {}

    def _augmenter(self, ctx: ClientContext) -> tuple[Augmenter, AugmenterAdam]:
        """This client's augmenter and its Adam state: created on its first round, else the cached
        module if ``ctx.state[STATE_KEY]`` is the very dict this instance last wrote for the client,
        else rebuilt from that plain state (:func:`restore_augmenter`: a restored checkpoint, a
        fresh process)."""
        cfg = self.cfg
        if len(ctx.data.input_shape) != 3:
            raise ConfigError(
                f"field 'dataset': algorithm '{cfg.algorithm}' (client method {self.name}) augments images "
                f"(N, C, H, W), but dataset '{cfg.dataset}' gives vectors of shape {tuple(ctx.data.input_shape)}; "
                "allowed: an image dataset (e.g. rotated-digits, pacs), or a client method without an augmenter "
                "(sgd, sam, prox)")
        held = ctx.state.get(STATE_KEY)
        cached = self._cache.get(ctx.client_id)
        if held is not None and cached is not None and cached[0] is held:
            return cached[1], cached[2]
        if held is not None:
            return restore_augmenter(held, ctx.device)
        gen = torch.Generator().manual_seed(_module_seed(cfg.seed, ctx.client_id, 0x47464D))
        aug = new_augmenter(ctx.data.input_shape[0], color_scale=self.color_scale,
                            geometry_scale=self.geometry_scale, generator=gen)
        aug.set_value_range(*ctx.data.value_range())
        aug = aug.to(ctx.device)
        return aug, AugmenterAdam(aug.parameters(), lr=self.aug_lr)

    def _keep(self, ctx: ClientContext, augmenter: Augmenter, opt: AugmenterAdam) -> None:
        """Write the client's augmenter state to ``ctx.state`` (plain data) and cache the live
        objects against that very dict."""
        state = augmenter_state(augmenter, opt)
        ctx.state[STATE_KEY] = state
        self._cache[ctx.client_id] = (state, augmenter, opt)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        augmenter, aug_opt = self._augmenter(ctx)
        try:
            return self._train(ctx, augmenter, aug_opt)
        finally:
            self._keep(ctx, augmenter, aug_opt)

    def _train(self, ctx: ClientContext, augmenter: Augmenter, aug_opt: AugmenterAdam) -> ClientOutcome:
        model, cfg = ctx.model, self.cfg
        interval = self.interval
        opt = self.start_round(ctx)
        augmenter.train()
        global_model = copy.deepcopy(model).requires_grad_(False)  # as received, in training mode
        sam = SamDescent(opt, model, self.rho, ctx.record_step) if self.rho is not None else None
        noise_gen = torch.Generator(device=ctx.device).manual_seed(
            _module_seed(cfg.seed, ctx.client_id, ctx.round, 0x4E4F49))
        taken = 0
        local_losses: list[float] = []
        global_losses: list[float] = []

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            """A model step on the augmented batch, then every ``interval``-th step one augmenter
            update on the same batch (a non-finite augmenter loss ends the round as a model loss would)."""
            nonlocal taken
            with torch.no_grad():
                xa = augmenter(x, generator=noise_gen)
            value = sam(xa, y) if sam is not None else descend(opt, F.cross_entropy(model(xa), y), ctx.record_step)
            if not math.isfinite(value):
                return value
            taken += 1
            if taken % interval == 0:
                noise = augmenter.sample_noise(x.shape[0], noise_gen)
                local, glob = augmenter_update(augmenter, aug_opt, x, y, model, global_model, noise)
                if not (math.isfinite(local) and math.isfinite(glob)):
                    return local if not math.isfinite(local) else glob
                local_losses.append(local)
                global_losses.append(glob)
            return value

        def metrics(steps: int) -> dict[str, float]:
            out: dict[str, float] = {"gfm_aug_updates": float(len(local_losses))}
            if local_losses:
                out["gfm_aug_local_loss"] = float(np.mean(local_losses))
                out["gfm_aug_global_loss"] = float(np.mean(global_losses))
            if sam is not None:
                out.update(sam.metrics(steps))
            return out

        return self.local_loop(ctx, step, metrics)


class GFM(GCA):
    """GFM: SAM local steps on images from the global-model-constrained adversarial augmenter."""

    name = "gfm"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.rho = SAM_RHO.of(cfg)
