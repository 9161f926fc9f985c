"""``rect4``: FedOMG's Rect-4 toy dataset (FedOMG paper, Appendix C), re-created.

Binary 2-D classification with 4 domains ``d0..d3`` (one user each in FDG). Raw
coordinates ``(x, y)``; every domain is an axis-aligned rectangle of its own size and position
along the x axis, symmetric in y about 0 (so every domain spans the global boundary):

====== ================ ================ ============ ===========
domain x range          y range          local c_d    noise frac
====== ================ ================ ============ ===========
d0     [-12, -4]        [-2, 2]          x = -8       0.20
d1     [-5, 1]          [-4, 4]          x = -2       0.25
d2     [0, 4]           [-6, 6]          x = 2        0.30
d3     [5, 13]          [-3, 3]          x = 9        0.25
====== ================ ================ ============ ===========

* Points are uniform in their rectangle, :data:`POINTS_PER_DOMAIN` (500) per domain, drawn from
  a Generator seeded by ``(data_seed, domain number)``.
* The GLOBAL label is ``y > 0`` (class 1 = "pos"): the boundary shared by all domains is y = 0.
* Each domain also has a LOCAL boundary ``x = c_d`` (orthogonal to the global one, at the
  centre of its rectangle). Exactly ``round(noise * 500)`` points, chosen at random, are
  labelled by the local rule ``x > c_d`` instead of the global one ("noisy" points). About half
  of those disagree with the global label, so a client trained alone is pulled towards its
  local boundary while the global boundary stays the majority rule everywhere.
* Features are standardised with FIXED constants (not data statistics, so nothing leaks
  between domains): ``features = (x / 8, y / 4)``. Scaling keeps y = 0 as the global boundary.
  ``input_shape`` is ``(2,)``; classes ``("neg", "pos")``.
"""

from __future__ import annotations

import numpy as np

from ._util import rng_for
from .base import DatasetInfo, DomainDataset

POINTS_PER_DOMAIN = 500
# name: (x_lo, x_hi, y_half_height, local boundary c_d, noise fraction)
DOMAINS: dict[str, tuple[float, float, float, float, float]] = {
    "d0": (-12.0, -4.0, 2.0, -8.0, 0.20),
    "d1": (-5.0, 1.0, 4.0, -2.0, 0.25),
    "d2": (0.0, 4.0, 6.0, 2.0, 0.30),
    "d3": (5.0, 13.0, 3.0, 9.0, 0.25),
}
X_SCALE, Y_SCALE = 8.0, 4.0


class Rect4(DomainDataset):
    def __init__(self, data_seed: int = 0):
        self.data_seed = int(data_seed)
        self._x: dict[str, np.ndarray] = {}
        self._y: dict[str, np.ndarray] = {}
        self._raw: dict[str, np.ndarray] = {}
        self._noisy: dict[str, np.ndarray] = {}
        for k, (name, (x_lo, x_hi, h, c, noise)) in enumerate(DOMAINS.items()):
            rng = rng_for(self.data_seed, "rect4", k)
            n = POINTS_PER_DOMAIN
            raw = np.stack([rng.uniform(x_lo, x_hi, n), rng.uniform(-h, h, n)], axis=1)
            noisy = np.zeros(n, dtype=bool)
            noisy[rng.choice(n, int(round(noise * n)), replace=False)] = True
            y = np.where(noisy, raw[:, 0] > c, raw[:, 1] > 0).astype(np.int64)
            self._raw[name] = raw
            self._noisy[name] = noisy
            self._y[name] = y
            self._x[name] = np.ascontiguousarray(
                (raw / np.array([X_SCALE, Y_SCALE])).astype(np.float32)
            )
        self.info = DatasetInfo(name="rect4", domains=tuple(DOMAINS), classes=("neg", "pos"), input_shape=(2,),
                                default_model="mlp", default_setting="fdg")

    raw_points = DomainDataset.per_domain("_raw", "Unscaled ``(x, y)`` coordinates of ``domain`` (for plots and "
                                                  "tests).")
    noisy_mask = DomainDataset.per_domain("_noisy", "True where a point is labelled by the local boundary instead of "
                                                    "the global one.")
    labels = DomainDataset.per_domain("_y", "int64 labels of ``domain``'s points.")

    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.check_domain(domain)
        idx = self.check_indices(domain, indices, POINTS_PER_DOMAIN)
        return np.ascontiguousarray(self._x[domain][idx]), self._y[domain][idx].copy()
