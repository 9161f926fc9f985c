"""Optuna for teams and concurrent trials: ``fedtune sweep --optuna-storage URL`` (a journal file or a
database outside the study directory; bad URLs refused before anything starts; a killed driver
resumed onto the same storage), TPE's constant liar when trials run side by side, and the
Pareto-front plot of multi-objective (nsga2) studies."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.plan import plan_study
from fedtune.tune.study.sweep import run_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = {"local_steps": 1, "model": "mlp", "mlp_hidden": [8], "max_client_actors": 1}


def opts(tmp_path, **kw) -> SweepOptions:
    base = {"algorithms": ["fedavg"], "rounds": 1, "num_samples": 2, "output": str(tmp_path / "out"), "name": "s",
            "overrides": dict(TINY), "report": False}
    base.update(kw)
    return SweepOptions(**base)


def trial_ids(study_dir: Path) -> list[str]:
    from fedtune.results.store import load

    return sorted(load(study_dir, "trials").column("trial_id").to_pylist())


# ------------------------------------------------------------------------------------------------
# --optuna-storage: checked before anything starts.
@pytest.mark.parametrize("url, words", [
    ("optuna.db", ["is not a URL"]),
    ("journal://relative/study.log", ["absolute path", "journal:///dir/file.log"]),
    ("journal:///no/such/dir/study.log", ["'/no/such/dir'", "not a directory"]),
    ("sqlite://", ["in-memory"]),
    ("sqlite:///:memory:", ["in-memory"]),
    ("postgres://ana@db/optuna", ["postgresql://"]),
    ("mysql+nosuchdriver://ana:secret@db/optuna", ["not a database URL", "ana:***@db"]),
])
def test_bad_optuna_storage_urls_fail_before_anything_starts(tmp_path, url, words):
    with pytest.raises(ConfigError) as err:
        plan_study(opts(tmp_path, optuna_storage=url))
    text = str(err.value)
    assert text.startswith("option '--optuna-storage'") and "allowed: sqlite:///PATH" in text and "journal:///" in text
    assert "secret" not in text  # a database password is never echoed
    for w in words:
        assert w in text, (w, text)


def test_a_relative_sqlite_url_is_saved_absolute_and_an_unopenable_one_fails_before_ray(tmp_path, monkeypatch):
    (tmp_path / "team").mkdir()
    monkeypatch.chdir(tmp_path)
    plan = plan_study(opts(tmp_path, optuna_storage="sqlite:///team/optuna.db"))
    assert plan.optuna_url == f"sqlite:///{tmp_path / 'team' / 'optuna.db'}" == plan.options.optuna_storage
    assert plan_study(opts(tmp_path)).optuna_url == f"sqlite:///{tmp_path / 'out' / 's' / 'optuna.db'}"
    # a URL that parses but cannot be opened (here: a directory, not a database file) is a clear error
    # before Ray starts (no ray.init in this test: run_sweep would start one after the check)
    with pytest.raises(ConfigError, match=r"option '--optuna-storage': cannot open 'sqlite:///.*team'"):
        run_sweep(opts(tmp_path, name="bad", optuna_storage=f"sqlite:///{tmp_path / 'team'}"))


def test_cli_refuses_a_bad_optuna_storage_with_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fedtune.cli", "sweep", "--output", str(tmp_path), "--optuna-storage",
                          "journal://study.log"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 2 and "option '--optuna-storage'" in res.stderr and "Traceback" not in res.stderr
    # --resume re-opens the saved storage; another one would lose the study's Optuna history
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args

    args = build_parser().parse_args(["sweep", "--resume", "--optuna-storage", f"journal:///{tmp_path}/x.log"])
    with pytest.raises(ConfigError, match="--optuna-storage cannot change"):
        options_from_args(args)
    given = options_from_args(build_parser().parse_args(["sweep", "--optuna-storage", "sqlite:////tmp/t.db"]))
    assert given.optuna_storage == "sqlite:////tmp/t.db"


# ------------------------------------------------------------------------------------------------
# TPE's constant liar: on when trials may run side by side.
def test_tpe_uses_constant_liar_exactly_when_trials_run_side_by_side():
    from fedtune.tune.tuner.samplers import make_sampler

    assert make_sampler("tpe", 0, 9, concurrency=1)._constant_liar is False
    assert make_sampler("tpe", 0, 9, concurrency=4)._constant_liar is True
    assert make_sampler("tpe", 0, 9, concurrency=None)._constant_liar is True  # not capped: maybe several


# ------------------------------------------------------------------------------------------------
# The Pareto-front plot of a multi-objective study.
def test_pareto_front_plot_of_each_multi_objective_study_only(tmp_path):
    import optuna
    from matplotlib.image import imread

    from fedtune.reports.importances import study_optuna
    from fedtune.reports.plots import pareto_fronts

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_dir = tmp_path / "st"
    study_dir.mkdir()
    log = tmp_path / "team.log"
    url = f"journal:///{log}".replace("////", "///")
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(log)))
    two = lambda t: (t.suggest_float("x", 0, 1), t.suggest_float("y", 0, 1))  # noqa: E731
    for name, directions in (("st/nsga", ["maximize", "minimize"]), ("st/tpe", ["maximize"]),
                             ("other/nsga", ["maximize", "minimize"])):  # another team member's study
        study = optuna.create_study(study_name=name, storage=storage, directions=directions,
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(two if len(directions) == 2 else (lambda t: t.suggest_float("x", 0, 1)), n_trials=6)
    (study_dir / "study.json").write_text(json.dumps({"study": "st", "metric": ["val_acc", "server_s"],
                                                      "options": {"optuna_storage": url}}))
    assert study_optuna(study_dir)[1] == ["st/nsga", "st/tpe"]  # only this study's names
    made = pareto_fronts(study_dir, study_dir / "plots")
    assert list(made) == ["pareto nsga"] and made["pareto nsga"] == study_dir / "plots" / "pareto_nsga.png"
    png = made["pareto nsga"]
    assert png.read_bytes()[:8] == PNG_MAGIC and imread(png).shape[2] in (3, 4)
    assert sorted(p.name for p in png.parent.iterdir()) == ["pareto_nsga.png"]  # no temporary file, no other plot


# ------------------------------------------------------------------------------------------------
# Real studies on the session's Ray (2 CPUs).
@pytest.mark.ray
@pytest.mark.slow
def test_journal_storage_holds_the_trials_and_concurrent_tpe_lies(ray_session, tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    log = tmp_path / "shared" / "optuna.log"
    log.parent.mkdir()
    result = run_sweep(opts(tmp_path, name="j", max_concurrent=2, optuna_storage=f"journal://{log}"))
    study_dir = result.study_dir
    assert not (study_dir / "optuna.db").exists()
    data = json.loads((study_dir / "study.json").read_text())
    assert data["options"]["optuna_storage"] == data["optuna_storage"] == f"journal://{log}"
    assert data["max_concurrent"] == 2 and data["constant_liar"] is True
    journal = optuna.storages.JournalStorage(JournalFileBackend(str(log)))
    study = optuna.load_study(study_name="j/fedavg", storage=journal)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in study.trials) == trial_ids(study_dir)
    # the sampler Tune ran (its searcher's saved state): TPE with Optuna's constant liar on
    (state,) = (study_dir / "tune" / "fedavg").glob("searcher-state-*.pkl")
    sampler = pickle.loads(state.read_bytes())["_sampler"]
    assert type(sampler).__name__ == "TPESampler" and sampler._constant_liar is True


@pytest.mark.ray
@pytest.mark.slow
def test_sqlite_outside_the_study_survives_a_killed_driver_and_nsga2_gets_a_pareto_plot(ray_session, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from fedtune.results.store import load

    team = tmp_path / "team"
    team.mkdir()
    url = f"sqlite:///{team / 'optuna-team.db'}"
    out = tmp_path / "out"
    study_dir = out / "kill"
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "3",
           "--max-concurrent", "1", "--sampler", "nsga2", "--optuna-storage", url, "--output", str(out),
           "--name", "kill", "--address", ray_session.get_runtime_context().gcs_address, "--no-report",
           *[a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if (study_dir / "trials.parquet").is_file() and load(study_dir, "trials").num_rows >= 1 \
                    and any((study_dir / "tune" / "fedavg").glob("experiment_state-*.json")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies mid-study, after its first trial and a Tune snapshot
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert len(trial_ids(study_dir)) < 3

    # --resume from another directory: the saved URL is absolute; Tune's pickled searcher reopens it
    result = run_sweep(SweepOptions(output=str(out), name="kill"), resume=True)

    assert not (study_dir / "optuna.db").exists()
    assert optuna.get_all_study_names(storage=url) == ["kill/fedavg"]
    study = optuna.load_study(study_name="kill/fedavg", storage=url)
    assert all(t.state.is_finished() for t in study.trials)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    # every trial of the Arrow store was told COMPLETE in the team database (the trials the resumed
    # driver ran too: its searcher, unpickled from Tune's experiment, wrote there)
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in complete) == trial_ids(study_dir)
    assert len(complete) == 3 and all(len(t.values) == 2 for t in complete)
    # the budget was spent across the two drivers: done, nothing "ended early"
    assert result.searches["fedavg"]["status"] == "done" and "ended_early" not in result.searches["fedavg"]
    # the rest never ran: asked by the killed driver after Tune's last snapshot, or a draw the
    # restored sampler replayed (a configuration that already ran)
    assert all(t.user_attrs["fedtune_status"] in ("orphaned", "duplicate") for t in study.trials
               if t.state != TrialState.COMPLETE)
    png = result.report.plots["pareto fedavg"]
    assert png == study_dir / "plots" / "pareto_fedavg.png" and png.read_bytes()[:8] == PNG_MAGIC
    assert "(plots/pareto_fedavg.png)" in result.report.markdown_path.read_text()
    assert "kill/fedavg" in " ".join(result.report.importance_notes) + " ".join(result.report.importances)
