"""WILDS datasets from a local copy (fedtune.data.wilds_sets; FEMNIST in Bai et al.'s layout, fedtune.data.femnist): domains, labels, pixels and splits read
through the wilds package, checked against the copies' own files; runs on them; one-line errors."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.data import wilds_copies
from fedtune.config import FederatedRunConfig
from fedtune.data.registry import get_dataset
from fedtune.errors import ConfigError, DataError
from fedtune.results.store import load
from fedtune.runtime.driver import build_plan, run

ROOT = Path(__file__).resolve().parents[2]
MAKERS = {"camelyon17": wilds_copies.camelyon17, "iwildcam": wilds_copies.iwildcam, "celeba": wilds_copies.celeba,
          "femnist": wilds_copies.femnist}


def rows_of(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def expected(name: str, root: Path):
    """From the copy's own files, independently of wilds: per example (domain, file, label, split), in
    file order."""
    if name == "camelyon17":
        d = root / "camelyon17_v1.0"
        out = []
        for r in rows_of(d / "metadata.csv"):
            c = int(r["center"])
            split = {1: "val", 2: "test"}.get(c) or ("id_val" if r["split"] == "1" else "train")
            f = (f"patches/patient_{r['patient']}_node_{r['node']}/patch_patient_{r['patient']}_node_{r['node']}"
                 f"_x_{r['x_coord']}_y_{r['y_coord']}.png")
            out.append((f"hospital_{c}", f, int(r["tumor"]), split))
        return d, out
    if name == "iwildcam":
        d = root / "iwildcam_v2.0"
        return d, [(f"location_{r['location_remapped']}", f"train/{r['filename']}", int(r["y"]), r["split"])
                   for r in rows_of(d / "metadata.csv")]
    if name == "femnist":
        d = root / "femnist_v1.0"
        rows = rows_of(d / "metadata.csv")
        rows.sort(key=lambda r: int(r["domain_remapped"]))  # stable: file order inside a writer
        return d, [(f"writer_{r['domain_remapped']}", r["path"], int(r["y"]), r["split"]) for r in rows]
    d = root / "celebA_v1.0"
    parts = {r["image_id"]: ("train", "val", "test")[int(r["partition"])] for r in rows_of(d / "list_eval_partition.csv")}
    out = []
    for r in rows_of(d / "list_attr_celeba.csv"):
        male, y = int(r["Male"] == "1"), int(r["Blond_Hair"] == "1")
        out.append((f"male_{male}-y_{y}", f"img_align_celeba/{r['image_id']}", y, parts[r["image_id"]]))
    return d, out


@pytest.mark.parametrize("name", list(MAKERS))
def test_domains_labels_pixels_and_splits_are_the_copys_own(tmp_path, name):
    from PIL import Image

    root = MAKERS[name](tmp_path / "data")
    folder, examples = expected(name, root)
    ds = get_dataset(name, root=root, image_size=16, cache_dir=tmp_path / "cache")
    domains = sorted({e[0] for e in examples}, key=lambda d: (len(d), d))
    assert list(ds.info.domains) == domains
    splits = ds.split_pieces("official")
    for d in domains:
        mine = [e for e in examples if e[0] == d]  # WILDS' order inside a domain
        assert ds.files(d) == [e[1] for e in mine]
        assert ds.labels(d).tolist() == [e[2] for e in mine]
        for split, pieces in splits.items():
            assert pieces.get(d, np.zeros(0)).tolist() == [k for k, e in enumerate(mine) if e[3] == split], (d, split)
        k = len(mine) - 1
        with Image.open(folder / mine[k][1]) as im:  # the file the cache key names is the image get_input reads
            ref = np.asarray(im.convert("RGB").resize((16, 16), Image.BILINEAR))
        np.testing.assert_array_equal(ds.pixels(d).array[k], ref)


def test_a_camelyon_run_under_the_wilds_protocol_records_every_split(tmp_path):
    root = wilds_copies.camelyon17(tmp_path / "data")
    cfg = FederatedRunConfig.from_dict({
        "dataset": "camelyon17", "data_root": str(root), "split_scheme": "official", "image_size": 16,
        "rounds": 2, "local_steps": 2, "batch_size": 4, "model": "mlp", "mlp_hidden": [8], "backend": "local",
        "output": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"), "domain_homogeneity": 0.0,
        "num_clients": 2})
    plan = build_plan(cfg)
    assert plan.source_domains == ("hospital_0", "hospital_3") and plan.target_domains == ("hospital_2",)
    assert [sorted(c.train) for c in plan.clients] == [["hospital_0"], ["hospital_3"]]
    assert list(plan.ood_val) == ["hospital_1"] and sorted(plan.id_val) == ["hospital_0", "hospital_3"]
    res = run(cfg, progress=False)
    assert res.status == "completed"
    for r in load(tmp_path / "out" / "default", "rounds").to_pylist():
        assert r["split_scheme"] == "official" and r["target_domain"] == "hospital_2"
        assert 0 <= r["ood_val_acc"] <= 1 and 0 <= r["val_acc"] <= 1 and 0 <= r["target_acc"] <= 1


def test_leave_one_domain_out_also_runs_on_wilds_domains(tmp_path):
    root = wilds_copies.iwildcam(tmp_path / "data")
    cfg = FederatedRunConfig.from_dict({"dataset": "iwildcam", "data_root": str(root), "image_size": 16,
                                        "target_domain": "location_3", "cache_dir": str(tmp_path / "cache")})
    plan = build_plan(cfg)
    assert plan.target_domains == ("location_3",) and plan.split_scheme is None
    assert plan.source_domains == ("location_0", "location_1", "location_2")


def test_a_missing_copy_an_unknown_scheme_and_no_package_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(DataError) as err:
        get_dataset("camelyon17", root=tmp_path)
    msg = str(err.value)
    assert "lacks RELEASE_v1.0.txt, metadata.csv, patches/" in msg and "nothing is downloaded" in msg
    assert "\n" not in msg and not (tmp_path / "camelyon17_v1.0").exists()
    root = wilds_copies.celeba(tmp_path / "data")
    ds = get_dataset("celeba", root=root, cache_dir=tmp_path / "cache")
    with pytest.raises(ConfigError, match="'mixed-to-test' is not a split scheme of dataset 'celeba'; allowed: official"):
        ds.split_pieces("mixed-to-test")
    with pytest.raises(DataError, match=r"femnist_v1.0/metadata.csv' does not exist; data_root must hold femnist_v1.0/"):
        get_dataset("femnist", root=tmp_path)
    monkeypatch.setitem(sys.modules, "wilds", None)
    with pytest.raises(DataError, match=r"read by the wilds package, which is not installed here .*pip install 'fedtune\[wilds\]'"):
        get_dataset("celeba", root=root, cache_dir=tmp_path / "cache")


def test_the_package_is_imported_without_its_network_version_check(tmp_path):
    code = ("import threading; from fedtune.data.wilds_sets import import_wilds; import_wilds(); "
            "print(sorted(t.name for t in threading.enumerate()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['MainThread']"  # wilds' import starts a thread asking PyPI otherwise


TABLES = [("camelyon17", "camelyon17_v1.0/metadata.csv", "tumor"),
          ("iwildcam", "iwildcam_v2.0/metadata.csv", "filename"),
          ("celeba", "celebA_v1.0/list_attr_celeba.csv", "Blond_Hair"),
          ("celeba", "celebA_v1.0/list_eval_partition.csv", "partition"), ("femnist", "femnist_v1.0/metadata.csv", "y")]


def _rewrite(path: Path, keep) -> None:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(keep(rows))


@pytest.mark.parametrize("name,table,column", TABLES)
def test_a_metadata_file_with_a_header_only_is_one_line_naming_it(tmp_path, name, table, column):
    root = MAKERS[name](tmp_path / "data")
    _rewrite(root / table, lambda rows: rows[:1])  # the header row, no image
    with pytest.raises(DataError) as err:
        get_dataset(name, root=root, cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and repr(str(root / table)) in msg and "no rows" in msg


@pytest.mark.parametrize("name,table,column", TABLES)
def test_a_metadata_file_without_a_column_the_reader_needs_names_the_file_and_column(tmp_path, name, table, column):
    root = MAKERS[name](tmp_path / "data")
    _rewrite(root / table, lambda rows: [[v for v, h in zip(r, rows[0]) if h != column] for r in rows])
    with pytest.raises(DataError) as err:
        get_dataset(name, root=root, cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and repr(str(root / table)) in msg and f"lacks column(s) {column}" in msg


@pytest.mark.parametrize("name,table", [(n, t) for n, t, _ in TABLES if n != "femnist"])
def test_an_empty_metadata_file_is_one_line_naming_it(tmp_path, name, table):
    root = MAKERS[name](tmp_path / "data")
    (root / table).write_text("")
    with pytest.raises(DataError) as err:
        get_dataset(name, root=root, cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and repr(str(root / table)) in msg and "is empty" in msg


def test_tables_that_disagree_on_their_length_are_one_line_naming_the_files(tmp_path):
    # CelebA's attribute and partition files are paired row by row: one row short, wilds' torch.cat fails
    root = wilds_copies.celeba(tmp_path / "data")
    _rewrite(root / "celebA_v1.0/list_eval_partition.csv", lambda rows: rows[:-1])
    with pytest.raises(DataError) as err:
        get_dataset("celeba", root=root, cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and "cannot read" in msg and "list_attr_celeba.csv, list_eval_partition.csv" in msg
