"""Optuna for teams and concurrent trials: ``fedtune sweep --optuna-storage URL`` (a journal file or a
database outside the study directory; bad URLs refused before anything starts; a killed driver
resumed onto the same storage), TPE's constant liar when trials run side by side, and the
Pareto-front plot of multi-objective (nsga2) studies."""

from __future__ import annotations

import json
import subprocess
import sys

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
