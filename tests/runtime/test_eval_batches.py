"""A batch of cached images is one float buffer filled and normalised in place
(fedtune/runtime/examples.py), evaluation batches are capped by bytes and freed one by one
(fedtune/runtime/common.py ``evaluate``), and a CPU worker seeds torch's CPU generator only
(fedtune/runtime/worker.py ``seed_torch``). Every value equals the formula the pipeline used
before, ``(uint8.permute().float() / 255 - mean) / std``, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedtune.data.registry import get_dataset
from fedtune.runtime import examples as examples_module
from fedtune.runtime.augment import DomainBedAugment
from fedtune.runtime.common import evaluate
from fedtune.runtime.examples import CachedImages, TensorExamples, client_examples, rows_per_batch
from fedtune.runtime.worker import seed_torch


def image_tree(root: Path, size: int = 24) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for domain in ("a", "b"):
        for cls in ("cat", "dog"):
            (root / domain / cls).mkdir(parents=True)
            for i in range(5):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / domain / cls / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval-batches")
    return get_dataset("folder", root=image_tree(tmp / "ds"), image_size=16, cache_dir=tmp / "cache")


def reference(ex: CachedImages, rows: np.ndarray, augment=None, generator=None) -> torch.Tensor:
    """The formula, written out in the order the pipeline computed it before it was one buffer."""
    x = torch.from_numpy(ex.gather(rows)).permute(0, 3, 1, 2).float().div_(255.0)
    if augment is not None:
        x = augment(x, generator)
    return (x - ex.mean) / ex.std


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("gather_rows", [2, 32])
def test_a_batch_equals_the_formula_bit_for_bit_in_either_layout(dataset, monkeypatch, channels_last, gather_rows):
    monkeypatch.setattr(examples_module, "GATHER_ROWS", gather_rows)  # 2: chunks that straddle both domains
    pieces = {"a": np.arange(10), "b": np.array([9, 0, 4, 2, 7])}
    ex = client_examples(dataset, pieces, channels_last=channels_last)
    assert isinstance(ex, CachedImages)
    rows = np.array([3, 12, 0, 14, 7, 10, 1])
    x, y = ex.batch(torch.from_numpy(rows))
    assert torch.equal(x, reference(ex, rows))
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert x.untyped_storage().nbytes() == x.numel() * 4  # one buffer of exactly the batch: no copy behind it
    aug = DomainBedAugment()
    xa, _ = ex.batch(torch.from_numpy(rows), aug, torch.Generator().manual_seed(5))
    assert torch.equal(xa, reference(ex, rows, aug, torch.Generator().manual_seed(5)))


def test_rows_per_batch_caps_a_batch_by_its_float_bytes():
    big = TensorExamples(torch.zeros(2, 3, 224, 224), torch.zeros(2))
    per_image = 3 * 224 * 224 * 4
    assert rows_per_batch(big, 256, None) == 256
    assert 256 * per_image == 147 * 2**20  # 256 images at 224 px are exactly 147 MiB
    assert rows_per_batch(big, 256, 147.0) == 256
    assert rows_per_batch(big, 256, 146.9) == int(146.9 * 2**20) // per_image == 255
    assert rows_per_batch(big, 256, 0.01) == 1  # never below one image
    assert [len(b[1]) for b in TensorExamples(torch.zeros(5, 3, 224, 224), torch.zeros(5)).batches(4, 1.2)] == [2, 2, 1]


def test_evaluation_counts_do_not_depend_on_the_cap(dataset):
    ex = client_examples(dataset, {"a": np.arange(10), "b": np.arange(10)})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
    whole = evaluate(model, ex, 256)
    capped = evaluate(model, ex, 256, max_mib=3 * 16 * 16 * 4 * 3 / 2**20)  # 3 images a batch
    assert (capped.correct, capped.count) == (whole.correct, whole.count) == (capped.correct, 20)
    assert capped.loss_sum == pytest.approx(whole.loss_sum, rel=1e-6)  # sums of other batches: last bits


def test_a_cpu_worker_seeds_the_cpu_stream_torch_manual_seed_gives():
    torch.manual_seed(1234)
    expected = torch.rand(5), torch.randn(3), torch.randint(0, 10**6, (4,))
    torch.manual_seed(99)
    seed_torch(1234, "cpu")
    got = torch.rand(5), torch.randn(3), torch.randint(0, 10**6, (4,))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    seed_torch(1234, torch.device("cpu"))
    assert torch.equal(torch.rand(5), expected[0])
