"""A study folder is not a way to run code on whoever resumes it (issue 44): Ray Tune's pickles in a
study's experiments are signed with a per-user key and checked before ``--resume`` unpickles any.

The unit tests here need no Ray: the key (created 0600, refused when others may read it or it is not
a regular file), the signatures against an HMAC-SHA256 written here from the definition, a changed,
an unsigned and an unsigned-folder file refused by name, and ``--trust-study-files``. The slow tests
at the end tamper with a real interrupted study's ``tuner.pkl`` and searcher state."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.common import state_signatures as sig
from fedtune.tune.common.state_signatures import (MANIFEST, ExperimentSignatures, check_experiment, key_path,
                                                 state_key)


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    """A config folder of this test's own: a fresh key, made on first use."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setattr(sig, "_KEYS", {})
    return home


def reference_mac(key: bytes, rel: str, content: bytes) -> str:
    """HMAC-SHA256 under the key of b"fedtune study file v1\\0", the file's path in the experiment, NUL,
    and its bytes."""
    return hmac.new(key, b"fedtune study file v1\0" + rel.encode() + b"\0" + content, hashlib.sha256).hexdigest()


def experiment(root: Path) -> dict[str, bytes]:
    """A Tune experiment's files as Ray Tune 2.60 leaves them (contents made up)."""
    files = {
        "tuner.pkl": pickle.dumps({"tuner": 1}),
        "experiment_state-2025-01-01_00-00-00.json": b'{"trial_data": []}',
        "search_gen_state-2025-01-01_00-00-00.json": pickle.dumps({"counter": 2}),
        "searcher-state-2025-01-01_00-00-00.pkl": pickle.dumps({"searcher": 1}),
        "callback-states-2025-01-01_00-00-00.pkl": pickle.dumps({0: {}}),
        "trial_a/error.pkl": pickle.dumps(ValueError("x")),
        "trial_a/checkpoint_000001/_dict_checkpoint.pkl": pickle.dumps({"w": 1}),
        # not unpickled by Tune: never asked for a signature
        "tmp-searcher-state-2025-01-01_00-00-00.pkl": b"half",
        "trial_a/result.json": b"{}",
        "trial_a/checkpoint_000001/weights.npy": b"\x93NUMPY",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def sign_experiment(exp: Path) -> None:
    """Every pickle of ``exp`` signed as it lies (what --trust-study-files does)."""
    book = ExperimentSignatures(exp)
    book.sign_tree()
    book.save()


SIGNED = {"tuner.pkl", "experiment_state-2025-01-01_00-00-00.json", "search_gen_state-2025-01-01_00-00-00.json",
          "searcher-state-2025-01-01_00-00-00.pkl", "callback-states-2025-01-01_00-00-00.pkl", "trial_a/error.pkl",
          "trial_a/checkpoint_000001/_dict_checkpoint.pkl"}


# -- the key ------------------------------------------------------------------------------------
def test_the_key_is_made_private_on_first_use_and_read_back_the_same(key_home):
    key = state_key()
    path = key_home / "fedtune" / "state-key"
    assert key_path() == path and path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert bytes.fromhex(path.read_text().strip()) == key and len(key) == 32
    sig._KEYS.clear()
    assert state_key() == key  # read back, not made again
    assert [p.name for p in path.parent.iterdir()] == ["state-key"]  # no temporary file left


def test_without_xdg_config_home_the_key_is_under_dot_config(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert key_path() == tmp_path / ".config" / "fedtune" / "state-key"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the XDG specification: ignored unless absolute
    assert key_path() == tmp_path / ".config" / "fedtune" / "state-key"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_key_others_may_read_or_write_is_refused_in_one_line(key_home, mode):
    state_key()
    path = key_path()
    path.chmod(mode)
    sig._KEYS.clear()
    with pytest.raises(ConfigError) as err:
        state_key()
    text = str(err.value)
    assert str(path) in text and f"{mode:04o}" in text and f"chmod 600 {path}" in text and "\n" not in text


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "garbage"])
def test_a_key_that_is_not_a_regular_file_holding_a_key_is_refused(key_home, tmp_path, kind):
    path = key_path()
    path.parent.mkdir(parents=True)
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target = tmp_path / "elsewhere"
        target.write_text("00" * 32)
        target.chmod(0o600)
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)  # opened without blocking: refused, not a hang
    else:
        path.write_text("not a key")
        path.chmod(0o600)
    with pytest.raises(ConfigError) as err:
        state_key()
    text = str(err.value)
    assert str(path) in text and "\n" not in text
    assert ("does not hold a key" in text) if kind == "garbage" else ("regular file" in text)


# -- signing and checking -------------------------------------------------------------------------
def test_every_pickle_tune_reads_is_signed_with_the_hmac_of_its_path_and_bytes(key_home, tmp_path):
    exp = tmp_path / "exp"
    files = experiment(exp)
    sign_experiment(exp)
    manifest = json.loads((exp / MANIFEST).read_text())["files"]
    assert set(manifest) == SIGNED
    key = state_key()
    for rel in SIGNED:
        assert manifest[rel] == [reference_mac(key, rel, files[rel])]
    check_experiment(exp, study="s")  # all signed: passes


@pytest.mark.parametrize("rel", sorted(SIGNED))
def test_a_changed_file_is_refused_naming_it(key_home, tmp_path, rel):
    exp = tmp_path / "exp"
    experiment(exp)
    sign_experiment(exp)
    (exp / rel).write_bytes(pickle.dumps("another payload"))
    with pytest.raises(ConfigError) as err:
        check_experiment(exp, study="s")
    text = str(err.value)
    assert f"{exp.resolve()}/{rel}" in text and "changed after your fedtune signed it" in text
    assert "--trust-study-files" in text and "nothing was run" in text and "\n" not in text


def test_an_added_unsigned_pickle_and_a_swapped_one_are_refused(key_home, tmp_path):
    exp = tmp_path / "exp"
    files = experiment(exp)
    sign_experiment(exp)
    (exp / "searcher-state-2099-01-01_00-00-00.pkl").write_bytes(b"newest: Tune would read this one")
    with pytest.raises(ConfigError, match=r"searcher-state-2099-01-01_00-00-00\.pkl .* is not signed by your fedtune"):
        check_experiment(exp, study="s")
    (exp / "searcher-state-2099-01-01_00-00-00.pkl").unlink()
    # a signed file's bytes under another signed file's name: the signature binds the name too
    (exp / "callback-states-2025-01-01_00-00-00.pkl").write_bytes(files["searcher-state-2025-01-01_00-00-00.pkl"])
    with pytest.raises(ConfigError, match="callback-states-2025-01-01_00-00-00.pkl"):
        check_experiment(exp, study="s")


def test_a_folder_without_signatures_is_refused_with_the_opt_in_and_trusting_it_signs_it(key_home, tmp_path):
    exp = tmp_path / "exp"
    experiment(exp)
    with pytest.raises(ConfigError) as err:
        check_experiment(exp, study="old")
    text = str(err.value)
    assert text.startswith("--resume: study 'old': ") and "carries no fedtune signatures" in text
    assert "resume with --trust-study-files" in text and str(key_path()) in text and "\n" not in text
    assert not (exp / MANIFEST).exists()  # refusing changes nothing
    check_experiment(exp, study="old", trust=True)
    assert set(json.loads((exp / MANIFEST).read_text())["files"]) == SIGNED
    check_experiment(exp, study="old")  # signed now: the next resume needs no flag


def test_another_users_signatures_and_a_forged_manifest_are_refused(key_home, tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    experiment(exp)
    sign_experiment(exp)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other-user"))
    sig._KEYS.clear()
    with pytest.raises(ConfigError, match="changed after your fedtune signed it"):
        check_experiment(exp, study="s")
    (exp / MANIFEST).write_text("[1, 2")
    with pytest.raises(ConfigError, match="is not a signature file fedtune wrote"):
        check_experiment(exp, study="s")


def test_the_last_versions_of_a_file_stay_accepted_while_tunes_copy_lags(key_home, tmp_path):
    exp, staging = tmp_path / "exp", tmp_path / "staging"
    exp.mkdir()
    staging.mkdir()
    state = "experiment_state-2025-01-01_00-00-00.json"
    versions = [json.dumps({"v": i}).encode() for i in range(sig.KEPT_VERSIONS + 1)]
    book = ExperimentSignatures(exp)
    for i, data in enumerate(versions):  # Tune rewrites its staged state; the signer sees each version
        (staging / state).write_bytes(data)
        os.utime(staging / state, ns=(i, i))
        book.sign_staging(staging)
    book.save()
    (exp / state).write_bytes(versions[-2])  # the background copy is one version behind: accepted
    check_experiment(exp, study="s")
    (exp / state).write_bytes(versions[1])
    check_experiment(exp, study="s")
    (exp / state).write_bytes(versions[0])  # older than the versions kept
    with pytest.raises(ConfigError, match=state):
        check_experiment(exp, study="s")


def test_the_signer_callback_signs_what_tune_writes_and_pickles_without_the_key(key_home, tmp_path):
    import pyarrow.fs

    from fedtune.tune.trial.state_signer import StateSigner

    exp, staging = tmp_path / "exp", tmp_path / "staging"
    exp.mkdir()
    (staging / "trial_a").mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"tuner")
    (exp / "searcher-state-9999.pkl").write_bytes(b"planted before the driver started")
    storage = SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(), experiment_fs_path=str(exp),
                              experiment_driver_staging_path=str(staging), trial_dir_name="trial_a")
    trial = SimpleNamespace(storage=storage, pickled_error_file=str(staging / "trial_a" / "error.pkl"))
    signer = StateSigner()
    (staging / "searcher-state-1.pkl").write_bytes(b"searcher")
    signer.on_step_end(iteration=1, trials=[trial])
    (staging / "trial_a" / "error.pkl").write_bytes(b"error")
    signer.on_trial_error(iteration=2, trials=[trial], trial=trial)
    (exp / "trial_a" / "checkpoint_000001").mkdir(parents=True)
    (exp / "trial_a" / "checkpoint_000001" / "_dict_checkpoint.pkl").write_bytes(b"ckpt")
    signer.on_checkpoint(iteration=3, trials=[trial], trial=trial,
                         checkpoint=SimpleNamespace(path=str(exp / "trial_a" / "checkpoint_000001")))
    key = state_key()
    manifest = json.loads((exp / MANIFEST).read_text())["files"]
    assert manifest == {"tuner.pkl": [reference_mac(key, "tuner.pkl", b"tuner")],
                        "searcher-state-1.pkl": [reference_mac(key, "searcher-state-1.pkl", b"searcher")],
                        "trial_a/error.pkl": [reference_mac(key, "trial_a/error.pkl", b"error")],
                        "trial_a/checkpoint_000001/_dict_checkpoint.pkl":
                            [reference_mac(key, "trial_a/checkpoint_000001/_dict_checkpoint.pkl", b"ckpt")]}
    assert "searcher-state-9999.pkl" not in manifest  # never signs a file as it lies in the folder
    # Tune pickles its callbacks into tuner.pkl: the signer carries nothing, the key least of all
    blob = pickle.dumps(signer)
    assert key.hex().encode() not in blob and key not in blob and len(blob) < 200
    assert isinstance(pickle.loads(blob), StateSigner)


def test_every_folder_of_the_studys_tune_storage_is_checked(key_home, tmp_path):
    """A restorable experiment needs every pickle signed; one Tune will start afresh may hold its
    unsigned tuner.pkl (rewritten before it is read) but nothing else unsigned: the driver would
    otherwise run there and a later resume find the planted file signed."""
    from fedtune.tune.study.resume import check_study_experiments

    tune = tmp_path / "tune"
    fresh = tune / "fedavg"  # a driver killed before Tune's first snapshot: tuner.pkl only
    fresh.mkdir(parents=True)
    (fresh / "tuner.pkl").write_bytes(b"unsigned")
    check_study_experiments(str(tune), study="s")
    (fresh / "searcher-state-9999.pkl").write_bytes(b"planted")
    with pytest.raises(ConfigError, match=r"fedavg/searcher-state-9999\.pkl holds pickled Ray Tune state"):
        check_study_experiments(str(tune), study="s")
    (fresh / "searcher-state-9999.pkl").unlink()
    (fresh / "experiment_state-2025.json").write_bytes(b"{}")  # restorable now: tuner.pkl is read
    book = ExperimentSignatures(fresh)
    book.sign_stored("experiment_state-2025.json")
    book.save()
    with pytest.raises(ConfigError, match=r"fedavg/tuner\.pkl holds .* it is not signed by your fedtune key"):
        check_study_experiments(str(tune), study="s")
    check_study_experiments(str(tune), study="s", trust=True)
    check_study_experiments(str(tune), study="s")


# -- the command line -----------------------------------------------------------------------------
def test_trust_study_files_without_resume_is_refused_in_one_line(tmp_path, capsys):
    from fedtune.cli import main

    assert main(["sweep", "--algorithm", "fedavg", "--output", str(tmp_path), "--trust-study-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--trust-study-files only applies with --resume" in err
    assert not any(tmp_path.iterdir())


def test_resume_takes_trust_study_files_and_names_it_among_its_flags(tmp_path):
    from fedtune.tune.study.resume import RESUME_ALLOWED

    assert "--trust-study-files" in RESUME_ALLOWED
    res = subprocess.run([sys.executable, "-m", "fedtune.cli", "sweep", "--resume", "--trust-study-files", "--output",
                          str(tmp_path), "--name", "none"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "no study 'none'" in res.stderr, res.stderr  # past the flag check


# ------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------- CMA-ES's pickle in the Optuna storage
def test_cma_state_in_the_optuna_storage_is_signed_before_it_is_read_and_a_changed_one_refused(key_home, tmp_path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.CmaEsSampler(seed=0, n_startup_trials=1))
    for _ in range(16):  # past one population (6 in 2-D): CMA-ES then pickles its optimizer into a trial
        t = study.ask()
        x, y = t.suggest_float("x", -1, 1), t.suggest_float("y", -1, 1)
        study.tell(t, x * x + y * y)
    finished = study.get_trials(deepcopy=False)
    assert any(k.startswith("cma:optimizer") for t in finished for k in t.system_attrs)  # CMA-ES pickled its state
    with pytest.raises(ConfigError, match=r"^--resume: the Optuna study '.*' holds CMA-ES state pickled in its trial "
                                          r"\d+ that sampling would unpickle.*--trust-study-files$"):
        sig.check_cma_trials(tmp_path, study.study_name, finished, trust=False)
    for t in finished:
        sig.sign_cma_trial(tmp_path, study.study_name, t.number, t.system_attrs)
    sig.check_cma_trials(tmp_path, study.study_name, finished, trust=False)  # signed: passes
    (with_cma,) = [t for t in finished if any(k.startswith("cma:optimizer") for k in t.system_attrs)][-1:]
    key = next(k for k in with_cma.system_attrs if k.startswith("cma:optimizer"))
    tampered = SimpleNamespace(number=with_cma.number,
                               system_attrs={**with_cma.system_attrs, key: pickle.dumps(print).hex()})
    with pytest.raises(ConfigError, match=rf"in its trial {with_cma.number} that sampling would unpickle"):
        sig.check_cma_trials(tmp_path, study.study_name, [tampered], trust=False)
    sig.check_cma_trials(tmp_path, study.study_name, [tampered], trust=True)  # the user vouches: signed
    sig.check_cma_trials(tmp_path, study.study_name, [tampered], trust=False)


# A real study killed mid-search (SIGKILL), its tuner.pkl or searcher state then replaced.
from tests.tune.test_sweep import TINY_SET, paused_driver, wait_until_paused  # noqa: E402 - the same driver pause


def kill_a_study(out: Path, ray_session) -> Path:
    """A study whose driver was killed (SIGKILL) during its second trial: restorable by Tune.

    A resumed experiment keeps Tune's staging folder on the driver (named by the first run's start),
    so two copies of one study resumed on one Ray would share it: a test that resumes one makes its own."""
    from fedtune.tune.tuner.storage import restorable

    out.mkdir(parents=True, exist_ok=True)
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "3",
           "--num-samples", "2", "--max-concurrent", "1", "--set", "local_steps=1", *TINY_SET,
           "--output", str(out), "--name", "k", "--address", address, "--no-report"]
    env, flag, _ = paused_driver(out, "result:2")
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    exp = out / "k" / "tune" / "fedavg"
    assert restorable(exp) and (exp / MANIFEST).is_file()
    return out / "k"


@pytest.fixture(scope="module")
def killed_study(ray_session, tmp_path_factory):
    """One killed study for the tests whose resume is refused before Ray Tune starts."""
    return kill_a_study(tmp_path_factory.mktemp("killed"), ray_session)


def payload(marker: Path, wrapped: bytes) -> bytes:
    """A pickle that writes ``marker`` when loaded, then gives back what ``wrapped`` holds (so a resume
    that loads it carries on normally)."""
    class Payload:
        def __reduce__(self):
            return eval, (f"(open({str(marker)!r}, 'w').close(), __import__('pickle').loads({wrapped!r}))[1]",)

    return pickle.dumps(Payload())


def tampered(killed_study: Path, tmp_path: Path, which: str) -> tuple[Path, Path, Path]:
    study = tmp_path / "out" / "k"
    shutil.copytree(killed_study, study)
    exp = study / "tune" / "fedavg"
    target = exp / "tuner.pkl" if which == "tuner" else max(exp.glob("searcher-state-*.pkl"))
    marker = tmp_path / "pwned"
    target.write_bytes(payload(marker, target.read_bytes()))
    return study, target, marker
