"""Bookkeeping that must never be silently wrong (issue 8 §3): SIGTERM ends as interrupted with the
trial row written, empty class folders and one-class datasets are errors, relocatable studies, corrupt
Parquet files named (and repaired on ``sweep --resume``), Ray's wrapped actor errors unwrapped,
no batch of one, inputs refused up front, a locked optuna.db retried, batch order per round and
example-weighted train_loss.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/runtime/test_bookkeeping.py."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune.results.store import load

from tests.runtime.test_bookkeeping import _truncate, fedtune_cli, image_tree


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


# Ray backend errors inside actors: the same one line and exit 2 as the local backend.
@pytest.mark.ray
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
def test_sigterm_sweep_then_resume_a_moved_copy_with_a_corrupt_round_file(ray_session, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.common.searches import optuna_storage_url
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
