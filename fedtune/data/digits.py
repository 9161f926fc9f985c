"""``rotated-digits``: the embedded default dataset (no download, no data root).

scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes, pixel values 0..16)
in the style of DomainBed's RotatedMNIST:

* the 1797 images are shuffled with ``np.random.default_rng(data_seed)`` and split into 6
  disjoint, near-equal subsets (300, 300, 300, 299, 299, 299), one per domain; inside a domain
  the canonical order is by original sklearn index;
* the domains are named after their rotation in degrees: ``"0", "15", "30", "45", "60", "75"``;
* :meth:`RotatedDigits.load` scales pixels to [0, 1] (``/16``), upsamples 8x8 -> 28x28 with
  bilinear interpolation (``align_corners=False``), rotates by the domain's angle
  (counter-clockwise, bilinear, fill 0, about the image centre) and normalises with
  ``(x - 0.5) / 0.5`` (so background is -1). ``input_shape`` is ``(1, 28, 28)``.

The CSV is read straight from sklearn's package directory, so neither sklearn nor torch is
imported for :meth:`labels`; torch (not torchvision) is imported inside :meth:`load` only.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
import math

import numpy as np

from .base import DatasetInfo, DomainDataset

ANGLES: tuple[int, ...] = (0, 15, 30, 45, 60, 75)
SIZE = 28


def _digits_csv() -> Path | None:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if p.is_file():
            return p
    return None


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 sklearn digits: ``(images uint8 (1797, 8, 8) in 0..16, labels int64)``."""
    path = _digits_csv()
    if path is not None:
        with gzip.open(path, "rt") as f:
            arr = np.loadtxt(f, delimiter=",", dtype=np.float64)
        images, labels = arr[:, :64], arr[:, 64]
    else:  # pragma: no cover - only when sklearn's data file moved
        from sklearn.datasets import load_digits  # lazy: keeps pyarrow, pandas out of this module's import

        d = load_digits()
        images, labels = d.data, d.target
    return (
        np.ascontiguousarray(images.reshape(-1, 8, 8).astype(np.uint8)),
        np.ascontiguousarray(labels.astype(np.int64)),
    )


def render(images: np.ndarray, angle: float) -> np.ndarray:
    """8x8 digits (0..16) -> normalised float32 ``(n, 1, 28, 28)`` rotated by ``angle`` degrees."""
    # lazy: keeps torch out of this module's import
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.asarray(images, dtype=np.float32).reshape(-1, 1, 8, 8) / 16.0)
    if x.shape[0] == 0:
        return np.zeros((0, 1, SIZE, SIZE), dtype=np.float32)
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    if angle:
        # Counter-clockwise rotation about the centre, bilinear, zeros outside: plain torch
        # (torchvision's rotate would cost each actor a ~2 s torchvision import).
        a = math.radians(float(angle))
        c, s = math.cos(a), math.sin(a)
        theta = torch.tensor([[c, -s, 0.0], [s, c, 0.0]], dtype=x.dtype).expand(x.shape[0], 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    x = (x - 0.5) / 0.5
    return np.ascontiguousarray(x.numpy(), dtype=np.float32)


class RotatedDigits(DomainDataset):
    def __init__(self, data_seed: int = 0):
        self.data_seed = int(data_seed)
        self._images, self._labels = read_digits()
        perm = np.random.default_rng(self.data_seed).permutation(len(self._labels))
        chunks = np.array_split(perm, len(ANGLES))
        names = tuple(str(a) for a in ANGLES)
        self._angle = dict(zip(names, ANGLES))
        # domain -> sorted original sklearn indices of its members
        self._members = {n: np.sort(c).astype(np.int64) for n, c in zip(names, chunks)}
        self.info = DatasetInfo(name="rotated-digits", domains=names, classes=tuple(str(i) for i in range(10)),
                                input_shape=(1, SIZE, SIZE), default_model="cnn", default_setting="fdg")

    members = DomainDataset.per_domain("_members", "Original sklearn indices of ``domain``'s examples, in "
                                                   "canonical order.")

    def labels(self, domain: str) -> np.ndarray:
        self.check_domain(domain)
        return self._labels[self._members[domain]].copy()

    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.check_domain(domain)
        m = self._members[domain]
        idx = self.check_indices(domain, indices, len(m))
        src = m[idx]
        return render(self._images[src], self._angle[domain]), self._labels[src].copy()
