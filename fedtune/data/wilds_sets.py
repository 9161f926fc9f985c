"""WILDS image datasets from a local copy, read by the ``wilds`` package (pip ``wilds``; fedtune's
``wilds`` extra): Camelyon17 (hospitals), iWildCam (camera locations) and CelebA (Bai et al.'s
groups: male x blond), the image datasets of Bai et al.'s FedDG benchmark besides PACS (FEMNIST is
theirs, not WILDS': not read here).

``DATA_ROOT`` is WILDS' ``root_dir``: it holds ``camelyon17_v1.0/``, ``iwildcam_v2.0/`` or
``celebA_v1.0/`` as WILDS' archives extract them (each with its ``RELEASE_v*.txt``). Nothing is
downloaded: ``wilds.get_dataset(..., download=False)`` reads the copy, and a missing folder is one
line naming the files expected where (WILDS' own download host has been failing for months:
wilds issues #169-#175). The package's import-time version check, which asks PyPI from a thread,
is kept from running.

What fedtune takes from the ``wilds`` dataset object: its labels (``y_array``), its metadata
(``metadata_array``, ``metadata_fields``) for the domains, its splits (``split_array``,
``split_dict``: the WILDS protocol, ``split_scheme``) and its image reader (``get_input``), whose
images are decoded once per node into fedtune's image cache (:mod:`fedtune.data.cache`) at
``image_size``. A domain is one value of the dataset's domain fields (:data:`WILDS_SETS`), named
``<field>_<value>`` (``hospital_2``; CelebA ``male_1-y_0``); inside a domain, examples keep WILDS'
order. The cache key reads each image file's ``stat``, so fedtune also names the files, from WILDS'
private ``_input_array`` and each dataset's folder (:attr:`WildsSpec.file_prefix`), checked against
``get_input`` by the tests.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
import csv
import warnings

import numpy as np

from fedtune.errors import ConfigError, DataError, shown

from .base import DatasetInfo, Pieces
from .cache_lock import DEFAULT_WAIT_S
from .folder import CachedImageDataset
from .split_file import pieces_by_split


@dataclass(frozen=True)
class WildsSpec:
    """How fedtune reads one WILDS dataset."""

    wilds_name: str  # wilds.get_dataset's name
    folder: str  # under DATA_ROOT, as WILDS' archive extracts it
    domain_fields: tuple[str, ...]  # metadata fields whose values are the domains (Bai et al.'s _domain_fields)
    image_size: int  # default image_size: the resolution Bai et al. train at
    file_prefix: str  # the folder get_input reads _input_array's names from, under the dataset folder
    expected: tuple[str, ...]  # what the folder must hold
    schemes: tuple[str, ...]  # WILDS' split schemes of the dataset
    description: str
    tables: tuple[tuple[str, tuple[str, ...]], ...] = ()  # each CSV the package reads, and the columns it reads


WILDS_SETS: dict[str, WildsSpec] = {
    "camelyon17": WildsSpec(
        "camelyon17", "camelyon17_v1.0", ("hospital",), 96, "", ("RELEASE_v1.0.txt", "metadata.csv", "patches/"),
        ("official", "mixed-to-test"),
        "Camelyon17-WILDS (wilds package): 5 hospital domains, tumour or not in 96 px patches; WILDS splits "
        "(split_scheme official: train hospitals 0, 3, 4, OOD val 1, OOD test 2)",
        (("metadata.csv", ("patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split")),)),
    "iwildcam": WildsSpec(
        "iwildcam", "iwildcam_v2.0", ("location",), 448, "train/", ("RELEASE_v2.0.txt", "metadata.csv", "train/"),
        ("official",),
        "iWildCam2020-WILDS (wilds package): 323 camera-location domains, 182 species, 448 px",
        (("metadata.csv", ("split", "location_remapped", "sequence_remapped", "datetime", "y", "filename")),)),
    "celeba": WildsSpec(
        "celebA", "celebA_v1.0", ("male", "y"), 96, "img_align_celeba/",
        ("RELEASE_v1.0.txt", "list_attr_celeba.csv", "list_eval_partition.csv", "img_align_celeba/"),
        ("official",),
        "CelebA (wilds package): blond hair or not, 4 domains male x blond (Bai et al.'s groups), 96 px",
        (("list_attr_celeba.csv", ("image_id", "Male", "Blond_Hair")), ("list_eval_partition.csv", ("partition",)))),
}
"""The WILDS datasets fedtune reads, by fedtune's name."""


def import_wilds():
    """The ``wilds`` package, imported without its version check (a thread asking PyPI), or one line
    saying how to install it."""
    os.environ.setdefault("OUTDATED_IGNORE", "1")
    saved = sys.modules.get("outdated", None)
    had = "outdated" in sys.modules
    sys.modules["outdated"] = None  # type: ignore[assignment]  # `from outdated import ...` -> ImportError
    try:
        import wilds  # lazy: keeps wilds out of this module's import
    except ImportError as e:
        raise DataError(f"the WILDS datasets ({', '.join(WILDS_SETS)}) are read by the wilds package, which is "
                        f"not installed here ({e}); pip install 'fedtune[wilds]'") from None
    finally:
        if had:
            sys.modules["outdated"] = saved  # type: ignore[assignment]
        else:
            del sys.modules["outdated"]
    return wilds


def check_copy(name: str, root: str | os.PathLike) -> Path:
    """The dataset's folder under ``root``, or one DataError line naming what is missing where."""
    spec = WILDS_SETS[name]
    folder = Path(root) / spec.folder
    missing = [f for f in spec.expected if not (folder / f.rstrip("/")).exists()]
    if missing:
        raise DataError(f"dataset {name!r}: {str(folder)!r} lacks {', '.join(missing)}; data_root must hold "
                        f"{spec.folder}/ as WILDS' archive extracts it ({', '.join(spec.expected)}); nothing is "
                        "downloaded at run time: get the archive from https://wilds.stanford.edu/downloads "
                        f"(or a mirror) and extract it into {str(Path(root))!r}")
    for table, columns in spec.tables:
        check_metadata_file(name, folder / table, columns)
    return folder


def check_metadata_file(name: str, path: Path, columns: tuple[str, ...]) -> None:
    """One DataError line naming ``path`` unless its header has ``columns`` and a row follows it (what
    the wilds package reads; it would fail on a file without rows with a traceback about tensor types).
    Reads the header and the first row only."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            rows = csv.reader(fh)
            header = [c.strip() for c in next(rows, [])]
            first = next((r for r in rows if any(c.strip() for c in r)), None)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"dataset {name!r}: cannot read {str(path)!r}: {type(e).__name__}: {e}") from None
    if not any(header):
        raise DataError(f"dataset {name!r}: {str(path)!r} is empty; WILDS' file has a header row with "
                        f"{', '.join(columns)} and one image a row (extract the archive again)")
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"dataset {name!r}: {str(path)!r} lacks column(s) {', '.join(missing)}; WILDS' file has a "
                        f"header row with {', '.join(columns)} (found: {shown(', '.join(header), 200)})")
    if first is None:
        raise DataError(f"dataset {name!r}: {str(path)!r} has a header but no rows; WILDS' file lists one image a "
                        "row (a truncated or emptied copy: extract the archive again)")


def _domain_name(fields: tuple[str, ...], values: tuple[int, ...]) -> str:
    """``hospital_2``; ``male_1-y_0``.

    >>> _domain_name(("male", "y"), (1, 0))
    'male_1-y_0'
    """
    return "-".join(f"{f}_{v}" for f, v in zip(fields, values))


class WildsImageDataset(CachedImageDataset):
    """One WILDS image dataset as fedtune's domains (see the module docstring)."""

    def __init__(self, name: str, root: str | os.PathLike, *, image_size: int | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_key: str = "stat",
                 cache_wait_s: float = DEFAULT_WAIT_S):
        self.name, self.spec = name, WILDS_SETS[name]
        spec = self.spec
        self.root = check_copy(name, root)
        self.data_root = Path(root)
        self._init_cache(cache_dir, cache_key, cache_wait_s, image_size, default_size=spec.image_size)
        self._ds = self._open("official")
        fields = list(self._ds.metadata_fields)
        unknown = [f for f in spec.domain_fields if f not in fields]
        if unknown:  # a wilds release that renamed them: say so, never guess
            raise DataError(f"dataset {name!r}: the wilds package's metadata has no field(s) {', '.join(unknown)} "
                            f"(it has: {', '.join(fields)}); fedtune reads wilds 2.0")
        meta = np.asarray(self._ds.metadata_array)[:, [fields.index(f) for f in spec.domain_fields]].astype(np.int64)
        y = np.asarray(self._ds.y_array).astype(np.int64).reshape(-1)
        names = np.asarray(self._ds._input_array)  # private: the file names, for the cache key (module docstring)
        keys = sorted({tuple(int(v) for v in row) for row in meta})
        self._ids: dict[str, np.ndarray] = {}
        self._files, self._labels = {}, {}
        for key in keys:
            d = _domain_name(spec.domain_fields, key)
            ids = np.flatnonzero((meta == np.asarray(key)).all(axis=1)).astype(np.int64)
            self._ids[d] = ids
            self._files[d] = [spec.file_prefix + str(n) for n in names[ids]]
            self._labels[d] = y[ids]
        n_classes = int(getattr(self._ds, "n_classes", None) or (int(y.max()) + 1))
        self.info = DatasetInfo(name=name, domains=tuple(self._ids), classes=tuple(str(k) for k in range(n_classes)),
                                input_shape=(3, self.image_size, self.image_size), default_model="cnn",
                                default_setting="fdg")

    def _open(self, scheme: str):
        wilds = import_wilds()
        try:
            with warnings.catch_warnings():  # torch's note on wilds' non-writable NumPy labels: not the user's
                warnings.simplefilter("ignore", UserWarning)
                return wilds.get_dataset(dataset=self.spec.wilds_name, root_dir=str(self.data_root), download=False,
                                         split_scheme=scheme)
        except (OSError, ValueError, KeyError, AssertionError, TypeError, RuntimeError, IndexError) as e:
            files = ", ".join(table for table, _ in self.spec.tables)
            raise DataError(f"dataset {self.name!r}: the wilds package cannot read {str(self.root)!r} ({files}): "
                            f"{type(e).__name__}: {shown(str(e), 300)}") from None

    @property
    def info_name(self) -> str:
        return next(k for k, v in WILDS_SETS.items() if v is self.spec)

    def _file_root(self, domain: str) -> Path:
        return self.root

    def _decoder(self, domain: str):
        ids, size, ds = self._ids[domain], self.image_size, self._ds

        def decode(i: int, out: np.ndarray) -> None:
            from PIL import Image  # lazy: keeps PIL out of this module's import

            try:
                with ds.get_input(int(ids[i])) as im:
                    im = im.convert("RGB")
                    if im.size != (size, size):
                        im = im.resize((size, size), Image.BILINEAR)
                    out[...] = np.asarray(im, dtype=np.uint8)
            except (OSError, SyntaxError, ValueError, EOFError) as e:
                raise DataError(f"cannot decode image {str(self.root / self._files[domain][i])!r}: "
                                f"{type(e).__name__}: {e}") from None

        return decode

    def split_pieces(self, scheme: str) -> dict[str, Pieces]:
        """WILDS' splits under ``scheme`` (:data:`WildsSpec.schemes`) as split name -> (domain -> sorted
        indices into the domain), for every name in :data:`fedtune.data.split_file.SPLITS`."""
        if scheme not in self.spec.schemes:
            raise ConfigError(f"field 'split_scheme': {shown(scheme, 40)} is not a split scheme of dataset "
                              f"{self.name!r}; allowed: {', '.join(self.spec.schemes)}, or null "
                              "(leave-one-domain-out over its domains)")
        ds = self._ds if scheme == "official" else self._open(scheme)
        split = np.asarray(ds.split_array).astype(np.int64)
        return pieces_by_split({d: split[ids] for d, ids in self._ids.items()}, dict(ds.split_dict),
                               f"dataset {self.name!r}, split scheme {scheme!r},")
