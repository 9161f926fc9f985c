"""Datasets of fedtune.data: registry, rotated-digits, rect4, image folders, torchvision sets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedtune.errors import DataError
from fedtune.data.base import DatasetInfo, DomainDataset
from fedtune.data.registry import dataset_info, get_dataset, list_datasets

REPO = Path(__file__).resolve().parents[2]
PACS64 = REPO.parent / "shared/data/PACS64"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


# ----------------------------------------------------------------------------- registry
def test_import_and_labels_do_not_import_torch_sklearn_or_pil(tmp_path):
    _make_tree(tmp_path / "tree")
    code = (
        "import sys\n"
        "from fedtune.data.registry import get_dataset\n"
        "from fedtune.data.partition import make_plan\n"
        "for name, root in [('rotated-digits', None), ('rect4', None), ('folder', %r)]:\n"
        "    ds = get_dataset(name, root=root)\n"
        "    for dom in ds.info.domains: ds.labels(dom)\n"
        "    make_plan(ds.info, {k: ds.labels(k) for k in ds.info.domains}, setting='fdg',"
        " target_domain=None)\n"
        "bad = [m for m in ('torch', 'torchvision', 'sklearn', 'PIL') if m in sys.modules]\n"
        "assert not bad, bad\n"
    ) % str(tmp_path / "tree")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_list_datasets_names_and_roots():
    entries = {e.name: e for e in list_datasets()}
    for name in ["rotated-digits", "rect4", "folder", "pacs", "vlcs", "office-home",
                 "terra-incognita", "domain-net", "mnist", "fashion-mnist", "emnist", "cifar10",
                 "cifar100"]:
        assert name in entries, name
    assert not entries["rotated-digits"].needs_root and not entries["rect4"].needs_root
    assert entries["pacs"].needs_root and entries["mnist"].needs_root and entries["folder"].needs_root
    assert all(e.description for e in entries.values())


def test_unknown_dataset_names_allowed_values():
    with pytest.raises(DataError, match=r"dataset 'foo' is unknown; choose one of: .*rotated-digits.*rect4.*pacs"):
        get_dataset("foo")


def test_dataset_needing_root_without_one():
    with pytest.raises(DataError) as e:
        get_dataset("pacs")
    assert "dataset 'pacs' needs data_root (--data-root DIR) holding DIR/PACS/<domain>/<class>/<image>" in str(e.value)
    with pytest.raises(DataError, match=r"mnist.*needs data_root.*MNIST/raw/train-images-idx3-ubyte"):
        get_dataset("mnist")


def test_fixed_size_dataset_rejects_other_image_size():
    with pytest.raises(DataError, match="fixed image size 28"):
        get_dataset("rotated-digits", image_size=64)
    assert get_dataset("rotated-digits", image_size=28).info.input_shape == (1, 28, 28)


def test_dataset_info_matches_dataset():
    info = dataset_info("rect4")
    assert isinstance(info, DatasetInfo)
    assert info == get_dataset("rect4").info


# ----------------------------------------------------------------------------- rotated-digits
def test_rotated_digits_info_and_domains():
    ds = get_dataset("rotated-digits")
    assert isinstance(ds, DomainDataset)
    info = ds.info
    assert info.domains == ("0", "15", "30", "45", "60", "75")
    assert info.classes == tuple(str(i) for i in range(10))
    assert info.input_shape == (1, 28, 28)
    assert (info.default_model, info.default_setting) == ("cnn", "fdg")
    sizes = [len(ds.labels(d)) for d in info.domains]
    assert sizes == [300, 300, 300, 299, 299, 299]


def test_rotated_digits_disjoint_and_cover_all_1797():
    from fedtune.data.digits import read_digits

    ds = get_dataset("rotated-digits", data_seed=3)
    _, raw_labels = read_digits()
    members = [ds.members(d) for d in ds.info.domains]
    allm = np.concatenate(members)
    assert len(allm) == 1797 and len(np.unique(allm)) == 1797
    assert set(allm.tolist()) == set(range(1797))
    for d, m in zip(ds.info.domains, members):
        np.testing.assert_array_equal(ds.labels(d), raw_labels[m])
    counts = sum(np.bincount(ds.labels(d), minlength=10) for d in ds.info.domains)
    np.testing.assert_array_equal(counts, np.bincount(raw_labels, minlength=10))


def test_rotated_digits_deterministic_per_seed_and_differs_across_seeds():
    a, b, c = (get_dataset("rotated-digits", data_seed=s) for s in (0, 0, 1))
    for d in a.info.domains:
        np.testing.assert_array_equal(a.members(d), b.members(d))
        np.testing.assert_array_equal(a.labels(d), b.labels(d))
    xa, ya = a.load("30", np.arange(10))
    xb, yb = b.load("30", np.arange(10))
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a.members("0"), c.members("0"))


def test_rotated_digits_load_shape_dtype_range():
    ds = get_dataset("rotated-digits")
    x, y = ds.load("60", np.array([0, 5, 7], dtype=np.int64))
    assert x.shape == (3, 1, 28, 28) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, ds.labels("60")[[0, 5, 7]])
    assert x.min() >= -1.0 - 1e-6 and x.max() <= 1.0 + 1e-6
    assert x.min() == pytest.approx(-1.0)  # background (0 pixels) -> (0 - 0.5) / 0.5
    assert x.max() > 0.5  # ink
    x0, y0 = ds.load("0", np.zeros(0, dtype=np.int64))
    assert x0.shape == (0, 1, 28, 28) and y0.shape == (0,)


def test_rotated_digits_rotation_is_applied():
    from fedtune.data.digits import read_digits, render

    ds = get_dataset("rotated-digits")
    images, _ = read_digits()
    idx = np.arange(5)
    src = images[ds.members("45")[idx]]
    x45, _ = ds.load("45", idx)
    np.testing.assert_allclose(x45, render(src, 45), atol=1e-6)
    assert np.abs(x45 - render(src, 0)).max() > 1.0  # the rotation really changed pixels
    # domain "0" is the unrotated upsampled digit
    x0, _ = ds.load("0", idx)
    np.testing.assert_allclose(x0, render(images[ds.members("0")[idx]], 0), atol=1e-6)
    # hand-checkable: a 90 degree rotation is np.rot90 (counter-clockwise) of the upright image
    up = render(src, 0)
    np.testing.assert_allclose(render(src, 90), np.rot90(up, 1, axes=(2, 3)), atol=1e-4)


def test_bad_domain_and_indices():
    ds = get_dataset("rotated-digits")
    with pytest.raises(DataError, match="domain '90' is not in dataset 'rotated-digits'; choose one of: 0, 15"):
        ds.labels("90")
    with pytest.raises(DataError, match=r"indices must lie in \[0, 300\)"):
        ds.load("0", np.array([300]))


# ----------------------------------------------------------------------------- rect4
def test_rect4_info_and_shapes():
    ds = get_dataset("rect4")
    info = ds.info
    assert info.domains == ("d0", "d1", "d2", "d3")
    assert info.classes == ("neg", "pos") and info.input_shape == (2,)
    assert (info.default_model, info.default_setting) == ("mlp", "fdg")
    x, y = ds.load("d2", np.arange(500))
    assert x.shape == (500, 2) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1}
    # fixed standardisation: (x / 8, y / 4) keeps the global boundary at y = 0
    np.testing.assert_allclose(x, ds.raw_points("d2") / np.array([8.0, 4.0]), rtol=1e-6)


def test_rect4_domains_differ_and_span_global_boundary():
    from fedtune.data.rect4 import DOMAINS

    ds = get_dataset("rect4")
    centres = []
    for d, (x_lo, x_hi, h, c, _) in DOMAINS.items():
        p = ds.raw_points(d)
        assert p[:, 0].min() >= x_lo and p[:, 0].max() <= x_hi
        assert p[:, 1].min() < 0 < p[:, 1].max() and np.abs(p[:, 1]).max() <= h
        assert x_lo < c < x_hi
        centres.append(p[:, 0].mean())
    assert np.all(np.diff(centres) > 1.0)  # spread along x


def test_rect4_labels_majority_global_and_local_noise():
    from fedtune.data.rect4 import DOMAINS

    ds = get_dataset("rect4", data_seed=0)
    for d, (_, _, _, c, noise) in DOMAINS.items():
        p, y, noisy = ds.raw_points(d), ds.labels(d), ds.noisy_mask(d)
        glob = (p[:, 1] > 0).astype(np.int64)
        local = (p[:, 0] > c).astype(np.int64)
        assert noisy.mean() == pytest.approx(noise, abs=0.005)
        np.testing.assert_array_equal(y[~noisy], glob[~noisy])
        np.testing.assert_array_equal(y[noisy], local[noisy])
        agree = (y == glob).mean()
        assert agree > 0.8  # the global rule is the majority rule
        # local and global disagree on about half of the noisy points
        assert 1 - agree == pytest.approx(noise / 2, abs=0.05)
        # and the local rule explains the labels better than chance where they differ
        assert (y == local).mean() > 0.5


def test_rect4_seeded():
    a, b, c = (get_dataset("rect4", data_seed=s) for s in (4, 4, 5))
    np.testing.assert_array_equal(a.load("d1", np.arange(500))[0], b.load("d1", np.arange(500))[0])
    assert not np.array_equal(a.raw_points("d1"), c.raw_points("d1"))


def test_load_pieces_concatenates():
    ds = get_dataset("rect4")
    x, y = ds.load_pieces({"d0": np.array([1, 2]), "d3": np.array([0])})
    assert x.shape == (3, 2)
    np.testing.assert_array_equal(y, np.concatenate([ds.labels("d0")[[1, 2]], ds.labels("d3")[[0]]]))


# ----------------------------------------------------------------------------- image folders
def _make_tree(root: Path) -> None:
    """dA: cat (grey PNG 20x10, RGB JPG 7x9 upper-case ext), dog (red PNG 30x30);
    dB: dog (RGB JPG), zebra (white grey PNG); plus files that must be ignored."""
    from PIL import Image

    (root / "dA" / "cat").mkdir(parents=True)
    (root / "dA" / "dog").mkdir(parents=True)
    (root / "dB" / "dog").mkdir(parents=True)
    (root / "dB" / "zebra").mkdir(parents=True)
    Image.new("L", (20, 10), 0).save(root / "dA" / "cat" / "b.png")
    Image.new("RGB", (7, 9), (10, 200, 30)).save(root / "dA" / "cat" / "a.JPG")
    Image.new("RGB", (30, 30), (255, 0, 0)).save(root / "dA" / "dog" / "z.png")
    (root / "dA" / "dog" / "notes.txt").write_text("not an image")
    (root / "dA" / "dog" / ".hidden.png").write_bytes(b"")
    Image.new("RGB", (40, 24), (0, 0, 255)).save(root / "dB" / "dog" / "x.jpeg")
    Image.new("L", (5, 5), 255).save(root / "dB" / "zebra" / "w.bmp")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    _make_tree(root)
    return root


def test_folder_layout(tree):
    ds = get_dataset("folder", root=tree, image_size=16)
    info = ds.info
    assert info.domains == ("dA", "dB")
    assert info.classes == ("cat", "dog", "zebra")
    assert info.input_shape == (3, 16, 16)
    assert (info.default_model, info.default_setting) == ("cnn", "fdg")
    assert ds.files("dA") == ["cat/a.JPG", "cat/b.png", "dog/z.png"]  # (class, filename)
    assert ds.files("dB") == ["dog/x.jpeg", "zebra/w.bmp"]
    np.testing.assert_array_equal(ds.labels("dA"), [0, 0, 1])
    np.testing.assert_array_equal(ds.labels("dB"), [1, 2])
    assert ds.labels("dA").dtype == np.int64


def test_folder_load_pixels(tree):
    ds = get_dataset("folder", root=tree, image_size=16)
    x, y = ds.load("dA", np.array([1, 2]))
    assert x.shape == (2, 3, 16, 16) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_array_equal(y, [0, 1])
    black = (0 - IMAGENET_MEAN) / IMAGENET_STD  # grey PNG, value 0 -> RGB black
    red = (np.array([1, 0, 0], np.float32) - IMAGENET_MEAN) / IMAGENET_STD
    np.testing.assert_allclose(x[0], np.broadcast_to(black[:, None, None], (3, 16, 16)), atol=1e-5)
    np.testing.assert_allclose(x[1], np.broadcast_to(red[:, None, None], (3, 16, 16)), atol=1e-5)
    x, _ = ds.load("dB", np.array([1]))
    white = (1 - IMAGENET_MEAN) / IMAGENET_STD
    np.testing.assert_allclose(x[0, :, 3, 3], white, atol=1e-5)
    x, _ = ds.load("dB", np.array([0]))  # JPEG blue, approximately
    assert x[0, 2].mean() > 1.5 and x[0, 0].mean() < -1.5


def test_folder_default_image_size_is_64(tree):
    ds = get_dataset("folder", root=tree)
    assert ds.info.input_shape == (3, 64, 64)
    assert ds.load("dA", np.array([0]))[0].shape == (1, 3, 64, 64)


def test_folder_errors(tmp_path):
    with pytest.raises(DataError, match=r"does not exist.*<domain>/<class>/<image>"):
        get_dataset("folder", root=tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"no domain directories.*<domain>/<class>/<image>"):
        get_dataset("folder", root=empty)
    (empty / "d1" / "c1").mkdir(parents=True)
    (empty / "d1" / "c1" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match=r"domain 'd1' .* holds no images.*<domain>/<class>/<image>"):
        get_dataset("folder", root=empty)


def test_domainbed_name_missing_subdir(tmp_path):
    with pytest.raises(DataError, match=r"office_home.*does not exist.*DIR/office_home/<domain>/<class>/<image>"):
        get_dataset("office-home", root=tmp_path)


@pytest.mark.skipif(not PACS64.exists(), reason=f"{PACS64} not present")
def test_pacs64():
    ds = get_dataset("pacs", root=PACS64)
    info = ds.info
    assert info.domains == ("art_painting", "cartoon", "photo", "sketch")
    assert len(info.classes) == 7 and info.classes[0] == "dog"
    counts = {d: len(ds.labels(d)) for d in info.domains}
    assert counts == {"art_painting": 2048, "cartoon": 2344, "photo": 1670, "sketch": 3929}
    x, y = ds.load("sketch", np.array([0, 1000, 3928]))
    assert x.shape == (3, 3, 64, 64) and x.dtype == np.float32
    np.testing.assert_array_equal(y, ds.labels("sketch")[[0, 1000, 3928]])
    assert np.isfinite(x).all() and x.std() > 0.1


# ----------------------------------------------------------------------------- torchvision
def _write_idx(raw: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    n, h, w = images.shape
    head = b"".join(int(v).to_bytes(4, "big") for v in (2051, n, h, w))
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(head + images.astype(np.uint8).tobytes())
    head = b"".join(int(v).to_bytes(4, "big") for v in (2049, n))
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(head + labels.astype(np.uint8).tobytes())


def test_mnist_missing_root_error(tmp_path):
    with pytest.raises(DataError) as e:
        get_dataset("mnist", root=tmp_path)
    msg = str(e.value)
    assert "MNIST/raw/train-images-idx3-ubyte" in msg and "t10k-images-idx3-ubyte" in msg


def test_cifar10_missing_root_error(tmp_path):
    with pytest.raises(DataError, match=r"cifar-10-batches-py/data_batch_1\.\.5, test_batch"):
        get_dataset("cifar10", root=tmp_path)


def test_mnist_tiny_idx_train_then_test(tmp_path):
    tr = np.zeros((3, 28, 28), np.uint8)
    tr[0, 0, 0] = 255
    te = np.full((2, 28, 28), 255, np.uint8)
    _write_idx(tmp_path / "MNIST" / "raw", "train", tr, np.array([7, 1, 2]))
    _write_idx(tmp_path / "MNIST" / "raw", "t10k", te, np.array([9, 4]))
    ds = get_dataset("mnist", root=str(tmp_path))
    info = ds.info
    assert info.domains == ("mnist",) and info.input_shape == (1, 28, 28)
    assert (info.default_setting, info.default_model) == ("fl", "cnn")
    assert info.num_classes == 10
    np.testing.assert_array_equal(ds.labels("mnist"), [7, 1, 2, 9, 4])  # train, then test
    x, y = ds.load("mnist", np.array([0, 4]))
    assert x.shape == (2, 1, 28, 28) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_array_equal(y, [7, 4])
    assert x[0, 0, 0, 0] == 1.0 and x[0, 0, 0, 1] == -1.0 and (x[1] == 1.0).all()


def test_emnist_tiny_is_transposed_upright(tmp_path):
    tr = np.zeros((1, 28, 28), np.uint8)
    tr[0, 0, 5] = 255  # row 0, column 5 as stored
    _write_idx(tmp_path / "EMNIST" / "raw", "emnist-mnist-train", tr, np.array([3]))
    _write_idx(tmp_path / "EMNIST" / "raw", "emnist-mnist-test", tr, np.array([5]))
    ds = get_dataset("emnist", root=tmp_path)
    np.testing.assert_array_equal(ds.labels("emnist"), [3, 5])
    x, _ = ds.load("emnist", np.array([0]))
    assert x[0, 0, 5, 0] == 1.0 and x[0, 0, 0, 5] == -1.0


# ----------------------------------------------------------------------------- bounded, readable input
@pytest.mark.parametrize("dataset", ["folder", "pacs", "mnist"])
def test_a_data_root_the_os_cannot_look_up_is_one_data_error(tmp_path, dataset):
    root = tmp_path / ("z" * 300)  # one name longer than any file system allows
    with pytest.raises(DataError, match=r"field 'data_root': cannot look up '.*\.\.\..*': File name too long; allowed") as exc:
        get_dataset(dataset, root=root)
    assert len(str(exc.value)) < 400


def test_unknown_names_are_shown_cut_short():
    from fedtune.data.partition import make_plan

    with pytest.raises(DataError, match="is unknown; choose one of") as exc:
        get_dataset("q" * 100_000)
    assert len(str(exc.value)) < 500
    ds = get_dataset("rect4")
    labels = {d: ds.labels(d) for d in ds.info.domains}
    with pytest.raises(DataError, match="is not a domain of") as exc:
        make_plan(ds.info, labels, setting="fdg", target_domain="q" * 100_000)
    assert len(str(exc.value)) < 500
    with pytest.raises(DataError, match="is not in dataset") as exc:
        ds.labels("q" * 100_000)
    assert len(str(exc.value)) < 500


def test_an_unreadable_image_file_is_a_data_error_naming_it(tree, tmp_path, monkeypatch):
    """Root reads any file, so the permission error is made where PIL opens the file."""
    from PIL import Image

    real = Image.open

    def open_(path, *args, **kwargs):
        if Path(path).name == "z.png":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Image, "open", open_)
    ds = get_dataset("folder", root=tree, image_size=8, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"cannot decode image '.*dog/z.png'.*Permission denied"):
        ds.pixels("dA")
    assert not list((tmp_path / "cache").glob("*.npy"))  # nothing half-built is left to be read


def test_an_image_cache_larger_than_the_free_space_is_refused_before_writing(tree, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 20, 9 << 20, 1 << 20))
    ds = get_dataset("folder", root=tree, image_size=512, cache_dir=tmp_path / "cache")  # 3 images: 2.3 MB
    with pytest.raises(DataError, match=r"field 'image_size': the image cache of 3 images at 512 px needs 2.3 MiB "
                                        r"but .* has 1.0 MiB free; allowed: a smaller image_size"):
        ds.pixels("dA")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.suffix in (".npy", ".json")]


def test_a_disk_that_fills_while_the_cache_is_written_is_one_data_error(tree, tmp_path, monkeypatch):
    import errno
    import os

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    ds = get_dataset("folder", root=tree, image_size=8, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"field 'cache_dir': the image cache .* could not be written \(No space left"):
        ds.pixels("dA")
    assert not [p for p in (tmp_path / "cache").iterdir() if ".npy" in p.name]  # the partial file is gone
