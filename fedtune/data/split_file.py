"""Split files in WILDS' on-disk layout: which image is train, OOD validation, OOD test, ID
validation or ID test (the protocol of WILDS and of Bai et al.'s FedDG benchmark, ICLR 2024).

A split file is a CSV in the folder that holds the dataset's domain folders: ``metadata.csv`` for
the scheme ``official`` and ``<scheme>.csv`` for any other scheme, exactly as Bai et al.'s
``PACS`` dataset class reads them (``src/datasets.py``; their PACS files are
``resources/pacs_v1.0/``: ``metadata.csv`` trains on cartoon and sketch, validates on
art_painting, tests on photo; ``pac-s.csv`` trains on photo, art_painting and cartoon and tests on
sketch; ...). Each row needs two columns:

* ``path``: the image, relative to that folder (``<domain>/<class>/<file>``, ``/`` separators);
* ``split``: one of :data:`SPLITS`. ``train`` is what the source clients train on; ``val`` the OOD
  validation domain(s) (``ood_val_acc``, selection protocol ``ood-val``); ``test`` the OOD test
  domain(s) (``target_acc``); ``id_val`` / ``id_test`` held-out examples of the training domains
  (``val_acc``, selection protocol ``val``; ``id_test_acc``).

A path with no such image matches the one image of the same folder and name with another image
extension (``sketch/dog/5281.png`` -> ``sketch/dog/5281.jpg``: a copy of the dataset re-encoded, as a
resized PACS often is); two such images are an error. Other columns (``domain``, ``y``, ``category``,
the unnamed index) are ignored: the domain and the
label come from the image's folders, as for every folder dataset. An image of the dataset that the
file does not list takes part in nothing. The reader is the standard library's ``csv`` module: the
file is a table of two string columns, and WILDS' own reader (``wilds.datasets``) would need pandas
and a dataset class per file, while fedtune's folder dataset already knows every image.

>>> sorted(SPLITS)
['id_test', 'id_val', 'test', 'train', 'val']
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

import numpy as np

from fedtune.errors import ConfigError, DataError, shown

from .base import Pieces

SPLITS: tuple[str, ...] = ("train", "val", "test", "id_val", "id_test")
"""The split names of a WILDS split file (WILDS' ``_split_dict``)."""

MAX_SPLIT_FILE_BYTES = 64 * 2**20
"""A split file larger than this is refused (64 MiB: iWildCam's metadata is 23 MiB)."""

SCHEME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
GET_THEM = ("the FedDG benchmark's PACS split files are resources/pacs_v1.0/*.csv in "
            "github.com/inouye-lab/FedDG_Benchmark (metadata.csv is the scheme 'official'); "
            "copy them beside the domain folders")


def pieces_by_split(codes: dict[str, np.ndarray], code_of: dict[str, int], where: str) -> dict[str, Pieces]:
    """Split name -> (domain -> sorted positions) for every name in :data:`SPLITS`, from each domain's
    per-example split codes (``code_of``: split name -> code; a split without one is empty); a
    DataError naming ``where`` when there are no ``train`` or no ``test`` examples.

    >>> pieces_by_split({"a": np.array([0, 2, 0])}, {"train": 0, "test": 2}, "x")["train"]
    {'a': array([0, 2])}
    """
    out: dict[str, Pieces] = {}
    for name in SPLITS:
        code = code_of.get(name)
        hits = {d: np.flatnonzero(c == code).astype(np.int64) for d, c in codes.items()} if code is not None else {}
        out[name] = {d: pos for d, pos in hits.items() if len(pos)}
    for need in ("train", "test"):
        if not out[need]:
            raise DataError(f"{where} has no '{need}' examples; a split scheme needs training examples and an "
                            "OOD test split")
    return out


def split_file_path(root: str | Path, scheme: str) -> Path:
    """The CSV that ``scheme`` names in ``root``: ``metadata.csv`` for ``official``, else ``<scheme>.csv``.

    >>> split_file_path("/data/PACS", "official").name, split_file_path("/data/PACS", "pac-s").name
    ('metadata.csv', 'pac-s.csv')
    """
    check_scheme(scheme)
    return Path(root) / ("metadata.csv" if scheme == "official" else f"{scheme}.csv")


def check_scheme(scheme: object) -> str:
    """``scheme`` if it names a file (letters, digits, ``_ . -``; no path), else one ConfigError line."""
    if not isinstance(scheme, str) or not SCHEME_PATTERN.match(scheme) or scheme.endswith(".csv"):
        raise ConfigError(f"field 'split_scheme': {shown(scheme, 60)} is not allowed; allowed: official (reads "
                        "metadata.csv) or the name of a CSV beside it without '.csv' (letters, digits, _ . -), "
                        "or null (leave-one-domain-out)")
    return scheme


def read_split_file(root: str | Path, scheme: str, domains: tuple[str, ...] | list[str],
                    files: dict[str, list[str]]) -> dict[str, Pieces]:
    """The examples of every split of ``scheme``: split name -> (domain -> sorted int64 indices into
    the domain's canonical order), for every name in :data:`SPLITS` (empty Pieces when the file has
    none). ``files``: each domain's images as ``<class>/<file>`` in canonical order
    (:meth:`fedtune.data.folder.ImageFolderDataset.files`). Every problem is one DataError naming the
    file (and the row): a missing file, one larger than :data:`MAX_SPLIT_FILE_BYTES`, a missing column,
    an unknown split, a path that is not an image of the dataset, an image listed twice, no ``train``
    or no ``test`` rows, or a domain in both ``train`` and ``test``."""
    path = split_file_path(root, scheme)
    if not path.is_file():
        raise DataError(f"field 'split_scheme': {scheme!r} reads {str(path)!r}, which does not exist; {GET_THEM} "
                        f"({', '.join(domains)} must be folders there)")
    size = path.stat().st_size
    if size > MAX_SPLIT_FILE_BYTES:
        raise DataError(f"split file {str(path)!r} is {size} bytes; allowed: at most {MAX_SPLIT_FILE_BYTES}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read split file {str(path)!r}: {e}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in ("path", "split") if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"split file {str(path)!r} lacks column(s) {', '.join(missing)}; a WILDS split file has a "
                        f"'path' (<domain>/<class>/<file>) and a 'split' ({', '.join(SPLITS)}) column")
    where = {f"{d}/{rel}": (d, i) for d in domains for i, rel in enumerate(files[d])}
    by_stem: dict[str, tuple[str, int] | None] = {}  # re-encoded copies: the same name, another extension
    for key, hit in where.items():
        stem = os.path.splitext(key)[0]
        by_stem[stem] = None if stem in by_stem else hit
    chosen: dict[str, dict[str, list[int]]] = {s: {} for s in SPLITS}
    seen: dict[tuple[str, int], int] = {}
    for line, row in enumerate(reader, start=2):
        split = (row.get("split") or "").strip()
        if split not in chosen:
            raise DataError(f"split file {str(path)!r} line {line}: split {shown(split, 40)} is not allowed; "
                            f"allowed: {', '.join(SPLITS)}")
        rel = (row.get("path") or "").strip().replace("\\", "/")
        while rel.startswith("./"):
            rel = rel[2:]
        hit = where.get(rel) or by_stem.get(os.path.splitext(rel)[0])
        if hit is None:
            raise DataError(f"split file {str(path)!r} line {line}: path {shown(rel, 80)} is not an image of "
                            f"{str(root)!r} (expected <domain>/<class>/<file> with domain one of: {', '.join(domains)})")
        d, i = hit
        if hit in seen:
            raise DataError(f"split file {str(path)!r} line {line}: image {d + '/' + files[d][i]!r} is listed twice "
                            f"(first on line {seen[hit]}); every image belongs to at most one split")
        seen[hit] = line
        chosen[split].setdefault(d, []).append(i)
    out = {s: {d: np.sort(np.asarray(v, dtype=np.int64)) for d, v in sorted(chosen[s].items(),
                                                                          key=lambda kv: domains.index(kv[0]))}
           for s in SPLITS}
    for need in ("train", "test"):
        if not out[need]:
            raise DataError(f"split file {str(path)!r} has no '{need}' rows; a split scheme needs training "
                            "examples and an OOD test split")
    both = sorted(set(out["train"]) & set(out["test"]))
    if both:
        raise DataError(f"split file {str(path)!r}: domain(s) {', '.join(both)} are in both 'train' and 'test'; "
                        "the OOD test split must hold domains no client trains on (ID examples are 'id_test')")
    return out
