"""FedDG's continuous frequency-space interpolation as a client method (Liu, Chen, Qin, Dou, Heng,
"FedDG: Federated Domain Generalization on Medical Image Segmentation via Episodic Learning in
Continuous Frequency Space", CVPR 2021 (ELCFS); as Bai, Bagchi, Inouye's FedDG benchmark, ICLR 2024,
runs it: ``src/client.py`` ``FourierMixup``, ``src/server.py`` ``FedDG``; docs/methods-benchmark.md §23).

Clients share the amplitude spectra of their images (the phase, which carries the semantics, stays
local). Each local step, with ``x`` the batch (the run's augmentation applied) and ``x'`` a batch of
the same size drawn uniformly with replacement from every source client's training images
(the *source bank*, un-augmented; ``ClientContext.source_bank``):

1. ``A, P = |F(x)|, arg F(x)`` and ``A' = |F(x')|`` (2-D FFT of each channel);
2. ``r ~ U(feddg_ratio_low, feddg_ratio_high)`` per batch, and the window ``L``: ``feddg_window:
   dc`` (default) ``L = 0``, the DC term alone (ELCFS's training code, ``source_to_target_freq(...,
   L=0)``); ``centred`` and ``bai`` ``L ~ U(0, 1)`` per batch (Bai et al.'s ``lmda =
   random.uniform(0, 1)``);
3. in the centred (``fftshift``-ed) spectrum, the low-frequency square of half-width
   ``b = ⌊min(H, W) · L⌋`` around ``(⌊H/2⌋, ⌊W/2⌋)``, clipped to the spectrum (``centred``; ``bai``
   slices it as Bai et al.'s code, see :func:`amplitude_mix`): ``A ← r · A + (1 − r) · A'``;
4. ``x̃ = Re F⁻¹(A e^{iP})``; one SGD step on the cross-entropy of ``x̃`` (the step trains on the
   interpolated images only, as Bai et al.'s ``process_batch``).

The default ``r = 0`` (``feddg_ratio_low = feddg_ratio_high = 0``) swaps the square in outright, as
ELCFS's training code does; ``feddg_ratio_high: 1`` is the paper's continuous interpolation. ``r =
1`` leaves every image as it is (up to the FFT round trip): Bai et al.'s sweeps set ``hparam1 = 1``
and leave ``hparam2`` at its default 1, so their FedDG rows train on the clients' own images
(docs/methods-benchmark.md §23.2); ``feddg_ratio_low: 1, feddg_ratio_high: 1`` runs that. The FFTs run in float32 outside autocast. Randomness (``L``
under ``centred``/``bai``, ``r``, the bank's rows) comes from the client's round generator: runs are
reproducible.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.client.precision import autocast_off
from fedtune.algorithms.declarations import FEDDG_RATIO_HIGH, FEDDG_RATIO_LOW, FEDDG_WINDOW
from fedtune.errors import ConfigError


def amplitude_mix(x: torch.Tensor, bank: torch.Tensor, window: float, ratio: float,
                  wrap: bool = False) -> torch.Tensor:
    """``Re F⁻¹((r·A + (1−r)·A') e^{iP})`` in the low-frequency square of half-width ``⌊min(H, W)·window⌋``
    (``A`` elsewhere): ``A, P`` the amplitude and phase of ``x`` ``[B, C, H, W]``, ``A'`` the amplitude
    of ``bank`` (same shape), ``r = ratio``. Float32; the memory format of ``x`` is kept.

    The square is clipped to the spectrum. ``wrap=True`` slices as Bai et al.'s
    ``_amp_spectrum_swap`` does: a start below 0 (``window`` above about ½) counts from the end, as
    Python slices do, so the mixed region is an off-centre block (or nothing).

    >>> x = torch.arange(16.).reshape(1, 1, 4, 4)
    >>> bool(torch.allclose(amplitude_mix(x, torch.zeros(1, 1, 4, 4), 0.5, 1.0), x, atol=1e-5))
    True
    """
    h, w = x.shape[-2:]
    spec = torch.fft.fft2(x.float())
    amp, phase = spec.abs(), spec.angle()
    amp_bank = torch.fft.fft2(bank.float()).abs()
    a = torch.fft.fftshift(amp, dim=(-2, -1))
    a_bank = torch.fft.fftshift(amp_bank, dim=(-2, -1))
    b = int(min(h, w) * window)
    ch, cw = int(h / 2), int(w / 2)
    lo_h, lo_w = (ch - b, cw - b) if wrap else (max(ch - b, 0), max(cw - b, 0))
    rows, cols = slice(lo_h, ch + b + 1), slice(lo_w, cw + b + 1)
    a[..., rows, cols] = a[..., rows, cols] * ratio + a_bank[..., rows, cols] * (1 - ratio)
    mixed = torch.fft.ifftshift(a, dim=(-2, -1)) * torch.exp(1j * phase)
    out = torch.fft.ifft2(mixed).real
    return out.contiguous(memory_format=torch.channels_last) if x.is_contiguous(
        memory_format=torch.channels_last) and not x.is_contiguous() else out


class FedDG(ClientMethod):
    """Local SGD on the batch with its low-frequency amplitudes interpolated towards those of random
    images of the source bank (module docstring)."""

    name = "feddg"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.low, self.high = float(FEDDG_RATIO_LOW.of(cfg)), float(FEDDG_RATIO_HIGH.of(cfg))
        window = FEDDG_WINDOW.of(cfg)
        self.wrap, self.draws_window = window == "bai", window != "dc"

    def train(self, ctx: ClientContext) -> ClientOutcome:
        bank = ctx.source_bank
        if bank is None or len(bank) == 0:
            raise ConfigError("client method feddg: the run has no source bank (every source client's training "
                              "images) to draw amplitude spectra from")
        if len(ctx.data.input_shape) != 3:
            raise ConfigError(f"client method feddg: needs images (C, H, W), the dataset's examples have shape "
                              f"{tuple(ctx.data.input_shape)}; use an image dataset")
        model, opt = ctx.model, self.start_round(ctx)
        gen = ctx.generator

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            window = float(torch.rand((), generator=gen)) if self.draws_window else 0.0
            ratio = self.low + (self.high - self.low) * float(torch.rand((), generator=gen))
            rows = torch.randint(len(bank), (x.shape[0],), generator=gen)
            bx, _ = bank.batch(rows)
            with autocast_off(x.device.type):
                mixed = amplitude_mix(x, bx, window, ratio, self.wrap).to(x.dtype)
            return descend(opt, F.cross_entropy(model(mixed), y), ctx.record_step)

        return self.local_loop(ctx, step)


__all__ = ["FedDG", "amplitude_mix"]
