"""The paper-scale input path: the decoded-image cache, batches fetched from it, DomainBed's
augmentation, the client optimisers and precisions (fedtune.data.cache, fedtune.runtime.examples,
fedtune.runtime.augment, fedtune.algorithms.client.optim / precision)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedtune.algorithms.client.optim import LocalAdam, LocalSGD
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.errors import DataError
from fedtune.data.registry import get_dataset
from fedtune.data.cache import build_log, cache_entry, check_cache
from fedtune.results.store import load
from fedtune.runtime.driver import run
from fedtune.runtime.augment import (DomainBedAugment, adjust_brightness, adjust_contrast, adjust_hue,
                                     adjust_saturation)
from fedtune.runtime.examples import CachedImages, client_examples

ROOT = Path(__file__).resolve().parents[2]


def image_tree(root: Path, domains=("a", "b", "c"), classes=("cat", "dog"), per_class: int = 10, size: int = 20) -> Path:
    """``root/<domain>/<class>/<i>.png`` of random RGB images (class-dependent mean colour)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in domains:
        for ci, c in enumerate(classes):
            (root / d / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = np.clip(rng.normal(60 + 120 * ci, 50, (size, size, 3)), 0, 255).astype("uint8")
                Image.fromarray(img).save(root / d / c / f"{i}.png")
    return root


def decode_reference(path: Path, size: int) -> np.ndarray:
    """PIL's RGB bilinear resize, written out here: what the cache must hold."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        if im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


# ------------------------------------------------------------------------------------ the cache
def test_the_cache_holds_the_decoded_images_and_load_normalises_them(tmp_path):
    root = image_tree(tmp_path / "ds", per_class=3)
    ds = get_dataset("folder", root=root, image_size=16, cache_dir=tmp_path / "cache")
    pixels = ds.pixels("b").array
    assert pixels.shape == (6, 16, 16, 3) and pixels.dtype == np.uint8 and not pixels.flags.writeable
    files = ds.files("b")
    for i in (0, 4):
        np.testing.assert_array_equal(pixels[i], decode_reference(root / "b" / files[i], 16))
    x, y = ds.load("b", np.array([4, 0]))
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expect = ((decode_reference(root / "b" / files[4], 16) / 255.0 - mean) / std).transpose(2, 0, 1)
    np.testing.assert_allclose(x[0], expect, atol=1e-5)
    assert list(y) == [1, 0]
    log = build_log(tmp_path / "cache")
    assert [r["images"] for r in log] == [6]  # only the domain that was read was decoded


def test_a_modified_image_invalidates_the_cache(tmp_path):
    from PIL import Image

    root = image_tree(tmp_path / "ds", per_class=3)
    cache = tmp_path / "cache"
    before = np.array(get_dataset("folder", root=root, image_size=16, cache_dir=cache).pixels("a").array[2])
    target = root / "a" / "cat" / "2.png"
    Image.fromarray(np.full((20, 20, 3), 7, np.uint8)).save(target)
    after = get_dataset("folder", root=root, image_size=16, cache_dir=cache).pixels("a").array
    assert not np.array_equal(before, after[2]) and (after[2] == 7).all()
    assert len(build_log(cache)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip-bytes", "drop-record", "garbage-record"])
def test_a_damaged_cache_is_rebuilt_never_read(tmp_path, damage):
    root = image_tree(tmp_path / "ds", per_class=3)
    cache = tmp_path / "cache"
    ds = get_dataset("folder", root=root, image_size=16, cache_dir=cache)
    good = np.array(ds.pixels("a").array)
    entry = cache_entry(cache, dataset="folder", domain="a", root=root / "a", files=ds.files("a"), image_size=16)
    assert check_cache(entry) is None
    if damage == "truncate":
        with open(entry.array_path, "r+b") as f:
            f.truncate(entry.array_path.stat().st_size - 100)
        assert "truncated" in check_cache(entry)
    elif damage == "flip-bytes":
        raw = bytearray(entry.array_path.read_bytes())
        raw[200:260] = bytes(255 - b for b in raw[200:260])
        entry.array_path.write_bytes(bytes(raw))
        assert "corrupt" in check_cache(entry)
    elif damage == "drop-record":
        entry.record_path.unlink()
        assert check_cache(entry) == "not built"
    else:
        entry.record_path.write_text("{not json")
        assert "unreadable" in check_cache(entry)
    again = get_dataset("folder", root=root, image_size=16, cache_dir=cache).pixels("a").array
    np.testing.assert_array_equal(again, good)
    assert check_cache(entry) is None and len(build_log(cache)) == 2


_RACE = textwrap.dedent("""
    import dataclasses, sys, time
    from pathlib import Path
    from fedtune.data.cache import cache_entry, cached_images
    cache, me, other = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    entry = cache_entry(cache, dataset="race", domain="d", root=cache.parent / "src", files=["x.bin"], image_size=8)
    entry = dataclasses.replace(entry, num_images=40)  # 40 synthetic "images"
    def decode(i, out):
        time.sleep(0.02)  # slow enough that the other process arrives while this one builds
        out[...] = (i * 7) % 251
    me.write_text("ready")
    while not other.exists():
        time.sleep(0.005)
    arr = cached_images(entry, decode, threads=2).array
    print(int(arr.sum()), arr.shape)
""")


def test_two_processes_building_one_cache_at_once_end_with_one_valid_cache(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.bin").write_bytes(b"1")
    script = tmp_path / "race.py"
    script.write_text(_RACE)
    cache = tmp_path / "cache"
    a, b = tmp_path / "a.ready", tmp_path / "b.ready"
    procs = [subprocess.Popen([sys.executable, str(script), str(cache), str(me), str(other)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT) for me, other in ((a, b), (b, a))]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    expected = sum(((i * 7) % 251) * 8 * 8 * 3 for i in range(40))
    assert outs == [f"{expected} (40, 8, 8, 3)"] * 2
    assert len(build_log(cache)) == 1  # one process decoded, the other waited and read it
    assert not list(cache.glob("*.tmp*")) and not list(cache.glob(".*tmp*"))


def test_an_unwritable_cache_dir_is_one_clear_error(tmp_path):
    root = image_tree(tmp_path / "ds", per_class=2)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DataError, match="field 'cache_dir': cannot write the image cache in .*set cache_dir"):
        get_dataset("folder", root=root, image_size=8, cache_dir=blocker / "sub").pixels("a")


def test_an_unreadable_class_folder_is_a_data_error(tmp_path, monkeypatch):
    import os

    root = image_tree(tmp_path / "ds", per_class=2)
    real = os.scandir

    def scandir(path):  # what a folder without read permission gives a non-root user
        if Path(path) == root / "a" / "dog":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr("fedtune.data.folder.os.scandir", scandir)
    with pytest.raises(DataError, match="cannot list .*dog.*Permission denied.*readable"):
        get_dataset("folder", root=root)


# ------------------------------------------------------------------------------- batches
def test_cached_examples_gather_batches_across_domains_and_hold_only_indices(tmp_path):
    root = image_tree(tmp_path / "ds", per_class=4)
    ds = get_dataset("folder", root=root, image_size=16, cache_dir=tmp_path / "cache")
    pieces = {"a": np.array([1, 5]), "c": np.array([0, 7, 3])}
    ex = client_examples(ds, pieces)
    assert isinstance(ex, CachedImages) and len(ex) == 5 and ex.input_shape == (3, 16, 16)
    x_ref, y_ref = ds.load_pieces(pieces)
    x, y = ex.batch(torch.tensor([4, 0, 2]))
    np.testing.assert_allclose(x.numpy(), x_ref[[4, 0, 2]], atol=1e-5)
    assert y.tolist() == y_ref[[4, 0, 2]].tolist()
    streamed = torch.cat([b[0] for b in ex.batches(2)])
    np.testing.assert_allclose(streamed.numpy(), x_ref, atol=1e-5)
    lo, hi = ex.value_range()
    np.testing.assert_allclose(lo.numpy(), x_ref.min(axis=(0, 2, 3)), atol=1e-5)
    np.testing.assert_allclose(hi.numpy(), x_ref.max(axis=(0, 2, 3)), atol=1e-5)
    # nothing but indices and labels is held per image
    held = ex.piece.nbytes + ex.row.nbytes + ex.labels.numel() * 8
    assert held == 5 * (4 + 8 + 8)


# --------------------------------------------------------------------------- augmentation
def test_colour_jitter_kernels_equal_torchvision_per_image():
    from torchvision.transforms.v2 import functional as TF

    x = torch.rand(5, 3, 12, 14, generator=torch.Generator().manual_seed(0))
    factors = torch.tensor([0.7, 1.3, 1.0, 0.85, 1.2])
    hues = torch.tensor([-0.3, 0.3, 0.0, 0.11, -0.05])
    for mine, ref, f in [(adjust_brightness, TF.adjust_brightness, factors), (adjust_contrast, TF.adjust_contrast, factors),
                         (adjust_saturation, TF.adjust_saturation, factors), (adjust_hue, TF.adjust_hue, hues)]:
        out = mine(x.clone(), f)
        expect = torch.stack([ref(x[i], float(f[i])) for i in range(5)])
        assert (out - expect).abs().max() < 1e-5, mine.__name__


def test_crop_flip_and_grey_equal_torchvision_per_image():
    from torchvision.transforms.v2 import functional as TF

    g = torch.Generator().manual_seed(3)
    x = torch.rand(8, 3, 24, 24, generator=g)
    aug = DomainBedAugment()
    p = aug.params(8, 24, 24, g)
    p["factors"][:] = torch.tensor([1.0, 1.0, 1.0, 0.0])  # identity jitter isolates the geometry
    p["grey"][:3] = True
    out = aug.apply(x, p)
    for i in range(8):
        top, left, h, w = (int(v) for v in p["boxes"][i])
        ref = TF.resized_crop(x[i], top, left, h, w, [24, 24], antialias=False)
        if p["flip"][i]:
            ref = TF.horizontal_flip(ref)
        if p["grey"][i]:
            ref = TF.rgb_to_grayscale(ref, num_output_channels=3)
        assert (out[i] - ref).abs().max() < 1e-5, i


def test_crop_parameters_follow_random_resized_crop_and_differ_per_image():
    aug = DomainBedAugment()
    boxes = aug.crop_boxes(4000, 224, 224, torch.Generator().manual_seed(0))
    top, left, h, w = boxes.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (top + h <= 224) & (left + w <= 224)).all())
    area = h * w / 224 ** 2
    assert area.min() > 0.69 and area.max() <= 1.0 and 0.8 < area.mean() < 0.9
    ratio = w / h
    assert ratio.min() > 0.74 and ratio.max() < 1.35
    assert len({tuple(b.tolist()) for b in boxes[:32]}) > 25  # per image, not one crop per batch
    p = aug.params(4000, 224, 224, torch.Generator().manual_seed(1))
    assert 0.47 < p["flip"].double().mean() < 0.53 and 0.08 < p["grey"].double().mean() < 0.12
    assert len({tuple(o.tolist()) for o in p["order"]}) == 24  # every jitter order occurs
    f = p["factors"]
    assert f[:, :3].min() >= 0.7 and f[:, :3].max() <= 1.3 and f[:, 3].abs().max() <= 0.3


def test_augmentation_is_a_function_of_the_generator_only():
    x = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    aug = DomainBedAugment()
    a = aug(x, torch.Generator().manual_seed(9))
    b = aug(x, torch.Generator().manual_seed(9))
    c = aug(x, torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 1


# ------------------------------------------------------------------------- runs end to end
def folder_cfg(tmp_path, root, **kw) -> FederatedRunConfig:
    base = {"dataset": "folder", "data_root": str(root), "image_size": 16, "rounds": 2, "local_steps": 2,
            "batch_size": 8, "output": str(tmp_path / "out"), "backend": "local", "cache_dir": str(tmp_path / "cache"),
            "oracle_fraction": 0.0}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


METRICS = ("train_loss", "val_acc", "val_loss", "target_acc", "target_loss")


def metrics_of(result) -> list[tuple]:
    return [tuple(r[m] for m in METRICS) for r in load(result.trial_dir.parent.parent, "rounds").to_pylist()
            if r["trial_id"] == result.trial_id]


def test_augment_auto_is_domainbed_on_domainbed_datasets_only(tmp_path):
    """Issue 27 defect 8: auto is DomainBed's augmentation on pacs/vlcs/... only, none on a generic
    folder (a flip may change a folder's labels) and elsewhere; the trial id names what ran."""
    root = image_tree(tmp_path / "ds", per_class=2)
    assert folder_cfg(tmp_path, root).effective_augment == "none"
    assert folder_cfg(tmp_path, root, augment="domainbed").effective_augment == "domainbed"  # still allowed
    assert folder_cfg(tmp_path, root).trial_id() == folder_cfg(tmp_path, root, augment="none").trial_id()
    assert folder_cfg(tmp_path, root).trial_id() != folder_cfg(tmp_path, root, augment="domainbed").trial_id()
    pacs = folder_cfg(tmp_path, root, dataset="pacs")
    assert pacs.effective_augment == "domainbed"
    assert pacs.trial_id() == folder_cfg(tmp_path, root, dataset="pacs", augment="domainbed").trial_id()
    assert {FederatedRunConfig.from_dict({"dataset": d, "data_root": "x"}).effective_augment
            for d in ("vlcs", "office-home", "terra_incognita", "domain-net")} == {"domainbed"}
    assert FederatedRunConfig.from_dict({}).trial_id() == FederatedRunConfig.from_dict({"augment": "none"}).trial_id()
    assert FederatedRunConfig.from_dict({}).effective_augment == "none"
    with pytest.raises(ConfigError, match="field 'augment': domainbed applies to image-folder datasets"):
        FederatedRunConfig.from_dict({"augment": "domainbed"})


def test_augmentation_changes_training_but_never_evaluation(tmp_path):
    root = image_tree(tmp_path / "ds", per_class=6)
    res = {a: run(folder_cfg(tmp_path, root, augment=a, name=a, rounds=1), progress=False) for a in ("none", "domainbed")}
    rows = {a: load(tmp_path / "out" / a, "rounds").to_pylist()[0] for a in res}
    assert rows["none"]["train_loss"] != rows["domainbed"]["train_loss"]
    assert all(math.isfinite(rows[a]["val_acc"]) for a in rows)


def test_evaluation_never_augments(tmp_path):
    """The same weights give the same evaluation with or without training augmentation."""
    from fedtune.runtime.driver import build_plan
    from fedtune.runtime.worker import ClientWorker

    root = image_tree(tmp_path / "ds", per_class=6)
    replies = []
    for a in ("none", "domainbed"):
        cfg = folder_cfg(tmp_path, root, augment=a)
        worker = ClientWorker(cfg.to_dict(), list(build_plan(cfg).clients))
        weights = worker.initial_state()[0]
        reply = worker.evaluate(weights)
        replies.append([(c.correct, c.count, c.loss_sum) for c in reply.val])
    assert replies[0] == replies[1]


@pytest.mark.parametrize("extra", [{"local_optimizer": "adam", "local_lr": 5e-4}, {"precision": "bf16"},
                                   {"local_optimizer": "adam", "local_lr": 5e-4, "precision": "bf16",
                                    "algorithm": "fedgala"},
                                   {"local_optimizer": "adam", "local_lr": 5e-4, "algorithm": "fedprox"},
                                   {"local_optimizer": "adam", "local_lr": 5e-4, "algorithm": "fedsam"},
                                   {"local_optimizer": "adam", "local_lr": 5e-4, "algorithm": "gfm",
                                    "precision": "bf16"}])
def test_adam_and_bf16_runs_train_and_record_what_ran(tmp_path, extra):
    root = image_tree(tmp_path / "ds", per_class=4)
    res = run(folder_cfg(tmp_path, root, **extra), progress=False)
    rows = load(tmp_path / "out" / "default", "rounds").to_pylist()
    assert res.status == "completed" and len(rows) == 2
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    trial = load(tmp_path / "out" / "default", "trials").to_pylist()[0]
    assert trial["hp.local_optimizer"] == extra.get("local_optimizer", "sgd")


def test_fp16_and_its_incompatible_methods_are_refused_up_front(tmp_path):
    root = image_tree(tmp_path / "ds", per_class=2)
    with pytest.raises(ConfigError, match="field 'precision': fp16 needs CUDA clients"):
        folder_cfg(tmp_path, root, precision="fp16")
    with pytest.raises(ConfigError, match="field 'precision': fp16 is not available with client method sam"):
        folder_cfg(tmp_path, root, precision="fp16", client_gpus=1, algorithm="fedsam")


def test_fp16_on_a_cpu_client_is_refused_by_the_client(tmp_path):
    from fedtune.algorithms.client.precision import check_device

    with pytest.raises(ConfigError, match="fp16 needs a CUDA device, but this client runs on cpu"):
        check_device("fp16", "cpu")


# ------------------------------------------------------------------------------ optimisers
def test_local_adam_is_torch_adam_step_for_step():
    torch.manual_seed(0)
    w0 = torch.randn(4, 3)
    mine, ref = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    opt = LocalAdam([mine], lr=0.01, weight_decay=0.1)
    torch_opt = torch.optim.Adam([ref], lr=0.01, weight_decay=0.1)
    for step in range(5):
        g = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        mine.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    assert torch.equal(mine, ref)


def test_local_adam_skipped_tensors_keep_their_moments():
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    opt = LocalAdam([a, b], lr=0.1)
    a.grad, b.grad = torch.ones(2), torch.ones(2)
    opt.step_tensors([0])
    assert torch.equal(b, torch.ones(2)) and float(opt.steps[1]) == 0 and float(opt.steps[0]) == 1
    assert not torch.equal(a, torch.ones(2))


def test_gala_gates_adam_steps_too():
    from fedtune.algorithms.client.gala import GatedAdam

    w, z = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt = GatedAdam([w, z], lr=0.1, reference=[torch.ones(2), torch.ones(2)], tau=0.0)
    w.grad = torch.tensor([-1.0, -1.0])  # descent direction +1 agrees with r = +1: steps
    z.grad = torch.tensor([1.0, 1.0])  # descent direction −1 disagrees: skipped
    opt.step()
    assert (w > 0).all() and torch.equal(z, torch.zeros(2)) and opt.skipped == 1


def test_fp16_gradient_scaler_step_equals_the_unscaled_step():
    """descend with a GradScaler (the fp16 path; CPU scaler here) takes the same SGD step as without."""
    from fedtune.algorithms.client.method import descend

    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    model = torch.nn.Linear(5, 3)
    twin = torch.nn.Linear(5, 3)
    twin.load_state_dict(model.state_dict())
    plain, scaled = LocalSGD(model.parameters(), lr=0.1, momentum=0.9), LocalSGD(twin.parameters(), lr=0.1, momentum=0.9)
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    recorded = []
    for _ in range(3):
        descend(plain, F.cross_entropy(model(x), y), lambda p, g: None)
        descend(scaled, F.cross_entropy(twin(x), y), lambda p, g: recorded.append(g[0].clone()))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    assert len(recorded) == 3 and recorded[0].abs().max() < 10  # recorded gradients are unscaled
    # an overflowing scale skips the step and lowers the scale
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=1e38)
    before = [p.detach().clone() for p in twin.parameters()]
    descend(scaled, F.cross_entropy(twin(x), y) * 1e10, lambda p, g: None)
    assert all(torch.equal(a, b) for a, b in zip(before, twin.parameters()))
    assert scaled.scaler.get_scale() < 1e38


# ------------------------------------------------------------------------ the paper-setup preset
def test_the_paper_setup_preset_and_its_spaces_validate(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights

    from fedtune.weight_files import weights_file
    from fedtune.spaces.lookup import load_space

    import hashlib

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    body, member = b"placeholder", ResNet18_Weights.IMAGENET1K_V1  # validation checks the file is there and its
    monkeypatch.setattr(member.value, "url",  # SHA-256 prefix is its name's: the name is made to say this one's
                        member.url.replace("f37072fd", hashlib.sha256(body).hexdigest()[:8]))
    path = weights_file(member)
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    root = tmp_path / "data"
    image_tree(root / "PACS", domains=("art_painting", "cartoon", "photo", "sketch"), per_class=1,
               classes=("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"), size=8)
    preset = ROOT / "examples" / "paper-setup" / "pacs-resnet18.yaml"
    cfg = FederatedRunConfig.from_yaml(preset, {"data_root": str(root)})
    assert (cfg.model, cfg.weights, cfg.image_size, cfg.effective_augment) == ("resnet18", "IMAGENET1K_V1", 224, "domainbed")
    for space_file in sorted((ROOT / "examples" / "paper-setup").glob("*.yaml")):
        if space_file.name == preset.name:
            continue
        space = load_space(str(space_file))
        defaults = space.defaults()
        assert defaults["local_optimizer"] == "adam" and defaults["local_lr"] == 5e-5, space_file.name
        FederatedRunConfig.from_dict({**cfg.to_dict(), **defaults, "params": {}})


def _mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:
            inside = len(fields) >= 6 and fields[-1] == str(path)
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1]) * 1024
    return total


def test_a_client_does_not_keep_the_cache_pages_it_read_resident(tmp_path):
    root = image_tree(tmp_path / "ds", domains=("a", "b"), per_class=200, size=64)
    ds = get_dataset("folder", root=root, image_size=64, cache_dir=tmp_path / "cache")
    ex = client_examples(ds, {"a": np.arange(400)})
    path = next((tmp_path / "cache").glob("folder-a-*.npy"))
    size = 400 * 64 * 64 * 3  # 4.9 MB
    for _ in ex.batches(32):
        pass
    # what stays mapped is bounded by a batch and the kernel's fault-around, not the data read
    assert _mapped_rss(path) < 0.2 * size
    np.asarray(ex.maps[0].array).sum()  # touching the map directly does make it all resident
    assert _mapped_rss(path) >= 0.9 * size
