"""Small copies of WILDS datasets in WILDS' on-disk layout, for tests (the real ones are 1-12 GB):
the files the ``wilds`` package reads, with random images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def _image(path: Path, size: tuple[int, int], rng: np.random.Generator, label: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    img = np.clip(rng.normal(60 + 120 * label, 40, (size[1], size[0], 3)), 0, 255).astype("uint8")
    Image.fromarray(img).save(path)


def _write(path: Path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def camelyon17(root: Path, per_slide: int = 6) -> Path:
    """``root/camelyon17_v1.0``: hospitals (centers) 0-3, two slides each, ``per_slide`` 96 px patches a slide,
    labels alternating; split 0 (train) or 1 (id_val, every fourth patch); WILDS makes center 1 val, 2 test."""
    d = root / "camelyon17_v1.0"
    d.mkdir(parents=True)
    (d / "RELEASE_v1.0.txt").write_text("v1.0\n")
    rng = np.random.default_rng(0)
    rows = []
    for center in range(4):
        for s in range(2):
            slide, patient, node = center * 2 + s, f"{center * 2 + s:03d}", s
            for k in range(per_slide):
                x, y, tumor = 32 * k, 64 * s, k % 2
                _image(d / "patches" / f"patient_{patient}_node_{node}" /
                       f"patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png", (96, 96), rng, tumor)
                rows.append([len(rows), patient, node, x, y, tumor, slide, center, 1 if k % 4 == 3 else 0])
    _write(d / "metadata.csv", ["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"], rows)
    return root


def iwildcam(root: Path) -> Path:
    """``root/iwildcam_v2.0``: 4 locations, 3 species, 12 images of 40x30 px a location; locations 0-1 train
    (with id_val / id_test rows), 2 val, 3 test."""
    d = root / "iwildcam_v2.0"
    (d / "train").mkdir(parents=True)
    (d / "RELEASE_v2.0.txt").write_text("v2.0\n")
    rng = np.random.default_rng(1)
    rows = []
    for loc, split in enumerate(("train", "train", "val", "test")):
        for k in range(12):
            y, name = k % 3, f"img_{loc}_{k}.jpg"
            _image(d / "train" / name, (40, 30), rng, y)
            s = split if split != "train" else {10: "id_val", 11: "id_test"}.get(k, "train")
            rows.append([s, loc, len(rows), f"2013-0{1 + loc}-0{1 + k % 9} 0{k % 10}:1{k % 10}:00.000", y, name])
    _write(d / "metadata.csv", ["split", "location_remapped", "sequence_remapped", "datetime", "y", "filename"], rows)
    return root


def celeba(root: Path, n: int = 40) -> Path:
    """``root/celebA_v1.0``: ``n`` images of 178x218 px, Male and Blond_Hair in all four combinations,
    partitions train / val / test (0 / 1 / 2) cycling."""
    d = root / "celebA_v1.0"
    (d / "img_align_celeba").mkdir(parents=True)
    (d / "RELEASE_v1.0.txt").write_text("v1.0\n")
    rng = np.random.default_rng(2)
    attrs, parts = [], []
    for i in range(n):
        name, male, blond = f"{i + 1:06d}.jpg", 1 if i % 2 else -1, 1 if (i // 2) % 2 else -1
        _image(d / "img_align_celeba" / name, (178, 218), rng, int(blond > 0))
        attrs.append([name, male, -1, blond])
        parts.append([name, (i // 4) % 3 if i >= 8 else 0])  # every group in every partition
    _write(d / "list_attr_celeba.csv", ["image_id", "Male", "Smiling", "Blond_Hair"], attrs)
    _write(d / "list_eval_partition.csv", ["image_id", "partition"], parts)
    return root


def femnist(root: Path, writers: int = 5, per_writer: int = 6) -> Path:
    """``root/femnist_v1.0`` in Bai et al.'s layout: ``metadata.csv`` (split, domain_remapped, y, path) and
    28 px grey PNGs; writers 0-2 train (last image id_val), 3 val, 4 test; labels cycle over 0, 10, 61."""
    from PIL import Image

    d = root / "femnist_v1.0"
    (d / "data").mkdir(parents=True)
    (d / "RELEASE_v1.0.txt").write_text("v1.0\n")
    rng = np.random.default_rng(3)
    rows = []
    for w in range(writers):
        split = ("train", "train", "train", "val", "test")[w]
        for k in range(per_writer):
            y, name = (0, 10, 61)[k % 3], f"data/w{w}_{k}.png"
            Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(d / name)
            s = "id_val" if split == "train" and k == per_writer - 1 else split
            rows.append([len(rows), s, w, y, name])
    _write(d / "metadata.csv", ["", "split", "domain_remapped", "y", "path"], rows)
    return root
