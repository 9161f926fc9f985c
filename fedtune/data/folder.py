"""Image-folder datasets: ``ROOT/<domain>/<class>/<image>`` and the DomainBed ones on top.

* Domains are the sorted (non-hidden) sub-directories of ROOT; classes are the sorted union of
  the class directories found in any domain (a domain may lack a class). A class folder with
  no image in any domain, or fewer than 2 classes, is a :class:`DataError` (never a silent
  smaller task).
* Images: files with extension jpg / jpeg / png / bmp (case-insensitive), any size, grey or
  RGB. Other files and hidden entries are ignored.
* Canonical order inside a domain: sorted by (class, file name).
* :meth:`labels` only lists files (done once, at construction). Pixels come from the node's
  decoded-image cache (:mod:`fedtune.data.cache`): :meth:`pixels` is a domain's read-only
  uint8 ``(N, S, S, 3)`` memory map, decoded once per node with PIL (RGB, resized to
  ``image_size`` x ``image_size``, bilinear; default 64). :meth:`load` gathers rows from it,
  scales to [0, 1] and normalises with the ImageNet mean/std; client actors instead gather
  uint8 batches and normalise on their device (:mod:`fedtune.runtime.examples`).
  ``input_shape`` is ``(3, S, S)``. PIL is imported only when a cache is built; torch never.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedtune.errors import DataError

from .base import DatasetInfo, DomainDataset
from .cache import CacheEntry, ImageMap, cache_entry, cached_images, resolve_cache_dir
from .cache_lock import DEFAULT_WAIT_S

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
DEFAULT_IMAGE_SIZE = 64
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _scandir(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError as e:
        raise DataError(f"cannot list {str(path)!r}: {e.strerror or e}; the dataset's folders must be "
                        "readable by the user running fedtune") from None


def _entry_kind(e: os.DirEntry) -> str:
    """``dir``, ``file`` or ``other`` (following symbolic links); a link that loops or points nowhere is
    a DataError naming it (a loop would otherwise be an ``ELOOP`` traceback, a dangling link a silently
    smaller dataset)."""
    try:
        if e.is_dir():
            return "dir"
        if e.is_file():
            return "file"
        broken = e.is_symlink()
        problem = "is a symbolic link to nothing (its target does not exist)"
    except OSError as err:
        broken, problem = True, f"cannot be read: {err.strerror or err}"
    if broken:
        raise DataError(f"{str(e.path)!r} {problem}; fix or remove it (the dataset's folders must hold "
                        f"readable folders and image files)")
    return "other"


def _subdirs(path: Path) -> list[str]:
    return sorted(e.name for e in _scandir(path) if not e.name.startswith(".") and _entry_kind(e) == "dir")


def _images(path: Path) -> list[str]:
    return sorted(
        e.name
        for e in _scandir(path)
        if not e.name.startswith(".")
        and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS
        and _entry_kind(e) == "file"
    )


def decode_image(path: Path, size: int, out: np.ndarray) -> None:
    """Decode ``path`` into ``out`` (a ``(size, size, 3)`` uint8 view): PIL, RGB, bilinear resize
    (JPEG draft mode first: fast down-scaling, a no-op otherwise), or one :class:`DataError` naming
    the file, whatever PIL raised (a truncated or unknown file, an image above PIL's pixel limit,
    ``Image.MAX_IMAGE_PIXELS``, which guards against decompression bombs)."""
    from PIL import Image  # lazy: keeps PIL out of this module's import

    try:
        with Image.open(path) as im:
            im.draft("RGB", (size, size))
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            pixels = np.asarray(im, dtype=np.uint8)
    except Image.DecompressionBombError as e:
        raise DataError(f"cannot decode image {str(path)!r}: {e} (PIL refuses images above "
                        f"Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS} pixels); shrink or remove it") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError, IndexError, TypeError, KeyError) as e:
        # what PIL's decoders raise for damaged files (SyntaxError: "broken PNG file", ...)
        raise DataError(f"cannot decode image {str(path)!r}: {type(e).__name__}: {e}") from None
    out[...] = pixels


class CachedImageDataset(DomainDataset):
    """Images listed per domain (``files``: paths relative to ``root``, canonical order) with their
    labels, decoded once per node into the image cache: the base every dataset of image files shares.
    fedtune's subclasses list them (:class:`ImageFolderDataset` from folders,
    :class:`fedtune.data.wilds_sets.WildsImageDataset` from the ``wilds`` package) and may decode
    differently (:meth:`_decoder`).

    A plugin's dataset of image files (``DatasetSpec(image_files=True)``, docs/extending.md) builds
    one with this constructor: ``files[domain]`` the image paths relative to ``root`` in the
    domain's canonical order, ``labels[domain]`` their class indices into ``classes``, decoded with
    PIL (RGB, bilinear) at ``image_size`` (default 64) and normalised with ImageNet's mean and
    standard deviation, like every image folder; the run's cache fields apply
    (:meth:`use_cache`, which fedtune calls). Bad input is one DataError naming the dataset.

    >>> import pathlib, tempfile
    >>> ds = CachedImageDataset("toy", tempfile.mkdtemp(), {"a": ["x.png"], "b": ["y.png", "z.png"]},
    ...                         {"a": [0], "b": [1, 0]}, ("cat", "dog"), image_size=8)
    >>> ds.info.domains, ds.info.input_shape, ds.labels("b").tolist(), ds.files("b")
    (('a', 'b'), (3, 8, 8), [1, 0], ['y.png', 'z.png'])
    """

    root: Path
    image_size: int
    _files: dict[str, list[str]]
    _labels: dict[str, np.ndarray]

    def __init__(self, name: str, root: str | os.PathLike, files: Mapping[str, Sequence[str]],
                 labels: Mapping[str, Sequence[int] | np.ndarray], classes: Sequence[str], *,
                 image_size: int | None = None, default_model: str = "cnn", default_setting: str = "fdg",
                 cache_dir: str | os.PathLike | None = None, cache_key: str = "stat",
                 cache_wait_s: float = DEFAULT_WAIT_S):
        self.root = Path(root)
        self._init_cache(cache_dir, cache_key, cache_wait_s, image_size)
        where = f"dataset {name!r}"
        classes = tuple(str(c) for c in classes)
        if not files or set(files) != set(labels):
            raise DataError(f"{where}: files and labels must name the same domains, at least one; got "
                            f"{', '.join(map(repr, files)) or 'none'} and {', '.join(map(repr, labels)) or 'none'}")
        if len(classes) < 2:
            raise DataError(f"{where}: {len(classes)} class(es); a classification task needs at least 2")
        self._files, self._labels = {}, {}
        for d in files:
            paths, y = [str(f) for f in files[d]], np.asarray(labels[d])
            fits = bool(paths) and y.shape == (len(paths),) and y.dtype.kind in "iu" and y.min() >= 0 \
                and y.max() < len(classes)
            if not fits:
                raise DataError(f"{where}: domain {d!r} needs at least one image and one label per image, each a "
                                f"whole number in 0..{len(classes) - 1} ({len(classes)} classes); got {len(paths)} "
                                f"image(s) and labels of shape {tuple(y.shape)} ({y.dtype})")
            self._files[str(d)], self._labels[str(d)] = paths, y.astype(np.int64)
        self.info = DatasetInfo(name=name, domains=tuple(self._files), classes=classes,
                                input_shape=(3, self.image_size, self.image_size), default_model=default_model,
                                default_setting=default_setting)

    def _init_cache(self, cache_dir, cache_key: str, cache_wait_s: float, image_size: int | None,
                    default_size: int = 0) -> None:
        self.use_cache(cache_dir, cache_key, cache_wait_s)
        self.image_size = (default_size or DEFAULT_IMAGE_SIZE) if image_size is None else int(image_size)
        if self.image_size < 1:
            raise DataError(f"image_size must be a positive integer, got {image_size!r}")

    def use_cache(self, cache_dir: str | os.PathLike | None, cache_key: str = "stat",
                  cache_wait_s: float = DEFAULT_WAIT_S) -> None:
        """Decode into (and read from) the cache in ``cache_dir`` (None: :func:`~fedtune.data.cache.default_cache_dir`)
        keyed by ``cache_key`` (``stat`` or ``content``), waiting up to ``cache_wait_s`` for another
        builder: the run's fields of those names (fedtune sets them on a plugin's dataset)."""
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.cache_key, self.cache_wait_s = cache_key, float(cache_wait_s)
        self._pixels: dict[str, ImageMap] = {}

    def files(self, domain: str) -> list[str]:
        """Paths of ``domain``'s images relative to the dataset's root (folders: ``<class>/<file>``
        under the domain's folder), in canonical order."""
        self.check_domain(domain)
        return list(self._files[domain])

    def labels(self, domain: str) -> np.ndarray:
        self.check_domain(domain)
        return self._labels[domain].copy()

    def _decoder(self, domain: str):
        """``fn(i, out)`` writing image ``i`` of ``domain`` into ``out`` (``(S, S, 3)`` uint8)."""
        files, s, base = self._files[domain], self.image_size, self._file_root(domain)
        return lambda i, out: decode_image(base / files[i], s, out)

    def _file_root(self, domain: str) -> Path:
        """The folder ``files(domain)`` are relative to (``root``; an image folder's: ``root/<domain>``)."""
        return self.root

    def pixels(self, domain: str) -> ImageMap:
        """``domain``'s images mapped read-only from the node's cache (``.array``: uint8
        ``(N, S, S, 3)``, canonical order; decoded on first use on this node; see
        :mod:`fedtune.data.cache`)."""
        self.check_domain(domain)
        if domain not in self._pixels:
            self._pixels[domain] = cached_images(self.cache_entry(domain), self._decoder(domain),
                                                 wait_s=self.cache_wait_s)
        return self._pixels[domain]

    def cache_entry(self, domain: str) -> CacheEntry:
        """Where ``domain``'s decoded images live in the cache (its key read from the files now)."""
        self.check_domain(domain)
        return cache_entry(self.cache_dir, dataset=self.info.name, domain=domain, root=self._file_root(domain),
                           files=self._files[domain], image_size=self.image_size, key_mode=self.cache_key)

    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.check_domain(domain)
        idx = self.check_indices(domain, indices, len(self._files[domain]))
        out = self.pixels(domain).read(idx).astype(np.float32)
        out /= 255.0
        out -= IMAGENET_MEAN
        out /= IMAGENET_STD
        x = np.ascontiguousarray(out.transpose(0, 3, 1, 2))
        return x, self._labels[domain][idx].copy()


class ImageFolderDataset(CachedImageDataset):
    """``ROOT/<domain>/<class>/<image>``; see the module docstring."""

    def _file_root(self, domain: str) -> Path:
        return self.root / domain

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        name: str = "folder",
        image_size: int | None = None,
        layout_hint: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_key: str = "stat",
        cache_wait_s: float = DEFAULT_WAIT_S,
    ):
        self.root = Path(root)
        self._init_cache(cache_dir, cache_key, cache_wait_s, image_size)
        hint = layout_hint or f"{self.root}/<domain>/<class>/<image>"
        expected = (
            f"expected the layout {hint} (images: {', '.join(IMAGE_EXTENSIONS)})"
        )
        if not self.root.is_dir():
            raise DataError(f"dataset {name!r}: data root {str(self.root)!r} does not exist "
                            f"or is not a directory; {expected}")
        domains = _subdirs(self.root)
        if not domains:
            raise DataError(f"dataset {name!r}: no domain directories in {str(self.root)!r}; "
                            f"{expected}")
        per_domain: dict[str, list[tuple[str, str]]] = {}  # domain -> [(class, file)]
        class_dirs: set[str] = set()  # every class folder of any domain, empty or not
        for d in domains:
            entries = []
            for c in _subdirs(self.root / d):
                class_dirs.add(c)
                entries.extend((c, f) for f in _images(self.root / d / c))
            if not entries:
                raise DataError(
                    f"dataset {name!r}: domain {d!r} ({str(self.root / d)!r}) holds no images "
                    f"in class sub-directories; {expected}"
                )
            per_domain[d] = entries  # already sorted by (class, file)
        classes = tuple(sorted(class_dirs))
        with_images = {c for ents in per_domain.values() for c, _ in ents}
        empty = [c for c in classes if c not in with_images]
        if empty:
            raise DataError(
                f"dataset {name!r}: class folder(s) {', '.join(repr(c) for c in empty)} hold no image in any "
                f"domain of {str(self.root)!r} (looked in {', '.join(str(self.root / d / empty[0]) for d in domains)}); "
                f"every class needs images in at least one domain (remove the empty folders or add images); {expected}"
            )
        if len(classes) < 2:
            raise DataError(
                f"dataset {name!r}: {str(self.root)!r} has {len(classes)} class ({', '.join(classes)}); a "
                f"classification task needs at least 2 classes (class folders with images); {expected}"
            )
        cidx = {c: i for i, c in enumerate(classes)}
        self._files = {d: [f"{c}/{f}" for c, f in ents] for d, ents in per_domain.items()}
        self._labels = {
            d: np.array([cidx[c] for c, _ in ents], dtype=np.int64) for d, ents in per_domain.items()
        }
        self.info = DatasetInfo(
            name=name,
            domains=tuple(domains),
            classes=classes,
            input_shape=(3, self.image_size, self.image_size),
            default_model="cnn",
            default_setting="fdg",
        )
