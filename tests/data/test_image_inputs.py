"""Image folders and the decoded-image cache under bad or surprising input (issue 27, defect 8 and
its neighbours): the default augmentation and a run's first lines, a suspended cache builder, PIL
decoder errors and symbolic-link loops, damage anywhere in a cache, an image edited in place, a
DomainBed dataset with a domain missing, a killed builder's temporary file, cache_dir naming a file."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fedtune.config import FederatedRunConfig
from fedtune.data import cache as cache_mod
from fedtune.data.cache import build_log, cache_entry, cached_images, check_cache, open_cache
from fedtune.data.cache_lock import remove_stale_temporaries
from fedtune.data.registry import get_dataset
from fedtune.errors import DataError
from fedtune.runtime.run_notes import run_notes

ROOT = Path(__file__).resolve().parents[2]
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def image_tree(root: Path, domains=("a", "b"), classes=("cat", "dog"), per_class: int = 2, size: int = 12,
               ext: str = "png") -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in domains:
        for ci, c in enumerate(classes):
            (root / d / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = np.clip(rng.normal(60 + 120 * ci, 50, (size, size, 3)), 0, 255).astype("uint8")
                Image.fromarray(img).save(root / d / c / f"{i}.{ext}")
    return root


def listed_tree(root: Path, domains, classes) -> Path:
    """Empty ``.jpg`` files: enough for a dataset that only lists its files."""
    for d in domains:
        for c in classes:
            (root / d / c).mkdir(parents=True, exist_ok=True)
            (root / d / c / "0.jpg").write_bytes(b"")
    return root


def synthetic_entry(cache: Path, n: int, size: int):
    """A cache entry of ``n`` synthetic images (the decoder below), keyed on one placeholder file."""
    src = cache.parent / "src"
    src.mkdir(parents=True, exist_ok=True)
    if not (src / "x.bin").exists():  # written once: its mtime is part of the key
        (src / "x.bin").write_bytes(b"1")
    entry = cache_entry(cache, dataset="synthetic", domain="d", root=src, files=["x.bin"], image_size=size)
    return dataclasses.replace(entry, num_images=n)


def synthetic_decode(i: int, out: np.ndarray) -> None:
    out[...] = (np.arange(out.size, dtype=np.int64).reshape(out.shape) * 7 + i) % 251


def expected_pixels(n: int, size: int) -> np.ndarray:
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        synthetic_decode(i, out[i])
    return out


# ---------------------------------------------------------------- the default augmentation
def test_a_run_says_first_which_augmentation_runs(tmp_path, capsys):
    from fedtune.runtime.driver import run

    root = image_tree(tmp_path / "ds", domains=("a", "b", "c"), per_class=3)
    cfg = FederatedRunConfig.from_dict({
        "dataset": "folder", "data_root": str(root), "image_size": 8, "rounds": 1, "local_steps": 1,
        "batch_size": 4, "backend": "local", "output": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"),
        "oracle_fraction": 0.0})
    run(cfg, progress=False)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("fedtune: augmentation: none (augment=auto: DomainBed's augmentation runs on "
                            "DomainBed's own datasets only; set augment=domainbed")
    pacs = listed_tree(tmp_path / "data" / "PACS", ("art_painting", "cartoon", "photo", "sketch"), PACS_CLASSES)
    notes = run_notes(FederatedRunConfig.from_dict({"dataset": "pacs", "data_root": str(pacs.parent),
                                                    "cache_dir": str(tmp_path / "cache")}))
    assert notes[0].startswith("augmentation: domainbed (augment=auto on DomainBed's dataset pacs)")


# ------------------------------------------------------------------------- the lock
_BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, str(Path(sys.argv[4])))
    from test_image_inputs import synthetic_decode, synthetic_entry
    from fedtune.data.cache import cached_images
    entry = synthetic_entry(Path(sys.argv[1]), int(sys.argv[2]), 8)
    delay = float(sys.argv[3])
    def decode(i, out):
        time.sleep(delay)
        synthetic_decode(i, out)
    cached_images(entry, decode, threads=1)
""")


def start_builder(tmp_path: Path, n: int, delay: float) -> subprocess.Popen:
    script = tmp_path / "builder.py"
    script.write_text(_BUILDER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), str(n), str(delay),
                             str(Path(__file__).parent)], cwd=ROOT)


def wait_for(path: Path, builder: subprocess.Popen, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert builder.poll() is None, f"the builder ended ({builder.returncode}) before {path} appeared"
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


def test_a_suspended_builder_is_named_and_the_wait_ends(tmp_path, caplog):
    entry = synthetic_entry(tmp_path / "cache", 64 * 200, 8)
    builder = start_builder(tmp_path, 64 * 200, 0.05)
    try:
        wait_for(entry.owner_path, builder)
        os.kill(builder.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with caplog.at_level("WARNING", logger="fedtune"):
            with pytest.raises(DataError) as err:
                cached_images(entry, synthetic_decode, wait_s=1.0)
        waited = time.monotonic() - t0
        message = str(err.value)
        assert f"is locked by pid {builder.pid} on host" in message and "stopped (suspended)" in message
        assert "no progress for 1 s" in message and "cache_wait_s" in message and "\n" not in message
        assert 1.0 <= waited < 20.0  # ends after about wait_s; generous for a loaded machine
        assert any(f"being built by pid {builder.pid}" in r.getMessage() for r in caplog.records)
    finally:
        os.kill(builder.pid, signal.SIGKILL)  # the builder this test started, by its pid
        builder.wait(timeout=30)
    # the killed builder's temporary file goes with the next build; the cache is then whole
    assert list(entry.directory.glob(f".{entry.stem}.*.tmp.npy"))
    array = cached_images(entry, synthetic_decode, wait_s=1.0).array
    np.testing.assert_array_equal(array, expected_pixels(64 * 200, 8))
    assert not list(entry.directory.glob(".*tmp*")) and not entry.owner_path.exists()


def test_a_waiter_outlasts_cache_wait_s_while_the_builder_progresses(tmp_path):
    n = 64 * 10  # 10 chunks of ~0.26 s: ~2.6 s in all, progress recorded about once a second
    entry = synthetic_entry(tmp_path / "cache", n, 8)
    builder = start_builder(tmp_path, n, 0.004)
    try:
        wait_for(entry.owner_path, builder)
        array = cached_images(entry, synthetic_decode, wait_s=1.8).array
    finally:
        builder.wait(timeout=60)
    assert builder.returncode == 0 and len(build_log(entry.directory)) == 1  # waited, never built itself
    np.testing.assert_array_equal(array, expected_pixels(n, 8))


def test_only_temporaries_whose_lock_is_free_are_removed(tmp_path):
    from filelock import FileLock

    cache = tmp_path / "cache"
    cache.mkdir()
    stale, live = cache / ".old-a-8px-1.77.88.tmp.npy", cache / ".busy-a-8px-2.99.11.tmp.npy"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    held = FileLock(str(cache / "busy-a-8px-2.lock"))
    held.acquire()
    try:
        assert remove_stale_temporaries(cache) == [stale]
    finally:
        held.release()
    assert live.exists() and not stale.exists()


# --------------------------------------------------------------- decoder errors, links
def test_an_image_above_pils_pixel_limit_is_one_data_error_naming_it(tmp_path, monkeypatch):
    from PIL import Image

    root = image_tree(tmp_path / "ds")
    bomb = root / "b" / "dog" / "big.png"
    Image.new("RGB", (60, 60)).save(bomb)  # 3600 pixels: over twice the limit below, PIL's bomb error
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    ds = get_dataset("folder", root=root, image_size=8, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=rf"cannot decode image '{bomb}': .*MAX_IMAGE_PIXELS = 1000") as err:
        ds.pixels("b")
    assert "\n" not in str(err.value)


def test_a_damaged_image_file_is_one_data_error_naming_it(tmp_path):
    root = image_tree(tmp_path / "ds")
    bad = root / "a" / "cat" / "0.png"
    raw = bad.read_bytes()
    bad.write_bytes(raw[:40] + bytes(len(raw) - 40))  # header kept, pixel data zeroed
    with pytest.raises(DataError, match=rf"cannot decode image '{bad}'"):
        get_dataset("folder", root=root, image_size=8, cache_dir=tmp_path / "cache").pixels("a")


@pytest.mark.parametrize("where", ["class folder", "image file", "dangling image"])
def test_a_symbolic_link_loop_or_dangling_link_is_one_data_error_naming_it(tmp_path, where):
    root = image_tree(tmp_path / "ds")
    if where == "class folder":
        link = root / "a" / "loop"
        os.symlink(link, link)  # a link to itself: ELOOP
    elif where == "image file":
        link = root / "a" / "cat" / "loop.png"
        os.symlink(link, link)
    else:
        link = root / "a" / "cat" / "gone.png"
        os.symlink(root / "nowhere.png", link)
    with pytest.raises(DataError, match=rf"'{link}' (cannot be read: Too many levels|is a symbolic link to nothing)"):
        get_dataset("folder", root=root, image_size=8, cache_dir=tmp_path / "cache")


def test_a_data_error_on_a_retried_actor_comes_back_as_itself(monkeypatch):
    from ray.exceptions import RayTaskError

    from fedtune.runtime.pools import RayPool

    class Method:
        def remote(self, *args):
            return "ref"

    class Actor:
        fit = Method()

    import ray

    def failing_get(ref):
        raise RayTaskError("fit", "Traceback ...", DataError("cannot decode image '/d/x.png': broken"))

    pool = RayPool([Actor()], factory=lambda w: Actor(), assignment=[[0]], policy="retry")
    monkeypatch.setattr(ray, "get", failing_get)
    monkeypatch.setattr(ray, "kill", lambda *a, **k: None)
    with pytest.raises(DataError, match="cannot decode image '/d/x.png'"):
        pool._recover(0, "fit", (), {})


# ------------------------------------------------------------- damage anywhere in a cache
def _old_sampled_windows(size: int, window: int = 1 << 16, windows: int = 64) -> list[int]:
    """Where format 1 of the cache looked: the first and last 64 KiB and 64 windows between."""
    span = max(0, size - window)
    return sorted({0, span, *(int(i * span / (windows - 1)) for i in range(windows))})


def zero_between_old_windows(path: Path) -> float:
    """Zero every byte no sampled window covered (the issue's damage); returns the fraction zeroed."""
    raw = bytearray(path.read_bytes())
    covered = np.zeros(len(raw), bool)
    for s in _old_sampled_windows(len(raw)):
        covered[s:s + (1 << 16)] = True
    arr = np.frombuffer(raw, np.uint8).copy()
    arr[~covered] = 0
    path.write_bytes(arr.tobytes())
    return float((~covered).mean())


def test_damage_between_the_old_sampled_windows_is_found_and_rebuilt(tmp_path):
    n, size = 400, 64  # 4.9 MB: more than the 64 windows of 64 KiB cover
    entry = synthetic_entry(tmp_path / "cache", n, size)
    cached_images(entry, synthetic_decode)
    assert zero_between_old_windows(entry.array_path) > 0.1
    assert "does not match its checksum (corrupt)" in check_cache(entry)
    np.testing.assert_array_equal(cached_images(entry, synthetic_decode).array, expected_pixels(n, size))
    assert len(build_log(entry.directory)) == 2


def test_a_large_cache_checks_each_image_on_first_read(tmp_path, monkeypatch):
    n, size = 400, 64
    entry = synthetic_entry(tmp_path / "cache", n, size)
    cached_images(entry, synthetic_decode)
    monkeypatch.setattr(cache_mod, "FULL_CHECK_BYTES", 0)  # as for an array too large to check whole at start
    good = open_cache(entry)
    np.testing.assert_array_equal(good.read(np.array([5, 399, 5])), expected_pixels(n, size)[[5, 399, 5]])
    assert good.checked.sum() == 2
    raw = bytearray(entry.array_path.read_bytes())
    at = len(raw) - (n - 200) * size * size * 3 + 1000  # inside image 200
    raw[at] ^= 0xFF
    entry.array_path.write_bytes(bytes(raw))
    assert check_cache(entry) is None  # not read yet: not checked yet
    damaged = open_cache(entry)
    damaged.read(np.arange(0, 200))  # the images before it are fine
    with pytest.raises(DataError, match=r"is damaged: image 200 does not match its checksum.*next run decodes"):
        damaged.read(np.array([199, 200, 201]))
    assert check_cache(entry) == "not built"  # its record went: the next run rebuilds
    np.testing.assert_array_equal(cached_images(entry, synthetic_decode).array, expected_pixels(n, size))


def test_a_damaged_checksum_file_is_rebuilt(tmp_path):
    entry = synthetic_entry(tmp_path / "cache", 10, 8)
    cached_images(entry, synthetic_decode)
    raw = bytearray(entry.crc_path.read_bytes())
    raw[3] ^= 1
    entry.crc_path.write_bytes(bytes(raw))
    assert "checksum file" in check_cache(entry)
    cached_images(entry, synthetic_decode)
    assert check_cache(entry) is None and len(build_log(entry.directory)) == 2


# ------------------------------------------------------------------ an image edited in place
def test_an_image_edited_in_place_is_seen_with_the_content_key_and_reuse_is_announced(tmp_path):
    from PIL import Image

    root = image_tree(tmp_path / "ds", ext="bmp")  # BMP: same size in bytes for any pixels
    cache = tmp_path / "cache"
    base = {"dataset": "folder", "data_root": str(root), "image_size": 8, "cache_dir": str(cache)}
    for key in ("stat", "content"):
        get_dataset("folder", root=root, image_size=8, cache_dir=cache, cache_key=key).pixels("a")
    target = root / "a" / "cat" / "0.bmp"
    st = target.stat()
    Image.new("RGB", (12, 12), (7, 7, 7)).save(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns == st.st_mtime_ns
    stat_notes = run_notes(FederatedRunConfig.from_dict(base))
    assert any(line.startswith("image cache: reused for domain(s) a (built ") and "cache_key=content" in line
               and "to force a rebuild, delete" in line and "folder-*-8px-*" in line for line in stat_notes)
    stale = get_dataset("folder", root=root, image_size=8, cache_dir=cache).pixels("a").array[0]
    assert not (stale == 7).all()  # the documented limit of the stat key
    content = get_dataset("folder", root=root, image_size=8, cache_dir=cache, cache_key="content")
    assert (content.pixels("a").array[0] == 7).all()
    notes = run_notes(FederatedRunConfig.from_dict({**base, "cache_key": "content"}))
    assert any("reused for domain(s) a" in line and "key: each file's bytes" in line for line in notes)
    assert any(line.startswith("image cache: decoding domain(s) b") for line in notes)


def test_the_first_line_says_reused_only_for_a_cache_the_run_reuses_and_why_it_decodes_again(tmp_path):
    # a domain whose cached pixels fail their checksum is decoded again when the run opens it: the note
    # before it must say so (and why), not "reused"
    root = image_tree(tmp_path / "ds", domains=("a", "b", "c"))
    cache = tmp_path / "cache"
    base = {"dataset": "folder", "data_root": str(root), "image_size": 8, "cache_dir": str(cache)}
    ds = get_dataset("folder", root=root, image_size=8, cache_dir=cache)
    for d in ("a", "b"):
        ds.pixels(d)
    entry = ds.cache_entry("b")
    with open(entry.array_path, "r+b") as f:  # one byte of the last image, size and record kept
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    notes = [line for line in run_notes(FederatedRunConfig.from_dict(base)) if line.startswith("image cache")]
    assert notes[0].startswith("image cache: reused for domain(s) a (built ")  # b is not reused
    assert notes[1].startswith("image cache: decoding domain(s) c into ")
    assert notes[2] == (f"image cache: decoding domain b again into {str(cache)!r}: the cache there is not reused "
                        f"because image 3 does not match its checksum (corrupt)")
    assert len(notes) == 3
    builds = len(build_log(cache))
    get_dataset("folder", root=root, image_size=8, cache_dir=cache).pixels("b")  # what the run then does
    assert len(build_log(cache)) == builds + 1 and check_cache(entry) is None


def test_cache_key_is_checked(tmp_path):
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match="cache_key"):
        FederatedRunConfig.from_dict({"cache_key": "mtime"})
    with pytest.raises(DataError, match="field 'cache_key': 'mtime' is unknown; allowed: stat, content"):
        cache_entry(tmp_path, dataset="x", domain="d", root=tmp_path, files=[], image_size=8, key_mode="mtime")


# ----------------------------------------------------------------- DomainBed's layouts
@pytest.mark.parametrize("domains,classes,match", [
    (("art_painting", "cartoon", "photo"), PACS_CLASSES, r"do not match \(missing: sketch\)"),
    (("art_painting", "cartoon", "photo", "sketch", "extra"), PACS_CLASSES, r"not PACS's: 'extra'"),
    (("art_painting", "cartoon", "photo", "sketch"), PACS_CLASSES[:6], r"has 6 classes with images .* expected 7"),
])
def test_a_domainbed_dataset_with_a_domain_or_class_missing_is_refused(tmp_path, domains, classes, match):
    listed_tree(tmp_path / "PACS", domains, classes)
    with pytest.raises(DataError, match=rf"dataset 'pacs': .*{match}.*PACS has the domain folders art_painting, "
                                        r"cartoon, photo, sketch and 7 classes; to run other folders, use dataset 'folder'"):
        get_dataset("pacs", root=tmp_path)


def test_a_whole_domainbed_layout_and_any_folder_are_accepted(tmp_path):
    listed_tree(tmp_path / "PACS", ("art_painting", "cartoon", "photo", "sketch"), PACS_CLASSES)
    assert get_dataset("pacs", root=tmp_path).info.domains == ("art_painting", "cartoon", "photo", "sketch")
    assert get_dataset("folder", root=tmp_path / "PACS").info.num_classes == 7
    listed_tree(tmp_path / "off" / "office_home", ("Art", "Clipart", "Product", "Real World"),
                [f"c{i}" for i in range(65)])
    assert len(get_dataset("office-home", root=tmp_path / "off").info.classes) == 65


# ------------------------------------------------------------------------ cache_dir
def test_a_cache_dir_naming_a_file_is_one_clear_error(tmp_path):
    root = image_tree(tmp_path / "ds")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DataError, match=rf"field 'cache_dir': '{blocker}' is a file, not a folder; allowed: a "
                                        r"writable folder"):
        get_dataset("folder", root=root, image_size=8, cache_dir=blocker).pixels("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "file"]


def test_a_bad_image_stops_the_build_without_decoding_the_rest(tmp_path):
    entry = synthetic_entry(tmp_path / "cache", 64 * 50, 8)
    decoded = []

    def decode(i, out):
        if i == 3:
            raise DataError("cannot decode image 'x/3.png': broken")
        decoded.append(i)
        synthetic_decode(i, out)

    with pytest.raises(DataError, match="image 'x/3.png'"):
        cached_images(entry, decode, threads=2)
    assert len(decoded) < 64 * 10  # the chunks not yet started were cancelled
    assert not list(entry.directory.glob(".*tmp*")) and not entry.owner_path.exists()
