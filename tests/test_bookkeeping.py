"""Bookkeeping that must never be silently wrong (issue 8 §3): SIGTERM ends as interrupted with the
trial row written, empty class folders and one-class datasets are errors, relocatable studies, corrupt
Parquet files named (and repaired on ``sweep --resume``), Ray's wrapped actor errors unwrapped,
no batch of one, inputs refused up front, a locked optuna.db retried, batch order per round and
example-weighted train_loss."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedtune.runtime.examples import TensorExamples
from fedtune.results.arrow import CorruptResultsError
from fedtune.results.store import ResultsStore, check_output_dir, corrupt_files, load, quarantine
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.errors import DataError
from fedtune.data.registry import get_dataset

ROOT = Path(__file__).resolve().parents[1]


def fedtune_cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedtune.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def image_tree(root: Path, classes: dict[str, int], domains=("a", "b"), size: int = 8) -> Path:
    """``root/<domain>/<class>/<i>.png``: ``classes[c]`` images of class ``c`` in every domain."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in domains:
        for c, k in classes.items():
            (root / d / c).mkdir(parents=True, exist_ok=True)
            for i in range(k):
                Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8")).save(root / d / c / f"{i}.png")
    return root


# ------------------------------------------------------------------------------------------------
# Folder datasets: the class list is the union of class folders; an empty class or < 2 classes is an error.
def test_a_class_folder_empty_in_every_domain_is_an_error_naming_it(tmp_path):
    root = image_tree(tmp_path / "ds", {"cat": 3, "dog": 0, "eel": 0})
    with pytest.raises(DataError) as err:
        get_dataset("folder", root=root)
    msg = str(err.value)
    assert "'dog', 'eel'" in msg and "no image in any domain" in msg and str(root) in msg


def test_a_dataset_with_one_class_is_an_error(tmp_path):
    root = image_tree(tmp_path / "ds", {"cat": 3})
    with pytest.raises(DataError, match="1 class .*at least 2 classes"):
        get_dataset("folder", root=root)


def test_a_class_missing_from_one_domain_is_still_a_class(tmp_path):
    root = image_tree(tmp_path / "ds", {"cat": 2, "dog": 2})
    image_tree(root, {"eel": 2}, domains=("a",))
    (root / "b" / "eel").mkdir()  # empty here, images in domain a
    ds = get_dataset("folder", root=root)
    assert ds.info.classes == ("cat", "dog", "eel")
    assert sorted(set(ds.labels("b").tolist())) == [0, 1] and sorted(set(ds.labels("a").tolist())) == [0, 1, 2]


# ------------------------------------------------------------------------------------------------
# batches(): never a batch of one; epochs, steps and determinism.
@pytest.mark.parametrize("n, bs", [(18, 17), (35, 17), (34, 17), (2, 1), (5, 2), (1, 4), (17, 17), (33, 8)])
def test_batches_never_hold_one_example_and_cover_every_example_once_per_epoch(n, bs):
    import torch

    from fedtune.algorithms.client.method import batches
    from fedtune.algorithms.client.steps import batches_per_epoch

    per_epoch = batches_per_epoch(n, bs)
    out = list(batches(n, bs, 3 * per_epoch, torch.Generator().manual_seed(0)))
    assert len(out) == 3 * per_epoch
    for e in range(3):
        epoch = out[e * per_epoch:(e + 1) * per_epoch]
        assert sorted(torch.cat(epoch).tolist()) == list(range(n))  # a permutation: each example once
        sizes = [len(b) for b in epoch]
        assert n == 1 or bs == 1 or min(sizes) > 1, sizes
        assert max(sizes) <= bs + 1
    again = list(batches(n, bs, 3 * per_epoch, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, b) for a, b in zip(out, again))


def test_batch_sizes_for_n_18_batch_17_is_one_batch_of_18():
    import torch

    from fedtune.algorithms.client.method import batches
    from fedtune.algorithms.client.steps import local_steps

    cfg = FederatedRunConfig.from_dict({"batch_size": 17, "local_epochs": 2})
    assert local_steps(18, cfg) == 2  # two epochs of one batch each
    assert [len(b) for b in batches(18, 17, 2, torch.Generator().manual_seed(1))] == [18, 18]


def test_a_batchnorm_model_trains_on_18_examples_with_batch_size_17():
    import torch
    from torch import nn

    from fedtune.algorithms.client.method import SGD, ClientContext

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(18, 4), torch.arange(18) % 3
    cfg = FederatedRunConfig.from_dict({"batch_size": 17, "local_epochs": 3, "local_lr": 0.1})
    ctx = ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                        generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    out = SGD(cfg).train(ctx)  # a batch of one would raise in BatchNorm1d's train mode
    assert out.steps == 3 and np.isfinite(out.loss)


# ------------------------------------------------------------------------------------------------
# The order of a client's batches: a function of (seed, client, round), different every round.
def _drawn_batches(cfg: FederatedRunConfig, round: int, client: int) -> list[list[int]]:
    from fedtune.algorithms.client.method import batches
    from fedtune.algorithms.client.steps import local_steps
    from fedtune.runtime.driver import FederatedRun

    fr = FederatedRun(cfg)
    fr.start()
    try:
        worker = fr.coordinator.pool.worker
        drawn: list[list[int]] = []

        def record(ctx):
            n = ctx.num_examples
            drawn.extend(b.tolist() for b in batches(n, cfg.batch_size, local_steps(n, cfg), ctx.generator))
            from fedtune.algorithms.client.method import ClientOutcome

            return ClientOutcome(loss=0.0, steps=len(drawn))

        worker.method.train = record
        worker.fit(fr.coordinator.weights, {}, round, [client])
        return drawn
    finally:
        fr.close()


def test_a_clients_batch_order_changes_every_round_and_repeats_for_the_same_round(tmp_path):
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "backend": "local", "local_steps": 4, "batch_size": 8,
                               "output": str(tmp_path)})
    r1, r2, r1_again = (_drawn_batches(cfg, r, 1) for r in (1, 2, 1))
    assert r1 == r1_again  # deterministic given (seed, client, round)
    assert r1 != r2  # a seed that ignored the round would give the same order every round
    assert _drawn_batches(cfg, 1, 2) != r1  # and per client
    assert _drawn_batches(cfg.replace(seed=1), 1, 1) != r1  # and per seed


# ------------------------------------------------------------------------------------------------
# train_loss: the example-weighted mean of the clients' losses.
def test_train_loss_is_weighted_by_the_clients_example_counts(tmp_path):
    from fedtune.runtime.driver import FederatedRun

    cfg = FederatedRunConfig.from_dict({"dataset": "rotated-digits", "setting": "fl", "num_clients": 3, "dirichlet_alpha": 0.3,
                               "local_steps": 2, "batch_size": 16, "rounds": 1, "backend": "local",
                               "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    fr.start()
    try:
        pool = fr.coordinator.pool
        seen = []
        fit_stream = pool.fit_stream

        def spy(*a):  # the coordinator takes one reply per client as it arrives
            for reply in fit_stream(*a):
                seen.append(reply)
                yield reply

        pool.fit_stream = spy
        result = fr.step()
    finally:
        fr.close()
    n = np.array([k for r in seen for k in r.num_examples], dtype=np.float64)
    losses = np.array([v for r in seen for v in r.losses])
    assert len(set(n.tolist())) == 3  # unequal clients
    weighted = float((n * losses).sum() / n.sum())
    assert abs(weighted - losses.mean()) > 1e-4  # the two means differ here, so the test can tell them apart
    assert result.metrics["train_loss"] == pytest.approx(weighted, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# Inputs refused up front.
def test_bad_names_and_an_output_file_are_config_errors(tmp_path):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study

    for bad in (".hidden", "a/b", " "):
        with pytest.raises(ConfigError, match="allowed: a non-empty folder name"):
            ResultsStore(tmp_path, bad)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_output_dir(afile)
    with pytest.raises(ConfigError, match="lies under"):
        check_output_dir(afile / "sub")
    base = {"algorithms": ["fedavg"], "rounds": 1, "num_samples": 1, "output": str(tmp_path), "name": "s",
            "overrides": {"local_steps": 1}, "report": False}
    with pytest.raises(ConfigError, match="option '--output'.*is a file"):
        plan_study(SweepOptions(**{**base, "output": str(afile)}))
    with pytest.raises(ConfigError, match="option '--name'.*allowed: a non-empty folder name"):
        plan_study(SweepOptions(**{**base, "name": ".hidden"}))
    with pytest.raises(ConfigError, match="'all'.*setting 'fl'.*6 searches would be the same"):
        plan_study(SweepOptions(**{**base, "target_domain": "all", "dataset": "rotated-digits",
                                   "overrides": {"local_steps": 1, "setting": "fl"}}))


def test_cli_refuses_an_output_file_and_a_hidden_name_before_training(tmp_path):
    (tmp_path / "afile").write_text("x")
    for args, words in ((["--output", "afile"], "is a file"), (["--name", ".hidden"], "must not start with '.'")):
        res = fedtune_cli("run", "--backend", "local", "--rounds", "1", "--set", "local_steps=1", "--no-progress",
                          *args, cwd=tmp_path)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / ".hidden").exists() and (tmp_path / "afile").read_text() == "x"
    res = fedtune_cli("sweep", "--output", "afile", "--algorithm", "fedavg", cwd=tmp_path)
    assert res.returncode == 2 and "option '--output'" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = fedtune_cli("sweep", "--output", str(tmp_path), "--target-domain", "all", "--set", "setting=fl",
                      "--algorithm", "fedavg", cwd=tmp_path)
    assert res.returncode == 2 and "setting 'fl'" in res.stderr and "Traceback" not in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------
# Corrupt Parquet files: named, with what to do.
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_file_is_named_by_load_and_by_report(tmp_path):
    store = ResultsStore(tmp_path, "s")
    for t in ("a", "b"):
        store.write_rounds(t, [{"round": 1, "val_acc": 0.5, "target_acc": 0.4, "algorithm": "fedavg"}])
    bad = store.rounds_path("b")
    _truncate(bad)
    with pytest.raises(CorruptResultsError) as err:
        load(store.study_dir)
    assert str(bad) in str(err.value) and "fedtune sweep --resume" in str(err.value)
    assert corrupt_files(store.study_dir) == [bad]
    res = fedtune_cli("report", str(store.study_dir), "--no-plots", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert str(bad) in line and "unreadable" in line
    moved = quarantine(bad)
    assert moved.name == "b.parquet.corrupt" and load(store.study_dir).num_rows == 1  # ignored by load


# ------------------------------------------------------------------------------------------------
# A locked optuna.db: retried until the record lands.
def test_a_record_lands_while_another_connection_holds_the_database_locked(tmp_path):
    import optuna
    from optuna.trial import TrialState

    from fedtune.results.study_dir import OPTUNA_FILE
    from fedtune.tune.tuner.optuna_search import optuna_storage
    from fedtune.tune.study.plan import optuna_storage_url

    study_dir = tmp_path / "s"
    study_dir.mkdir()
    storage = optuna_storage(study_dir, timeout_s=0.05, retry_s=60)
    study = optuna.create_study(study_name="s/fedavg", storage=storage, direction="maximize")
    trial = study.ask()
    db = study_dir / OPTUNA_FILE

    holder = sqlite3.connect(db, timeout=0, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # what a reader/writer racing fedtune can hold
    release = threading.Timer(1.0, lambda: holder.execute("COMMIT"))
    with pytest.raises(Exception, match="locked|commit"):  # without retries the record is lost
        plain = optuna.storages.RDBStorage(optuna_storage_url(study_dir),
                                           engine_kwargs={"connect_args": {"timeout": 0.05}})
        plain.set_trial_user_attr(trial._trial_id, "lost", 1)
    release.start()
    storage.set_trial_user_attr(trial._trial_id, "fedtune_status", "completed")
    study.tell(trial, 0.5)
    release.join()
    holder.close()
    (t,) = optuna.load_study(study_name="s/fedavg", storage=optuna_storage_url(study_dir)).trials
    assert t.state == TrialState.COMPLETE and t.value == 0.5 and t.user_attrs == {"fedtune_status": "completed"}


def test_the_storage_pickles_onto_the_study_being_run(tmp_path):
    import pickle

    from fedtune.tune.study.active import ACTIVE
    from fedtune.tune.tuner.optuna_search import optuna_storage
    from fedtune.tune.study.plan import optuna_storage_url

    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    blob = pickle.dumps(optuna_storage(tmp_path / "A"))
    ACTIVE["study_dir"] = tmp_path / "B"
    try:
        moved = pickle.loads(blob)
    finally:
        ACTIVE.pop("study_dir", None)
    assert moved.url == optuna_storage_url(tmp_path / "B")
    assert pickle.loads(blob).url == optuna_storage_url(tmp_path / "A")  # outside a sweep: unchanged


# ------------------------------------------------------------------------------------------------
# SIGTERM: interrupted, with the trial row written, on both backends.
def _sigterm_after_first_round(cmd: list[str], cwd: Path, rounds_dir: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not any(rounds_dir.glob("*.parquet")):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_sigterm_ends_a_run_as_interrupted_with_its_trial_row(tmp_path, backend, request):
    cmd = [sys.executable, "-m", "fedtune.cli", "run", "--backend", backend, "--rounds", "300", "--output",
           str(tmp_path), "--no-progress", "--set", "local_steps=2"]
    if backend == "ray":  # the session's Ray (started once), one client actor (one torch import)
        address = request.getfixturevalue("ray_session").get_runtime_context().gcs_address
        cmd += ["--address", address, "--set", "max_client_actors=1"]
    else:
        cmd += ["--set", "num_cpus=2"]
    res = _sigterm_after_first_round(cmd, tmp_path, tmp_path / "default" / "rounds")
    assert res.returncode == 130 and "Traceback" not in res.stderr, res.stderr[-3000:]
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["status"] == "interrupted" and trial["error"] == "interrupted by SIGTERM"
    rows = load(tmp_path / "default").to_pylist()
    assert 1 <= trial["rounds_done"] == len(rows) < 300


# ------------------------------------------------------------------------------------------------
def test_a_sigterm_that_comes_back_as_a_plain_keyboard_interrupt_is_still_recorded_as_sigterm(tmp_path, monkeypatch):
    """Ray's C++ layer re-raises a signal handler's exception inside a blocking ray.get as a fresh,
    plain KeyboardInterrupt: the run must still say SIGTERM (CI saw 'interrupted by the user')."""
    from fedtune.runtime import driver

    calls = {"n": 0}
    step = driver.FederatedRun.step

    def step_then_sigterm_like_ray(self):
        calls["n"] += 1
        if calls["n"] < 2:
            return step(self)
        try:
            signal.raise_signal(signal.SIGTERM)  # to this thread (os.kill may land on another one)
            for _ in range(500):
                time.sleep(0.01)  # the handler raises here
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None  # what ray.get raises: the Terminated is lost
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(driver.FederatedRun, "step", step_then_sigterm_like_ray)
    before = signal.getsignal(signal.SIGTERM)
    cfg = FederatedRunConfig.from_dict({"rounds": 5, "local_steps": 1, "output": str(tmp_path), "backend": "local",
                                        "num_cpus": 1})
    with pytest.raises(KeyboardInterrupt):
        driver.run(cfg, progress=False)
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["status"] == "interrupted" and trial["error"] == "interrupted by SIGTERM", trial
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone


def test_ctrl_c_alone_is_recorded_as_interrupted_by_the_user(tmp_path, monkeypatch):
    from fedtune.runtime import driver

    def ctrl_c(self):
        raise KeyboardInterrupt()

    monkeypatch.setattr(driver.FederatedRun, "step", ctrl_c)
    cfg = FederatedRunConfig.from_dict({"rounds": 5, "local_steps": 1, "output": str(tmp_path), "backend": "local",
                                        "num_cpus": 1})
    with pytest.raises(KeyboardInterrupt):
        driver.run(cfg, progress=False)
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["error"] == "interrupted by the user", trial


# Ray backend errors inside actors: the same one line and exit 2 as the local backend.
@pytest.mark.ray
@pytest.mark.slow
def test_bad_input_inside_actors_is_one_line_and_exit_2_on_both_backends(ray_session, tmp_path):
    root = image_tree(tmp_path / "ds", {"cat": 4, "dog": 4})
    (root / "a" / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"not a state dict")
    # the Ray backend joins the session's Ray (started once) rather than starting a Ray per run
    on_backend = {"local": ["--set", "num_cpus=2"], "ray": ["--address", ray_session.get_runtime_context().gcs_address]}
    cases = [(["--dataset", "folder", "--data-root", str(root), "--target-domain", "b"], "cannot decode image"),
             (["--set", "model=resnet18", "--set", f"pretrained_path={weights}"], "field 'pretrained_path'")]
    for args, words in cases:
        lines = {}
        for backend in ("local", "ray"):
            res = fedtune_cli("run", "--backend", backend, "--rounds", "1", "--no-progress", "--output",
                              str(tmp_path / "out"), "--set", "local_steps=1", "--set", "image_size=8"
                              if "--data-root" in args else "batch_size=8", *on_backend[backend], *args, cwd=tmp_path)
            assert res.returncode == 2, (backend, res.stderr[-3000:])
            errors = [ln for ln in res.stderr.splitlines() if ln.startswith("fedtune: error:")]
            assert len(errors) == 1 and words in errors[0] and "Traceback" not in res.stderr, (backend, res.stderr)
            lines[backend] = errors[0]
        assert lines["local"] == lines["ray"]


# ------------------------------------------------------------------------------------------------
# A sweep: SIGTERM = Ctrl-C (exit 130, resume hint); the study folder moves; a corrupt round file is
# quarantined and its deterministic trial re-run on --resume.
@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_sweep_then_resume_a_moved_copy_with_a_corrupt_round_file(ray_session, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import optuna_storage_url
    from fedtune.tune.study.sweep import run_sweep

    a_out, b_out = tmp_path / "A", tmp_path / "B"
    ext = tmp_path / "ext" / "my-fedavg.yaml"  # a SPACE file outside the study: gone after the move
    ext.parent.mkdir()
    ext.write_text("algorithm: fedavg\ndescription: my FedAvg\n")  # an override naming nothing: FedAvg's space
    address = ray_session.get_runtime_context().gcs_address
    # A tiny model, one client actor and one trial at a time: trials take well under a second, so
    # several of them are left to --resume whenever SIGTERM comes after the first trial row.
    samples = 8
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", str(ext), "--rounds", "2",
           "--num-samples", str(samples), "--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]",
           "--set", "max_client_actors=1", "--max-concurrent", "1", "--output", str(a_out), "--name", "st",
           "--address", address, "--no-report", "--sampler", "random"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        trials_file = a_out / "st" / "trials.parquet"
        while time.time() < deadline and proc.poll() is None:
            if trials_file.is_file() and load(trials_file, "trials").num_rows >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "--resume --name st" in err and "Traceback" not in err, err[-3000:]
    before = {r["trial_id"]: r for r in load(a_out / "st", "trials").to_pylist()}
    assert 1 <= len(before) < samples  # nothing finished is lost, the rest is left to --resume

    shutil.copytree(a_out, b_out)
    shutil.rmtree(a_out)  # a moved study: nothing may be read from, or written to, the old place
    shutil.rmtree(ext.parent)  # and the SPACE file it started from is gone: the study's own copy serves
    saved = json.loads((b_out / "st" / "study.json").read_text())
    assert saved["options"]["spaces"] == ["spaces/fedavg.yaml"]
    assert saved["searches"]["fedavg"]["space"] == "spaces/fedavg.yaml"
    first = sorted(t for t, r in before.items() if r["status"] == "completed")[0]
    path = b_out / "st" / "rounds" / f"{first}.parquet"
    old_rows = load(path).to_pylist()
    _truncate(path)

    result = run_sweep(SweepOptions(output=str(b_out), name="st", report=False), resume=True)
    assert not a_out.exists()
    assert any("re-run" in w and str(path) in w for w in result.warnings)
    assert (path.parent / f"{first}.parquet.corrupt").is_file()
    new_rows = load(path).to_pylist()
    metrics = ("round", "train_loss", "val_acc", "target_acc")
    assert [[r[m] for m in metrics] for r in new_rows] == [[r[m] for m in metrics] for r in old_rows]
    trials = load(b_out / "st", "trials").to_pylist()
    assert len(trials) == samples and {t["status"] for t in trials} == {"completed"}
    study = optuna.load_study(study_name="st/fedavg", storage=optuna_storage_url(b_out / "st"))
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in complete) == sorted(t["trial_id"] for t in trials)
    assert json.loads((b_out / "st" / "study.json").read_text())["searches"]["fedavg"]["tune_dir"] == "tune/fedavg"


def test_saved_space_paths_resolve_inside_the_study_folder(tmp_path):
    from fedtune.tune.study.resume import study_space as _study_space

    study = tmp_path / "moved" / "st"
    (study / "spaces").mkdir(parents=True)
    (study / "spaces" / "fedavg.yaml").write_text("algorithm: fedavg\n")
    assert _study_space(study, "spaces/fedavg.yaml") == study / "spaces" / "fedavg.yaml"
    # written by an older version with an absolute path that no longer exists: the study's copy
    assert _study_space(study, str(tmp_path / "old" / "st" / "spaces" / "fedavg.yaml")) == study / "spaces" / "fedavg.yaml"
    # an absolute path that exists is kept; one with no copy is kept too (load_space then names it)
    other = tmp_path / "x.yaml"
    other.write_text("algorithm: fedavg\n")
    assert _study_space(study, str(other)) == other
    assert _study_space(study, "/nowhere/y.yaml") == Path("/nowhere/y.yaml")
