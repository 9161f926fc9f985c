"""Small shared helpers of the data layer (numpy only; never imports torch)."""

from __future__ import annotations

import zlib

import numpy as np

from fedtune.errors import DataError, shown


def rng_for(seed: int, *keys: int | str) -> np.random.Generator:
    """A Generator derived from ``seed`` and a path of keys (strings are hashed stably).

    Separate streams per purpose/domain keep a plan stable when unrelated inputs change, and
    never touch numpy's global RNG.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")
    words = [int(seed)]
    for k in keys:
        words.append(zlib.crc32(k.encode("utf-8")) if isinstance(k, str) else int(k))
    return np.random.default_rng(np.random.SeedSequence(words))


def as_index(idx) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(idx, dtype=np.int64))


def check_indices(indices, n: int, where: str) -> np.ndarray:
    idx = as_index(indices)
    if idx.ndim != 1:
        raise DataError(f"{where}: indices must be 1-D, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise DataError(f"{where}: indices must lie in [0, {n}), got [{idx.min()}, {idx.max()}]")
    return idx


def check_domain(domains: tuple[str, ...], domain: str, dataset: str) -> None:
    if domain not in domains:
        raise DataError(
            f"domain {shown(domain)} is not in dataset {dataset!r}; choose one of: {', '.join(domains)}"
        )
