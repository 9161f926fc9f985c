"""``colored-digits``: DomainBed's ColoredMNIST construction on the embedded digits (no download).

scikit-learn's bundled 8x8 handwritten digits (1797 images, pixel values 0..16), coloured as
DomainBed's ``ColoredMNIST`` colours MNIST (Arjovsky et al., "Invariant Risk Minimization"; the
FDA experiments of seed 002 use it with one domain as the target):

* the 1797 images are shuffled with ``np.random.default_rng(data_seed)`` and dealt round-robin
  into 3 domains (DomainBed's ``images[i::3]``: 599 images each); inside a domain the canonical
  order is by original sklearn index;
* the binary label is ``digit < 5`` (class 1 = digits 0-4, class 0 = digits 5-9), flipped with
  probability 0.25 (label noise: the digit shape predicts the label 75 % of the time);
* the colour is the (noisy) label, flipped with probability ``e`` = 0.1, 0.2, 0.9 in the domains
  named after the colour-label correlation, ``"+90%"``, ``"+80%"``, ``"-90%"`` (DomainBed's
  names): the colour agrees with the label in 90 %, 80 %, 10 % of a domain's examples;
* an image has 2 channels: channel ``colour`` holds the digit, the other is zero.

The label and colour draws use the same generator as the shuffle, after it, domain by domain in
the order above (label flips of the domain's canonical order, then its colour flips), so the whole
dataset is a function of ``data_seed``. :meth:`ColoredDigits.load` scales pixels to [0, 1]
(``/16``, DomainBed's ``/255``), upsamples 8x8 -> 28x28 with bilinear interpolation
(``align_corners=False``, as ``rotated-digits``) and zeroes the other channel; no normalisation
(DomainBed applies none to ColoredMNIST). ``input_shape`` is ``(2, 28, 28)``.

:meth:`labels` and :meth:`colors` need neither torch nor sklearn; torch is imported inside
:meth:`load` only.
"""

from __future__ import annotations

import numpy as np

from .base import DatasetInfo, DomainDataset
from .digits import read_digits

# DomainBed's ColoredMNIST: (domain name, probability that the colour is flipped away from the label)
ENVIRONMENTS: tuple[tuple[str, float], ...] = (("+90%", 0.1), ("+80%", 0.2), ("-90%", 0.9))
LABEL_NOISE = 0.25
SIZE = 28


def upsample(images: np.ndarray) -> np.ndarray:
    """8x8 digits (0..16) -> float32 ``(n, 28, 28)`` in [0, 1] (bilinear, ``align_corners=False``)."""
    # lazy: keeps torch out of this module's import
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.asarray(images, dtype=np.float32).reshape(-1, 1, 8, 8) / 16.0)
    if x.shape[0] == 0:
        return np.zeros((0, SIZE, SIZE), dtype=np.float32)
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return np.ascontiguousarray(x[:, 0].numpy(), dtype=np.float32)


def colorize(gray: np.ndarray, colors: np.ndarray) -> np.ndarray:
    """``(n, H, W)`` grey images and 0/1 colours -> ``(n, 2, H, W)``: channel ``colour`` holds the image."""
    gray = np.asarray(gray, dtype=np.float32)
    out = np.zeros((gray.shape[0], 2, *gray.shape[1:]), dtype=np.float32)
    rows = np.arange(gray.shape[0])
    out[rows, np.asarray(colors, dtype=np.int64)] = gray
    return out


class ColoredDigits(DomainDataset):
    def __init__(self, data_seed: int = 0):
        self.data_seed = int(data_seed)
        self._images, digits = read_digits()
        rng = np.random.default_rng(self.data_seed)
        perm = rng.permutation(len(digits))
        names = tuple(n for n, _ in ENVIRONMENTS)
        self._members: dict[str, np.ndarray] = {}
        self._labels: dict[str, np.ndarray] = {}
        self._colors: dict[str, np.ndarray] = {}
        for i, (name, flip_color) in enumerate(ENVIRONMENTS):
            members = np.sort(perm[i::len(ENVIRONMENTS)]).astype(np.int64)
            clean = (digits[members] < 5).astype(np.int64)
            labels = clean ^ (rng.random(len(members)) < LABEL_NOISE).astype(np.int64)
            colors = labels ^ (rng.random(len(members)) < flip_color).astype(np.int64)
            self._members[name], self._labels[name], self._colors[name] = members, labels, colors
        self.info = DatasetInfo(name="colored-digits", domains=names, classes=("0", "1"),
                                input_shape=(2, SIZE, SIZE), default_model="cnn", default_setting="fdg")

    members = DomainDataset.per_domain("_members", "Original sklearn indices of ``domain``'s examples, in "
                                                   "canonical order.")
    labels = DomainDataset.per_domain("_labels", "int64 labels of ``domain``'s examples (with the label noise).")
    colors = DomainDataset.per_domain("_colors", "The colour (0/1: the channel holding the digit) of each of "
                                                 "``domain``'s examples.")

    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.check_domain(domain)
        m = self._members[domain]
        idx = self.check_indices(domain, indices, len(m))
        x = colorize(upsample(self._images[m[idx]]), self._colors[domain][idx])
        return x, self._labels[domain][idx].copy()
