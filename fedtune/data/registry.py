"""Dataset registry: names -> :class:`DomainDataset` builders.

Importing this module (or :mod:`fedtune.data`) imports neither torch nor sklearn nor PIL; each
dataset module defers its heavy imports to the point where pixels are decoded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedtune.errors import DataError, shown

from fedtune.entry_points import load_entry_points
from fedtune.data.colored_digits import ColoredDigits
from fedtune.data.digits import RotatedDigits
from fedtune.data.femnist import FemnistDataset
from fedtune.data.folder import ImageFolderDataset
from fedtune.data.plugin_sets import build_plugin_dataset
from fedtune.data.rect4 import Rect4
from fedtune.data.tvsets import SPECS
from fedtune.data.tvsets import TorchvisionDataset
from fedtune.data.wilds_sets import WildsImageDataset

from .base import DatasetInfo, DomainDataset
from .cache_lock import DEFAULT_WAIT_S
from .femnist import DESCRIPTION as FEMNIST_DESCRIPTION
from .wilds_sets import WILDS_SETS


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    needs_root: bool


# DomainBed datasets: registry name -> (sub-directory of the data root, description)
DOMAINBED: dict[str, tuple[str, str]] = {
    "pacs": ("PACS", "PACS: 4 domains (art_painting, cartoon, photo, sketch), 7 classes"),
    "vlcs": ("VLCS", "VLCS: 4 domains (Caltech101, LabelMe, SUN09, VOC2007), 5 classes"),
    "office-home": ("office_home", "OfficeHome: 4 domains (Art, Clipart, Product, Real World), "
                                   "65 classes"),
    "terra-incognita": ("terra_incognita", "TerraIncognita: 4 camera-trap locations, 10 classes"),
    "domain-net": ("domain_net", "DomainNet: 6 domains, 345 classes"),
}

# What DomainBed's download script lays out: each dataset's domain folders and its number of classes.
DOMAINBED_LAYOUT: dict[str, tuple[tuple[str, ...], int]] = {
    "pacs": (("art_painting", "cartoon", "photo", "sketch"), 7),
    "vlcs": (("Caltech101", "LabelMe", "SUN09", "VOC2007"), 5),
    "office-home": (("Art", "Clipart", "Product", "Real World"), 65),
    "terra-incognita": (("location_100", "location_38", "location_43", "location_46"), 10),
    "domain-net": (("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), 345),
}

_TV_DESC = {
    "mnist": "MNIST (torchvision), one domain: 60k train + 10k test, 10 classes",
    "fashion-mnist": "Fashion-MNIST (torchvision), one domain: 60k train + 10k test, 10 classes",
    "emnist": "EMNIST split 'mnist' (torchvision), one domain: 60k train + 10k test, 10 classes",
    "cifar10": "CIFAR-10 (torchvision), one domain: 50k train + 10k test, 10 classes",
    "cifar100": "CIFAR-100 (torchvision), one domain: 50k train + 10k test, 100 classes",
}

_ENTRIES: tuple[DatasetEntry, ...] = (
    DatasetEntry("rotated-digits", "sklearn 8x8 digits upsampled to 28x28, 6 rotation domains "
                 "(0..75 degrees); embedded, no data root needed", False),
    DatasetEntry("colored-digits", "sklearn 8x8 digits upsampled to 28x28, DomainBed's ColoredMNIST: binary label "
                 "digit<5 with 25% label noise, 2 colour channels agreeing with the label 90/80/10% in domains "
                 "+90%/+80%/-90%; embedded, no data root needed", False),
    DatasetEntry("rect4", "FedOMG's Rect-4 toy: 4 domains of 2-D points, global boundary y=0, "
                 "noisy local boundaries; no data root needed", False),
    DatasetEntry("folder", "any image tree DATA_ROOT/<domain>/<class>/<image>", True),
    *(DatasetEntry(n, d, True) for n, (_, d) in DOMAINBED.items()),
    *(DatasetEntry(n, spec.description, True) for n, spec in WILDS_SETS.items()),
    DatasetEntry("femnist", FEMNIST_DESCRIPTION, True),
    *(DatasetEntry(n, d, True) for n, d in _TV_DESC.items()),
)
_BY_NAME = {e.name: e for e in _ENTRIES}

_FIXED_SIZE = {"rotated-digits": 28, "colored-digits": 28, "mnist": 28, "fashion-mnist": 28, "emnist": 28,
               "cifar10": 32, "cifar100": 32}


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset from outside fedtune (a plugin's; ``fedtune.register(DatasetSpec(...))``, docs/extending.md).

    ``name``: how configs name it (lower case, ``-`` between words). ``build``: called as
    ``build(root=..., image_size=..., data_seed=...)`` in every process that opens the dataset (the
    driver, each client actor), it returns the :class:`~fedtune.data.base.DomainDataset` (named
    domains, labels without decoding, ``load``) whose ``info.name`` is ``name``; ``root`` is the run's
    ``data_root`` (None when unset), ``image_size`` its ``image_size`` (None when unset: the dataset's
    own size; when set, the dataset's images must have that side), ``data_seed`` its ``data_seed``
    (seed any random construction from it). ``description``: one line for ``fedtune datasets``.
    ``needs_root``: a run without ``data_root`` is refused in one line. ``image_files``: its images
    are files decoded into fedtune's image cache, i.e. ``build`` returns a
    :class:`~fedtune.data.folder.CachedImageDataset`; the run's ``cache_dir``, ``cache_key`` and
    ``cache_wait_s`` then apply to it, ``augment: domainbed`` may augment it and ``fedtune run``
    reports what the cache does. ``split_schemes``: the ``split_scheme`` values its dataset's
    ``split_pieces(scheme)`` answers (split name -> domain -> indices, as
    :func:`fedtune.data.split_file.pieces_by_split` makes them); empty: ``split_scheme`` is refused."""

    name: str
    build: Callable[..., DomainDataset]
    description: str = ""
    needs_root: bool = False
    image_files: bool = False
    split_schemes: tuple[str, ...] = ()


_PLUGIN_DATASETS: dict[str, tuple[DatasetSpec, str]] = {}  # name -> (spec, who registered it)


def register_dataset(spec: DatasetSpec, owner: str) -> None:
    """Add a plugin's dataset (``owner`` names the plugin). The same spec again is a no-op; a name
    fedtune or another plugin has is one DataError naming both."""
    key = _key(spec.name)
    if key != spec.name or not key:
        raise DataError(f"{owner}: dataset name {shown(spec.name)} is not allowed; allowed: lower-case, with "
                        "'-' between words (it is how configs name it)")
    if key in _BY_NAME:
        if _PLUGIN_DATASETS.get(key, (None,))[0] == spec:
            return
        who = _PLUGIN_DATASETS[key][1] if key in _PLUGIN_DATASETS else "fedtune's built-in"
        raise DataError(f"{owner}: dataset {key!r} is {'already registered by ' if key in _PLUGIN_DATASETS else ''}"
                        f"{who}; allowed: a name of its own")
    if not callable(spec.build):
        raise DataError(f"{owner}: dataset {key!r}: build is not callable")
    if isinstance(spec.split_schemes, str) or not all(isinstance(x, str) and x for x in spec.split_schemes):
        raise DataError(f"{owner}: dataset {key!r}: split_schemes {shown(spec.split_schemes, 60)} is not allowed; "
                        "allowed: a tuple of scheme names, e.g. ('official',)")
    _PLUGIN_DATASETS[key] = (spec, owner)
    _BY_NAME[key] = DatasetEntry(key, f"{spec.description} ({owner})".strip(), spec.needs_root)


def plugin_dataset(name: str) -> DatasetSpec | None:
    """The :class:`DatasetSpec` of dataset ``name`` when it is a plugin's, else None."""
    _load_entry_point_datasets()
    entry = _PLUGIN_DATASETS.get(_key(name))
    return entry[0] if entry else None


def dataset_owner(name: str) -> str | None:
    """Who registered dataset ``name`` when it is a plugin's, else None."""
    entry = _PLUGIN_DATASETS.get(_key(name))
    return entry[1] if entry else None


_entry_points_seen = 0


def _load_entry_point_datasets() -> None:
    """Installed plugins' datasets (:mod:`fedtune.entry_points`) on the first use of this registry."""
    global _entry_points_seen
    loaded = load_entry_points()
    while _entry_points_seen < len(loaded):
        ep = loaded[_entry_points_seen]
        _entry_points_seen += 1
        if isinstance(ep.obj, DatasetSpec):
            register_dataset(ep.obj, f"plugin entry point {ep.name!r} ({ep.distribution or 'unknown package'})")


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def list_datasets() -> list[DatasetEntry]:
    _load_entry_point_datasets()
    return list(_BY_NAME.values())


def _entry(name: str) -> DatasetEntry:
    _load_entry_point_datasets()
    key = _key(name)
    if key not in _BY_NAME:
        raise DataError(
            f"dataset {shown(name)} is unknown; choose one of: {', '.join(_BY_NAME)}"
        )
    return _BY_NAME[key]


def is_domainbed(name: str) -> bool:
    """Whether ``name`` is one of DomainBed's own image datasets (what ``augment: auto`` augments).

    >>> is_domainbed("PACS"), is_domainbed("folder")
    (True, False)
    """
    return str(name).strip().lower().replace("_", "-") in DOMAINBED


def _check_domainbed_layout(name: str, path: Path, info: DatasetInfo) -> None:
    """A DomainBed dataset with a domain folder missing, one it does not have, or another number of
    classes is one DataError (it would run as a different benchmark, silently)."""
    domains, num_classes = DOMAINBED_LAYOUT[name]
    missing = [d for d in domains if d not in info.domains]
    extra = [d for d in info.domains if d not in domains]
    allowed = (f"{DOMAINBED[name][0]} has the domain folders {', '.join(domains)} and {num_classes} classes; "
               f"to run other folders, use dataset 'folder'")
    if missing or extra:
        found = "; ".join(part for part in (
            f"missing: {', '.join(missing)}" if missing else "",
            f"not {DOMAINBED[name][0]}'s: {', '.join(shown(d) for d in extra)}" if extra else "") if part)
        raise DataError(f"dataset {name!r}: the domain folders of {str(path)!r} do not match ({found}); {allowed}")
    if info.num_classes != num_classes:
        raise DataError(f"dataset {name!r}: {str(path)!r} has {info.num_classes} classes with images "
                        f"({shown(list(info.classes))}), expected {num_classes}; {allowed}")


def is_image_folder(name: str) -> bool:
    """Whether ``name`` is a dataset of image files (``folder``, a DomainBed one, a WILDS one, a plugin's
    declaring ``image_files``): what the decoded-image cache applies to, DomainBed's augmentation may
    (``augment: domainbed``) and a split scheme may split (``split_scheme``; a plugin's dataset: the
    schemes it declares).

    >>> is_image_folder("PACS"), is_image_folder("camelyon17"), is_image_folder("rotated-digits")
    (True, True, False)
    """
    key = _key(name)
    if key in _PLUGIN_DATASETS:
        return _PLUGIN_DATASETS[key][0].image_files
    return key in ("folder", *DOMAINBED, *WILDS_SETS, "femnist")


def _layout(name: str) -> str:
    if name in _PLUGIN_DATASETS:
        return f"the files dataset {name!r} reads ({_PLUGIN_DATASETS[name][1]})"
    if name == "folder":
        return "DIR/<domain>/<class>/<image>"
    if name in DOMAINBED:
        return f"DIR/{DOMAINBED[name][0]}/<domain>/<class>/<image>"
    if name in WILDS_SETS:
        return f"DIR/{WILDS_SETS[name].folder}/ ({', '.join(WILDS_SETS[name].expected)})"
    if name == "femnist":
        return "DIR/femnist_v1.0/ (metadata.csv and the images it lists)"

    return SPECS[name].expected.replace("ROOT", "DIR")


def _check_root(root: str | os.PathLike) -> None:
    """A data root the OS will not even look up (a name too long, a loop of symbolic links, no
    permission on a parent) is one DataError naming ``data_root``; a missing one is left to each
    dataset, whose message shows the expected layout."""
    try:
        os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        raise DataError(f"field 'data_root': cannot look up {shown(str(root))}: {e.strerror or e}; "
                        f"allowed: a readable folder") from None


def get_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    image_size: int | None = None,
    data_seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    cache_key: str = "stat",
    cache_wait_s: float = DEFAULT_WAIT_S,
) -> DomainDataset:
    """Build the dataset ``name`` (see :func:`list_datasets`).

    ``root`` is the data root (``--data-root``) for datasets that need one; ``image_size``
    only applies to image-folder datasets (default 64) and must otherwise be None or the
    dataset's native size; ``data_seed`` seeds synthetic/split datasets (rotated-digits, colored-digits, rect4);
    ``cache_dir`` is where image-folder datasets keep their decoded-image cache
    (:mod:`fedtune.data.cache`; default ``$FEDTUNE_CACHE_DIR`` or the user's cache folder),
    ``cache_key`` its key (``stat`` or ``content``) and ``cache_wait_s`` how long a process waits
    for another's build of it that makes no progress. A DomainBed dataset must have its domain
    folders and number of classes (:data:`DOMAINBED_LAYOUT`).
    """
    entry = _entry(name)
    n = entry.name
    if image_size is not None:
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
            raise DataError(f"image_size must be a positive integer or None, got {image_size!r}")
        if n == "rect4":
            raise DataError("image_size does not apply to dataset 'rect4' (2-D points); "
                            "leave it unset")
        if n in _FIXED_SIZE and image_size != _FIXED_SIZE[n]:
            raise DataError(f"dataset {n!r} has a fixed image size {_FIXED_SIZE[n]}; image_size "
                            f"must be unset or {_FIXED_SIZE[n]}, got {image_size}")
    if entry.needs_root and (root is None or str(root) == ""):
        raise DataError(f"dataset {n!r} needs data_root (--data-root DIR) holding {_layout(n)}")
    if entry.needs_root:
        _check_root(root)  # type: ignore[arg-type]
    if n in _PLUGIN_DATASETS:
        spec, owner = _PLUGIN_DATASETS[n]
        return build_plugin_dataset(spec, owner, root=root, image_size=image_size, data_seed=data_seed,
                                    cache=(cache_dir, cache_key, cache_wait_s))

    if n == "rotated-digits":
        return RotatedDigits(data_seed=data_seed)
    if n == "colored-digits":
        return ColoredDigits(data_seed=data_seed)
    if n == "rect4":
        return Rect4(data_seed=data_seed)
    if n == "femnist":
        return FemnistDataset(root, image_size=image_size, cache_dir=cache_dir,  # type: ignore[arg-type]
                              cache_key=cache_key, cache_wait_s=cache_wait_s)
    if n in WILDS_SETS:
        return WildsImageDataset(n, root, image_size=image_size, cache_dir=cache_dir,  # type: ignore[arg-type]
                                 cache_key=cache_key, cache_wait_s=cache_wait_s)
    if n == "folder" or n in DOMAINBED:
        base = Path(root)  # type: ignore[arg-type]
        cache = {"cache_dir": cache_dir, "cache_key": cache_key, "cache_wait_s": cache_wait_s}
        if n == "folder":
            return ImageFolderDataset(base, name="folder", image_size=image_size, **cache)
        sub = DOMAINBED[n][0]
        path = base / sub
        if not path.is_dir() and base.name == sub and base.is_dir():
            path = base  # the user pointed at DIR/PACS itself
        if not path.is_dir():
            raise DataError(f"dataset {n!r}: {str(path)!r} does not exist; data_root "
                            f"(--data-root DIR) must hold {_layout(n)}")
        dataset = ImageFolderDataset(path, name=n, image_size=image_size, **cache,
                                     layout_hint=f"{path}/<domain>/<class>/<image>")
        _check_domainbed_layout(n, path, dataset.info)
        return dataset

    return TorchvisionDataset(n, root)  # type: ignore[arg-type]


def dataset_info(
    name: str,
    root: str | os.PathLike | None = None,
    image_size: int | None = None,
    data_seed: int = 0,
) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``name`` (builds the dataset; cheap: no pixels decoded)."""
    return get_dataset(name, root=root, image_size=image_size, data_seed=data_seed).info
