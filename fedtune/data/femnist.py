"""FEMNIST as Bai et al.'s FedDG benchmark lays it out: writers as domains, WILDS' split columns.

``DATA_ROOT/femnist_v1.0/`` holds the images and ``metadata.csv`` (their ``resources/femnist_v1.0/``,
beside their archive of the images; the ``wilds`` package has no FEMNIST, so fedtune reads their
columns with the standard library's ``csv``): ``path`` (relative to ``femnist_v1.0/``), ``split``
(train / val / test / id_val / id_test), ``y`` (62 classes: digits, upper- and lower-case letters)
and ``domain_remapped`` (the writer). Domains are ``writer_<domain_remapped>`` in numeric order;
inside a domain examples keep the file's order. Images are decoded once into the image cache at
``image_size`` (default 28, theirs) as RGB: their grey images become three equal channels (their
loader converts to one channel, ``"L"``; fedtune's image path is RGB: docs/methods-protocol.md §5.1b).
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from fedtune.errors import ConfigError, DataError, shown

from .base import DatasetInfo, Pieces
from .cache_lock import DEFAULT_WAIT_S
from .folder import CachedImageDataset
from .split_file import SPLITS, pieces_by_split

FOLDER = "femnist_v1.0"
NUM_CLASSES = 62
IMAGE_SIZE = 28
COLUMNS = ("path", "split", "y", "domain_remapped")
MAX_METADATA_BYTES = 512 * 2**20
DESCRIPTION = ("FEMNIST as Bai et al.'s FedDG benchmark lays it out (femnist_v1.0/metadata.csv): writers as "
               "domains, 62 classes, 28 px, WILDS' splits (split_scheme official)")


class FemnistDataset(CachedImageDataset):
    """``DATA_ROOT/femnist_v1.0`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, *, image_size: int | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_key: str = "stat",
                 cache_wait_s: float = DEFAULT_WAIT_S):
        self.root = Path(root) / FOLDER
        meta = self.root / "metadata.csv"
        if not meta.is_file():
            raise DataError(f"dataset 'femnist': {str(meta)!r} does not exist; data_root must hold {FOLDER}/ with "
                            "metadata.csv and the images it lists (Bai et al.'s archive, with their "
                            "resources/femnist_v1.0/ files from github.com/inouye-lab/FedDG_Benchmark); nothing is "
                            "downloaded at run time")
        self._init_cache(cache_dir, cache_key, cache_wait_s, image_size, default_size=IMAGE_SIZE)
        rows = _read(meta)
        by_writer: dict[int, list[int]] = {}
        for k, r in enumerate(rows):
            by_writer.setdefault(r[3], []).append(k)
        self._files, self._labels, self._split = {}, {}, {}
        for w in sorted(by_writer):
            d, ks = f"writer_{w}", by_writer[w]
            self._files[d] = [rows[k][0] for k in ks]
            self._labels[d] = np.array([rows[k][2] for k in ks], dtype=np.int64)
            self._split[d] = np.array([SPLITS.index(rows[k][1]) for k in ks], dtype=np.int64)
        self.info = DatasetInfo(name="femnist", domains=tuple(self._files),
                                classes=tuple(str(c) for c in range(NUM_CLASSES)),
                                input_shape=(3, self.image_size, self.image_size), default_model="cnn",
                                default_setting="fdg")

    def _file_root(self, domain: str) -> Path:
        return self.root

    def split_pieces(self, scheme: str) -> dict[str, Pieces]:
        """The file's splits (scheme ``official`` only) as split name -> (domain -> sorted indices)."""
        if scheme != "official":
            raise ConfigError(f"field 'split_scheme': {shown(scheme, 40)} is not a split scheme of dataset 'femnist'; "
                              "allowed: official, or null (leave-one-domain-out over its writers)")
        return pieces_by_split(self._split, {name: code for code, name in enumerate(SPLITS)},
                               f"dataset 'femnist': {str(self.root / 'metadata.csv')!r}")


def _read(meta: Path) -> list[tuple[str, str, int, int]]:
    """``(path, split, y, writer)`` per row, or one DataError naming the file and line."""
    if meta.stat().st_size > MAX_METADATA_BYTES:
        raise DataError(f"{str(meta)!r} is larger than {MAX_METADATA_BYTES} bytes")
    reader = csv.DictReader(io.StringIO(meta.read_text(encoding="utf-8-sig"), newline=""))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{str(meta)!r} lacks column(s) {', '.join(missing)}; Bai et al.'s FEMNIST metadata has "
                        f"{', '.join(COLUMNS)}")
    out = []
    for line, r in enumerate(reader, start=2):
        split = (r["split"] or "").strip()
        try:
            y, w = int(r["y"]), int(r["domain_remapped"])
        except (TypeError, ValueError):
            raise DataError(f"{str(meta)!r} line {line}: y and domain_remapped must be whole numbers, got "
                            f"{shown(r['y'], 20)} and {shown(r['domain_remapped'], 20)}") from None
        if split not in SPLITS or not 0 <= y < NUM_CLASSES:
            raise DataError(f"{str(meta)!r} line {line}: split {shown(split, 20)} / y {y} not allowed; allowed: "
                            f"split one of {', '.join(SPLITS)}, y in 0..{NUM_CLASSES - 1}")
        out.append(((r["path"] or "").strip().replace("\\", "/"), split, y, w))
    if not out:
        raise DataError(f"{str(meta)!r} has no rows")
    return out
