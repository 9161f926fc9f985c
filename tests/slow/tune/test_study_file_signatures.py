"""A study folder is not a way to run code on whoever resumes it (issue 44): Ray Tune's pickles in a
study's experiments are signed with a per-user key and checked before ``--resume`` unpickles any.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_study_file_signatures.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.tune.common.state_signatures import check_experiment

from tests.tune.test_study_file_signatures import kill_a_study, tampered
from tests.tune.test_study_file_signatures import killed_study  # noqa: F401 - fixtures, used by name


def resume(out: Path, *extra: str, capsys) -> tuple[int, str]:
    import ray

    from fedtune.cli import main

    capsys.readouterr()
    rc = main(["sweep", "--resume", "--name", "k", "--output", str(out), "--no-report",
               "--address", ray.get_runtime_context().gcs_address, *extra])
    return rc, capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.parametrize("which", ["tuner", "searcher"])
def test_a_replaced_pickle_is_refused_naming_it_and_never_runs(killed_study, tmp_path, which, capsys):
    study, target, marker = tampered(killed_study, tmp_path, which)
    before = json.loads((study / "study.json").read_text())
    rc, err = resume(study.parent, capsys=capsys)
    assert rc == 2, err[-3000:]
    line = err.strip()
    assert "\n" not in line and str(target) in line and "changed after your fedtune signed it" in line, line
    assert "--trust-study-files" in line and "Traceback" not in err
    assert not marker.exists()
    assert json.loads((study / "study.json").read_text()) == before  # nothing resumed


@pytest.mark.ray
def test_with_trust_study_files_the_replaced_pickle_is_loaded(ray_session, tmp_path, capsys):
    """The flag is what lets it through: the same tampered study resumes, and the payload ran."""
    killed = kill_a_study(tmp_path / "killed", ray_session)
    study, _, marker = tampered(killed, tmp_path, "tuner")
    rc, err = resume(study.parent, "--trust-study-files", capsys=capsys)
    assert rc == 0, err[-3000:]
    assert marker.exists()
    assert {s["status"] for s in json.loads((study / "study.json").read_text())["searches"].values()} == {"done"}


@pytest.mark.ray
def test_an_honestly_killed_study_resumes_without_the_flag(ray_session, tmp_path, capsys):
    study = kill_a_study(tmp_path, ray_session)
    rc, err = resume(study.parent, capsys=capsys)
    assert rc == 0, err[-3000:]
    data = json.loads((study / "study.json").read_text())
    assert {s["status"] for s in data["searches"].values()} == {"done"}
    check_experiment(study / "tune" / "fedavg", study="k")  # and what this driver wrote is signed in turn
