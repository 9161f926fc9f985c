"""torchvision-backed single-domain datasets: mnist, fashion-mnist, emnist, cifar10, cifar100.

* Read from ``ROOT`` with ``download=False``; ``ROOT`` is passed as-is to the torchvision class
  (so MNIST lives in ``ROOT/MNIST/raw/``, CIFAR-10 in ``ROOT/cifar-10-batches-py/`` ...).
* ONE domain, named after the dataset, holding the official TRAIN split followed by the
  official TEST split (indices ``0 .. n_train-1`` are train, the rest test). In the ``fl``
  setting the plan re-splits this pool per client (Dirichlet label skew), so the official split
  is not preserved.
* ``emnist`` is EMNIST's ``"mnist"`` split: 60k + 10k = 70k digits, 10 classes. EMNIST stores
  images transposed; they are transposed back here so digits are upright like MNIST's.
* Pixels: ``(x / 255 - 0.5) / 0.5`` (range [-1, 1]); ``input_shape`` (1, 28, 28) for the MNIST
  family, (3, 32, 32) for CIFAR.
* :meth:`labels` reads only the label files, with numpy/pickle, so it never imports torch;
  :meth:`load` builds the torchvision datasets once (the decoded arrays are cached on the
  instance) and torchvision's ``RuntimeError`` becomes :class:`DataError`.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedtune.errors import DataError

from .base import DatasetInfo, DomainDataset

_DIGITS = tuple(str(i) for i in range(10))
_FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
            "Sneaker", "Bag", "Ankle boot")
_CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
            "truck")


@dataclass(frozen=True)
class _Spec:
    tv_class: str
    folder: str  # relative to ROOT
    train_files: tuple[str, ...]  # label-bearing files, official train split in order
    test_files: tuple[str, ...]
    kind: str  # "idx" | "cifar10" | "cifar100"
    input_shape: tuple[int, ...]
    classes: tuple[str, ...] | None  # None: read from the meta file (cifar100)
    expected: str  # human-readable list of the files needed
    tv_kwargs: tuple[tuple[str, str], ...] = ()
    transpose: bool = False


def _idx_pair(prefix_train: str, prefix_test: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (
        (f"{prefix_train}-images-idx3-ubyte", f"{prefix_train}-labels-idx1-ubyte"),
        (f"{prefix_test}-images-idx3-ubyte", f"{prefix_test}-labels-idx1-ubyte"),
    )


_MN_TR, _MN_TE = _idx_pair("train", "t10k")
_EM_TR, _EM_TE = _idx_pair("emnist-mnist-train", "emnist-mnist-test")

SPECS: dict[str, _Spec] = {
    "mnist": _Spec("MNIST", "MNIST/raw", _MN_TR, _MN_TE, "idx", (1, 28, 28), _DIGITS,
                   "ROOT/MNIST/raw/train-images-idx3-ubyte, train-labels-idx1-ubyte "
                   "(and t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte)"),
    "fashion-mnist": _Spec("FashionMNIST", "FashionMNIST/raw", _MN_TR, _MN_TE, "idx",
                           (1, 28, 28), _FASHION,
                           "ROOT/FashionMNIST/raw/train-images-idx3-ubyte, "
                           "train-labels-idx1-ubyte (and t10k-images-idx3-ubyte, "
                           "t10k-labels-idx1-ubyte)"),
    "emnist": _Spec("EMNIST", "EMNIST/raw", _EM_TR, _EM_TE, "idx", (1, 28, 28), _DIGITS,
                    "ROOT/EMNIST/raw/emnist-mnist-train-images-idx3-ubyte, "
                    "emnist-mnist-train-labels-idx1-ubyte (and emnist-mnist-test-...)",
                    tv_kwargs=(("split", "mnist"),), transpose=True),
    "cifar10": _Spec("CIFAR10", "cifar-10-batches-py",
                     tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "cifar10",
                     (3, 32, 32), _CIFAR10,
                     "ROOT/cifar-10-batches-py/data_batch_1..5, test_batch (the extracted "
                     "cifar-10-python.tar.gz)"),
    "cifar100": _Spec("CIFAR100", "cifar-100-python", ("train",), ("test",), "cifar100",
                      (3, 32, 32), None,
                      "ROOT/cifar-100-python/train, test, meta (the extracted "
                      "cifar-100-python.tar.gz)"),
}


def _read_idx_labels(path: Path) -> np.ndarray:
    data = path.read_bytes()
    if len(data) < 8 or int.from_bytes(data[0:4], "big") != 2049:
        raise DataError(f"{str(path)!r} is not an idx1 label file (magic 2049)")
    n = int.from_bytes(data[4:8], "big")
    labels = np.frombuffer(data, dtype=np.uint8, count=n, offset=8)
    return labels.astype(np.int64)


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")


class TorchvisionDataset(DomainDataset):
    """One torchvision dataset as a single-domain :class:`DomainDataset`."""

    def __init__(self, name: str, root: str | os.PathLike):
        if name not in SPECS:
            raise DataError(f"no torchvision dataset {name!r}; choose one of: {', '.join(SPECS)}")
        self.spec = spec = SPECS[name]
        self.name = name
        self.root = root
        folder = Path(root) / spec.folder
        needed = [folder / f for f in (*spec.train_files, *spec.test_files)]
        missing = [str(p) for p in needed if not p.is_file()]
        if missing:
            raise DataError(
                f"dataset {name!r}: data root {str(root)!r} lacks {missing[0]}"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; expected "
                f"{spec.expected} (download=False: fetch it with torchvision beforehand)"
            )
        classes = spec.classes
        if classes is None:
            try:
                meta = _unpickle(folder / "meta")
                classes = tuple(meta["fine_label_names"])
            except (OSError, KeyError, pickle.UnpicklingError, EOFError):
                classes = tuple(str(i) for i in range(100))
        self._labels: np.ndarray | None = None
        self._images: np.ndarray | None = None  # uint8, (N, H, W) or (N, H, W, 3)
        self.info = DatasetInfo(
            name=name,
            domains=(name,),
            classes=classes,
            input_shape=spec.input_shape,
            default_model="cnn",
            default_setting="fl",
        )

    def _read_labels(self) -> np.ndarray:
        spec, folder = self.spec, Path(self.root) / self.spec.folder
        parts = []
        try:
            if spec.kind == "idx":
                for files in (spec.train_files, spec.test_files):
                    parts.append(_read_idx_labels(folder / files[1]))
            else:
                key = "labels" if spec.kind == "cifar10" else "fine_labels"
                for f in (*spec.train_files, *spec.test_files):
                    parts.append(np.asarray(_unpickle(folder / f)[key], dtype=np.int64))
        except (OSError, KeyError, pickle.UnpicklingError, EOFError, ValueError) as e:
            raise DataError(
                f"dataset {self.name!r}: cannot read labels under {str(folder)!r} ({e}); "
                f"expected {spec.expected}"
            ) from e
        return np.ascontiguousarray(np.concatenate(parts))

    def _ensure_images(self) -> None:
        if self._images is not None:
            return
        import torchvision.datasets as tvd  # lazy: keeps torch, torchvision out of this module's import

        cls = getattr(tvd, self.spec.tv_class)
        kw = dict(self.spec.tv_kwargs)
        try:
            splits = [cls(self.root, train=t, download=False, **kw) for t in (True, False)]
        except (RuntimeError, OSError, ValueError, AssertionError, TypeError) as e:
            raise DataError(
                f"dataset {self.name!r}: torchvision could not read {str(self.root)!r} ({e}); "
                f"expected {self.spec.expected}"
            ) from e
        imgs, tgts = [], []
        for s in splits:
            data = s.data
            data = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
            imgs.append(data.astype(np.uint8, copy=False))
            t = s.targets
            tgts.append(np.asarray(t.numpy() if hasattr(t, "numpy") else t, dtype=np.int64))
        images = np.concatenate(imgs)
        if self.spec.transpose:
            images = images.transpose(0, 2, 1)
        labels = np.concatenate(tgts)
        if self._labels is not None and not np.array_equal(labels, self._labels):
            raise DataError(f"dataset {self.name!r}: torchvision's labels differ from the "
                            f"label files under {str(self.root)!r}")
        self._labels = labels
        self._images = np.ascontiguousarray(images)

    def labels(self, domain: str) -> np.ndarray:
        self.check_domain(domain)
        if self._labels is None:
            self._labels = self._read_labels()
        return self._labels.copy()

    def load(self, domain: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.check_domain(domain)
        self._ensure_images()
        assert self._images is not None and self._labels is not None
        idx = self.check_indices(domain, indices, len(self._labels))
        x = self._images[idx].astype(np.float32) / 255.0
        if x.ndim == 3:  # (n, H, W) grey
            x = x[:, None]
        else:  # (n, H, W, 3)
            x = x.transpose(0, 3, 1, 2)
        x = (x - 0.5) / 0.5
        return np.ascontiguousarray(x, dtype=np.float32), self._labels[idx].copy()
