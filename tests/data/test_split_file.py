"""The WILDS protocol beside leave-one-domain-out: split files (fedtune.data.split_file), the plan
they give, the metrics of their splits, selection by OOD validation and the report's columns."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedtune.config import FederatedRunConfig
from fedtune.data.heterogeneity import homogeneity_counts
from fedtune.errors import ConfigError, DataError
from fedtune.results import selection
from fedtune.results.store import load
from fedtune.runtime.common import EvalCounts
from fedtune.runtime.driver import build_plan, run
from fedtune.runtime.evaluation import eval_metrics
from fedtune.runtime.messages import EvalReply, eval_shards

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("a", "b", "c", "d")
CLASSES = ("cat", "dog")
PER_CLASS = 8


def tree(root: Path) -> Path:
    """``root/<domain>/<class>/<i>.jpg``: 4 domains x 2 classes x 8 images of 12 px."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in DOMAINS:
        for ci, c in enumerate(CLASSES):
            (root / d / c).mkdir(parents=True, exist_ok=True)
            for i in range(PER_CLASS):
                img = np.clip(rng.normal(60 + 120 * ci, 40, (12, 12, 3)), 0, 255).astype("uint8")
                Image.fromarray(img).save(root / d / c / f"{i}.jpg")
    return root


def assignment(i: int, d: str) -> str | None:
    """The split of image ``i`` (per class) of domain ``d`` in the test file: a and b train with
    ID val (i = 6) and ID test (i = 7), c the OOD validation domain, d the OOD test domain; b's
    image 5 is in no split."""
    if d == "c":
        return "val"
    if d == "d":
        return "test"
    if d == "b" and i == 5:
        return None
    return {6: "id_val", 7: "id_test"}.get(i, "train")


def write_split(root: Path, name: str = "metadata.csv", *, ext: str = "jpg", extra_rows=()) -> dict[str, dict]:
    """A WILDS split file (Bai et al.'s columns) and the expected pieces: split -> domain -> indices
    (canonical order: sorted by class, then file name)."""
    expect: dict[str, dict[str, list[int]]] = {}
    rows = []
    for d in DOMAINS:
        files = sorted((c, f"{i}.jpg") for c in CLASSES for i in range(PER_CLASS))
        for k, (c, f) in enumerate(files):
            split = assignment(int(f.split(".")[0]), d)
            if split is None:
                continue
            expect.setdefault(split, {}).setdefault(d, []).append(k)
            rows.append({"": len(rows), "split": split, "domain_remapped": DOMAINS.index(d), "domain": d,
                         "category": c, "y": CLASSES.index(c), "path": f"{d}/{c}/{f[:-3]}{ext}"})
    rows.extend(extra_rows)
    with open(root / name, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["", "split", "domain_remapped", "domain", "category", "y", "path"])
        w.writeheader()
        w.writerows(rows)
    return expect


def cfg_of(tmp_path: Path, root: Path, **kw) -> FederatedRunConfig:
    base = {"dataset": "folder", "data_root": str(root), "image_size": 12, "rounds": 2, "local_steps": 2,
            "batch_size": 4, "output": str(tmp_path / "out"), "backend": "local", "cache_dir": str(tmp_path / "cache"),
            "split_scheme": "official", "model": "mlp", "mlp_hidden": [8]}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


def as_lists(pieces) -> dict[str, list[int]]:
    return {d: list(map(int, v)) for d, v in pieces.items() if len(v)}


# ------------------------------------------------------------------------------------------ the plan
def test_the_plan_is_the_files_splits_exactly(tmp_path):
    root = tree(tmp_path / "ds")
    expect = write_split(root)
    plan = build_plan(cfg_of(tmp_path, root, clients_per_domain=2))
    assert plan.setting == "fdg" and plan.split_scheme == "official"
    assert plan.source_domains == ("a", "b") and plan.target_domains == ("d",)
    train: dict[str, list[int]] = {}
    for c in plan.clients:
        assert not c.val and c.role == "source"  # no per-client validation: ID val is the file's
        for d, idx in c.train.items():
            train.setdefault(d, []).extend(map(int, idx))
    assert {d: sorted(v) for d, v in train.items()} == expect["train"]
    assert [len(c.train[c.domain]) for c in plan.clients] == [6, 6, 5, 5]  # a: 12 train rows, b: 10
    assert as_lists(plan.target_test) == expect["test"] and not plan.target_oracle
    assert as_lists(plan.ood_val) == expect["val"]
    assert as_lists(plan.id_val) == expect["id_val"] and as_lists(plan.id_test) == expect["id_test"]


def test_lambda_spreads_only_the_train_rows_with_the_authors_counts(tmp_path):
    root = tree(tmp_path / "ds")
    expect = write_split(root, "ab-c-d.csv")
    plan = build_plan(cfg_of(tmp_path, root, split_scheme="ab-c-d", domain_homogeneity=0.5, num_clients=3))
    counts = homogeneity_counts([12, 10], 3, 0.5, "authors")
    got = np.array([[len(c.train.get(d, ())) for d in ("a", "b")] for c in plan.clients])
    np.testing.assert_array_equal(got, counts)
    union = {d: sorted(int(i) for c in plan.clients for i in c.train.get(d, ())) for d in ("a", "b")}
    assert union == expect["train"]


def test_a_copy_re_encoded_matches_by_name_and_the_partition_command_prints_the_splits(tmp_path):
    root = tree(tmp_path / "ds")
    expect = write_split(root, ext="png")  # the file names .png, the folder holds .jpg (a resized copy)
    plan = build_plan(cfg_of(tmp_path, root))
    assert as_lists(plan.target_test) == expect["test"]
    out = subprocess.run([sys.executable, "-m", "fedtune", "partition", "--set", "dataset=folder", "--set",
                          f"data_root={root}", "--set", "split_scheme=official", "--set", "image_size=12"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("split_scheme 'official', scored by the coordinator: OOD test (target_acc) d 16; OOD val (ood_val_acc) "
            "c 16; ID val (val_acc) a 2, b 2; ID test (id_test_acc) a 2, b 2") in out.stdout


@pytest.mark.parametrize("extra, message", [
    ([{"split": "holdout", "path": "a/cat/0.jpg"}], "line 64: split 'holdout' is not allowed; allowed: train, val, test, id_val, id_test"),
    ([{"split": "train", "path": "a/cow/0.jpg"}], "line 64: path 'a/cow/0.jpg' is not an image of"),
    ([{"split": "test", "path": "b/cat/5.jpg"}], None),  # b/cat/5 was in no split: now a test row of b
    ([{"split": "id_test", "path": "a/dog/0.jpg"}], "line 64: image 'a/dog/0.jpg' is listed twice (first on line"),
])
def test_bad_split_files_are_one_line_naming_the_file_and_row(tmp_path, extra, message):
    root = tree(tmp_path / "ds")
    write_split(root, extra_rows=[{"": 99, "domain_remapped": 0, "domain": "x", "category": "x", "y": 0, **e}
                                  for e in extra])
    if message is None:  # a domain in both train and OOD test
        with pytest.raises(DataError, match=r"domain\(s\) b are in both 'train' and 'test'"):
            build_plan(cfg_of(tmp_path, root))
        return
    with pytest.raises(DataError) as err:
        build_plan(cfg_of(tmp_path, root))
    assert message in str(err.value) and "\n" not in str(err.value) and "metadata.csv" in str(err.value)


def test_a_missing_file_says_where_it_was_looked_for_and_where_to_get_it(tmp_path):
    root = tree(tmp_path / "ds")
    with pytest.raises(DataError) as err:
        build_plan(cfg_of(tmp_path, root, split_scheme="pac-s"))
    msg = str(err.value)
    assert f"reads '{root / 'pac-s.csv'}', which does not exist" in msg and "inouye-lab/FedDG_Benchmark" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("overrides, field", [
    ({"split_scheme": "../metadata"}, "field 'split_scheme': '../metadata' is not allowed"),
    ({"split_scheme": "metadata.csv"}, "field 'split_scheme': 'metadata.csv' is not allowed"),
    ({"setting": "fda"}, "which setting 'fda' does not use; allowed: setting fdg"),
    ({"dataset": "rotated-digits", "data_root": None}, "dataset 'rotated-digits' allows: null"),
])
def test_bad_split_scheme_fields_are_one_line_before_any_data_is_read(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as err:
        cfg_of(tmp_path, tmp_path / "nowhere", **overrides)
    assert field in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------ metrics
def counts(correct: int, count: int, loss: float, per_class=None) -> EvalCounts:
    c = EvalCounts()
    c.correct, c.count, c.loss_sum, c.per_class = correct, count, loss, per_class
    return c


def test_macro_f1_of_the_evaluation_is_sklearns_over_batches():
    import torch
    from sklearn.metrics import f1_score

    from fedtune.runtime.common import evaluate
    from fedtune.runtime.examples import TensorExamples

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 6, generator=g), torch.randint(0, 4, (50,), generator=g)
    y[y == 3] = 2  # class 3 never true: sklearn's labels=unique(y_true) leaves it out
    model = torch.nn.Linear(6, 4)
    c = evaluate(model, TensorExamples(x, y), batch_size=7)  # 8 batches summed
    pred = model(x).argmax(1).numpy()
    assert c.count == 50 and c.correct == int((pred == y.numpy()).sum())
    ref = f1_score(y.numpy(), pred, average="macro", labels=np.unique(y.numpy()))
    assert c.macro_f1 == pytest.approx(ref, abs=1e-12)


def test_the_splits_metrics_are_their_counts_summed_and_the_worst_domain(tmp_path):
    root = tree(tmp_path / "ds")
    write_split(root)
    plan = build_plan(cfg_of(tmp_path, root))
    shards = eval_shards(plan)
    assert [s.split for s in shards] == ["test", "ood_val", "id_val", "id_val", "id_test", "id_test"]
    rng = np.random.default_rng(3)
    def per_class(n):  # true / predicted / both per class, consistent with n examples
        true = rng.multinomial(n, [0.5, 0.5])
        pred = rng.multinomial(n, [0.3, 0.7])
        tp = np.minimum(true, pred) // 2
        return np.stack([true, pred, tp]).astype(np.int64)

    made = {s.shard_id: counts(int(rng.integers(0, len(s.indices) + 1)), len(s.indices), float(rng.random()),
                               per_class(len(s.indices))) for s in shards}
    # every shard in its own reply, in reverse order: the sums must not depend on who computed what
    replies = [EvalReply(client_ids=[], val=[], test=[], shard_ids=[sid], shards=[made[sid]]) for sid in reversed(made)]
    replies.append(EvalReply(client_ids=[c.client_id for c in plan.clients], val=[EvalCounts() for _ in plan.clients],
                             test=[EvalCounts() for _ in plan.clients]))
    m = eval_metrics(replies, plan, shards)

    def acc(split, domain=None):
        picked = [made[s.shard_id] for s in shards if s.split == split and domain in (None, s.domain)]
        return math.fsum(c.correct for c in picked) / math.fsum(c.count for c in picked)

    def loss(split):
        picked = [made[s.shard_id] for s in shards if s.split == split]
        return math.fsum(c.loss_sum for c in picked) / math.fsum(c.count for c in picked)

    assert m["val_acc"] == pytest.approx(acc("id_val"), abs=1e-15) and m["val_loss"] == pytest.approx(loss("id_val"))
    assert m["val_acc.a"] == acc("id_val", "a") and m["val_acc.b"] == acc("id_val", "b")
    assert m["ood_val_acc"] == acc("ood_val") and m["ood_val_loss"] == pytest.approx(loss("ood_val"))
    assert m["target_acc"] == acc("test") and m["target_worst_acc"] == acc("test", "d")
    assert m["id_test_acc"] == pytest.approx(acc("id_test"), abs=1e-15)
    assert m["id_test_worst_acc"] == min(acc("id_test", "a"), acc("id_test", "b"))
    assert "oracle_acc" not in m

    def f1(split):  # WILDS' macro-F1 from the shards' summed per-class counts, in float64
        true, pred, tp = sum(made[s.shard_id].per_class for s in shards if s.split == split).astype(np.float64)
        return float(np.mean([2 * tp[k] / (true[k] + pred[k]) for k in range(2) if true[k] > 0]))

    assert m["val_macro_f1"] == pytest.approx(f1("id_val"), abs=1e-15)
    assert m["ood_val_macro_f1"] == pytest.approx(f1("ood_val"), abs=1e-15)
    assert m["target_macro_f1"] == pytest.approx(f1("test"), abs=1e-15)
    assert m["id_test_macro_f1"] == pytest.approx(f1("id_test"), abs=1e-15)


def test_selection_by_ood_validation_and_its_one_line_refusals():
    rows = [{"round": 1, "val_acc": 0.9, "ood_val_acc": 0.2, "target_acc": 0.1},
            {"round": 2, "val_acc": 0.5, "ood_val_acc": 0.6, "target_acc": 0.7}]
    assert selection.choose_round(rows, "ood-val") == selection.Choice(2, 0.6, 0.7)
    assert selection.choose_round(rows, "val") == selection.Choice(1, 0.9, 0.1)
    with pytest.raises(ConfigError, match="'ood-val' needs an OOD validation domain, which only a split file gives"):
        selection.check_protocol("ood-val", "fdg")
    with pytest.raises(ConfigError, match="takes its test split from the file, with no oracle slice; allowed: val, ood-val"):
        selection.check_protocol("oracle", "fdg", split_scheme="official")
    # the file's ID validation is what val selects by: val_fraction plays no part
    assert selection.check_protocol("val", "fdg", val_fraction=0.0, split_scheme="official") == "val"
    # macro-F1 selection (Bai et al.'s iWildCam): the split file's runs only
    f1_rows = [{**rows[0], "val_macro_f1": 0.3, "ood_val_macro_f1": 0.8},
               {**rows[1], "val_macro_f1": 0.4, "ood_val_macro_f1": 0.5}]
    assert selection.choose_round(f1_rows, "val-f1") == selection.Choice(2, 0.4, 0.7)
    assert selection.choose_round(f1_rows, "ood-val-f1") == selection.Choice(1, 0.8, 0.1)
    for protocol in selection.F1:
        assert selection.check_protocol(protocol, "fdg", split_scheme="official") == protocol
        with pytest.raises(ConfigError, match=f"'{protocol}' selects by macro-F1, which the runs record only with a "
                                              "split file .* allows: val, oracle$"):
            selection.check_protocol(protocol, "fdg")


# ------------------------------------------------------------------------------------------ runs
def test_a_run_records_every_split_and_the_report_gives_both_protocols_their_columns(tmp_path):
    from fedtune.reports.report import make_report

    root = tree(tmp_path / "ds")
    write_split(root)
    wilds = run(cfg_of(tmp_path, root, name="both"), progress=False)
    lodo = run(cfg_of(tmp_path, root, name="both", split_scheme=None, target_domain="d", oracle_fraction=0.25),
               progress=False)
    assert wilds.status == lodo.status == "completed"
    rows = [r for r in load(tmp_path / "out" / "both", "rounds").to_pylist() if r["trial_id"] == wilds.trial_id]
    assert [r["split_scheme"] for r in rows] == ["official", "official"]
    for r in rows:
        for col in ("val_acc", "ood_val_acc", "id_test_acc", "id_test_worst_acc", "target_worst_acc", "target_acc"):
            assert 0 <= r[col] <= 1, col
        assert r["oracle_acc"] is None and r["target_domain"] == "d"
    trial = next(t for t in load(tmp_path / "out" / "both", "trials").to_pylist() if t["trial_id"] == wilds.trial_id)
    best = max(rows, key=lambda r: (r["ood_val_acc"], -r["round"]))
    assert trial["ood_val_round"] == best["round"] and trial["target_acc_at_best_ood_val"] == best["target_acc"]
    rep = make_report(tmp_path / "out" / "both", plots=False)
    assert rep.domains == ["d", "d (official)"]  # leave-one-domain-out and the file's protocol side by side
    # the report shows both of the split file's selections: ID validation first, OOD validation after
    assert rep.companion is not None and rep.companion.selection == "ood-val"
    text = (tmp_path / "out" / "both" / "report.md").read_text()
    assert text.index(selection.LABELS["val"]) < text.index("## " + rep.companion.title())
    ood = make_report(tmp_path / "out" / "both", selection="ood-val", plots=False, write=False)
    picked = ood.selected.set_index("domain")
    assert picked.loc["d (official)", "target_acc"] == trial["target_acc_at_best_ood_val"]
    assert math.isnan(ood.trials.set_index("trial_id").loc[lodo.trial_id, "score"])  # no OOD val: not selectable
    # by OOD validation macro-F1: the round with the best ood_val_macro_f1, the ID-F1 table as companion
    f1 = make_report(tmp_path / "out" / "both", selection="ood-val-f1", plots=False, write=False)
    best_f1 = max(rows, key=lambda r: (r["ood_val_macro_f1"], -r["round"]))
    assert f1.selected.set_index("domain").loc["d (official)", "target_acc"] == best_f1["target_acc"]
    assert f1.companion is not None and f1.companion.selection == "val-f1"


# ------------------------------------------------------------------------------------------ the preset
def test_the_feddg_benchmark_preset_and_its_fixed_spaces_validate(tmp_path, monkeypatch):
    import hashlib

    from torchvision.models import ResNet50_Weights

    from fedtune.spaces.lookup import load_space
    from fedtune.weight_files import weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    body, member = b"placeholder", ResNet50_Weights.IMAGENET1K_V1  # the file's name carries its SHA-256 prefix
    monkeypatch.setattr(member.value, "url", member.url.replace("0676ba61", hashlib.sha256(body).hexdigest()[:8]))
    path = weights_file(member)
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    from tests.data.test_image_pipeline import image_tree

    image_tree(tmp_path / "data" / "PACS", domains=("art_painting", "cartoon", "photo", "sketch"), per_class=1,
               classes=("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"), size=8)
    folder = ROOT / "examples" / "feddg-benchmark"
    cfg = FederatedRunConfig.from_yaml(folder / "pacs.yaml", {"data_root": str(tmp_path / "data")})
    assert (cfg.split_scheme, cfg.num_clients, cfg.domain_homogeneity, cfg.rounds, cfg.batch_size) == ("official", 100, 0.1, 80, 32)
    assert (cfg.model, cfg.weights, cfg.freeze_batchnorm, cfg.effective_augment) == ("resnet50", "IMAGENET1K_V1", True, "domainbed")
    spaces = sorted(folder.glob("pacs-*.yaml"))
    assert len(spaces) == 8
    for space_file in spaces:
        space = load_space(str(space_file))
        assert not [p.name for p in space.params.values() if p.sampled], space_file.name  # one configuration
        defaults = space.defaults()
        assert defaults["local_optimizer"] == "adam" and defaults["global_lr"] == 1.0, space_file.name
        assert defaults["local_lr"] in (1e-5, 3e-5), space_file.name
        FederatedRunConfig.from_dict({**cfg.to_dict(), **defaults, "params": {}})
