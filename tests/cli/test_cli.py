"""The command line (fedtune/cli.py), called in-process with the local backend (no Ray)."""

from __future__ import annotations

import math

import pytest

from fedtune.cli import build_parser, config_from_args, main
from fedtune.config import FederatedRunConfig
from fedtune.results.store import load

REQUIRED = ["study", "trial_id", "algorithm", "dataset", "target_domain", "seed", "round", "train_loss", "val_acc",
            "target_acc", "wall_s", "client_s", "server_s", "status", "hp.local_lr"]
METRICS = ("train_loss", "val_acc", "target_acc")


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    # rich wraps at 80 columns when not on a terminal; keep long tmp paths on one line
    monkeypatch.setenv("COLUMNS", "400")


def _run(out, *extra, rounds=2, dataset="rect4"):
    return main(["run", "--backend", "local", "--dataset", dataset, "--rounds", str(rounds), "--output", str(out),
                 "--no-progress", *extra])


def _metrics(study_dir):
    rows = sorted(load(study_dir).to_pylist(), key=lambda r: r["round"])
    return [tuple(r[m] for m in METRICS) for r in rows]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedtune: error: ")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    return err


# ------------------------------------------------------------------------------ listing commands
def test_datasets_lists_names(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("rotated-digits", "rect4", "pacs", "vlcs", "office-home", "folder"):
        assert name in out


def test_algorithms_lists_presets_methods_rules(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "sgd" in out
    assert "client methods" in out and "server rules" in out


def test_fields_lists_every_field(capsys):
    assert main(["fields"]) == 0
    out = capsys.readouterr().out
    for name in FederatedRunConfig.field_names():
        assert name in out


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


# ------------------------------------------------------------------------------ precedence
def test_precedence_file_flags_set(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rounds: 9\nseed: 4\nlocal_lr: 0.3\ndataset: rect4\n")
    args = build_parser().parse_args(["run", "--config", str(p), "--rounds", "5", "--seed", "6",
                                      "--set", "seed=7"])
    cfg = config_from_args(args)
    assert cfg.rounds == 5  # flag beats file
    assert cfg.seed == 7  # --set beats flag
    assert cfg.local_lr == 0.3 and cfg.dataset == "rect4"  # from the file


# ------------------------------------------------------------------------------ a real local run
def test_run_writes_results(tmp_path, capsys):
    assert _run(tmp_path, "--set", "local_steps=2") == 0
    out = capsys.readouterr().out
    cfg = FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "rounds": 2, "output": str(tmp_path),
                               "local_steps": 2})
    rounds_file = tmp_path / "default" / "rounds" / f"{cfg.trial_id()}.parquet"
    assert f"results: {rounds_file}" in out
    assert rounds_file.is_file()

    table = load(tmp_path / "default")
    assert table.num_rows == 2
    cols = set(table.column_names)
    missing = [c for c in REQUIRED if c not in cols]
    assert not missing
    assert {"val_acc.d1", "val_acc.d2", "val_acc.d3", "target_acc.d0"} <= cols  # rect4: target d0, sources d1..d3
    rows = sorted(table.to_pylist(), key=lambda r: r["round"])
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert r["study"] == "default" and r["trial_id"] == cfg.trial_id()
        assert r["algorithm"] == "fedavg" and r["dataset"] == "rect4" and r["target_domain"] == "d0"
        assert r["seed"] == 0 and r["status"] == "ok"
        assert r["hp.local_lr"] == 0.05 and r["hp.local_steps"] == 2
        assert math.isfinite(r["train_loss"])
        for m in ("val_acc", "target_acc", "val_acc.d1", "target_acc.d0"):
            assert 0.0 <= r[m] <= 1.0
        # one target domain: the overall target accuracy is that domain's
        assert r["target_acc"] == r["target_acc.d0"]
        assert r["wall_s"] >= r["client_s"] >= 0 and r["server_s"] >= 0

    trials = load(tmp_path / "default", "trials").to_pylist()
    assert len(trials) == 1 and trials[0]["status"] == "completed" and trials[0]["rounds_done"] == 2


def test_rerun_does_not_duplicate_rows(tmp_path, capsys):
    for _ in range(2):
        assert _run(tmp_path, "--set", "local_steps=2") == 0
    capsys.readouterr()
    assert load(tmp_path / "default").num_rows == 2
    assert load(tmp_path / "default", "trials").num_rows == 1


def test_same_seed_is_deterministic_other_seed_differs(tmp_path, capsys):
    assert _run(tmp_path / "a", "--seed", "1", "--set", "local_steps=3") == 0
    assert _run(tmp_path / "b", "--seed", "1", "--set", "local_steps=3") == 0
    assert _run(tmp_path / "c", "--seed", "2", "--set", "local_steps=3") == 0
    capsys.readouterr()
    a, b, c = (_metrics(tmp_path / d / "default") for d in "abc")
    assert len(a) == 2
    assert a == b  # bit-identical metrics
    assert a != c


def test_diverging_run(tmp_path, capsys):
    code = _run(tmp_path, "--set", "local_lr=1e6", rounds=3)
    out = capsys.readouterr().out
    assert code == 3
    assert "diverged" in out
    rows = sorted(load(tmp_path / "default").to_pylist(), key=lambda r: r["round"])
    assert 1 <= len(rows) < 3  # stopped early
    assert rows[-1]["status"] == "diverged"
    assert not math.isfinite(rows[-1]["train_loss"])
    assert all(r["status"] == "ok" for r in rows[:-1])
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["status"] == "diverged" and trial["rounds_done"] == len(rows)
    assert "non-finite" in trial["error"]


# ------------------------------------------------------------------------------ errors: exit 2
def test_unknown_dataset(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--dataset", "nope", "--output", str(tmp_path), "--no-progress"])
    assert "'nope' is unknown" in err and "rect4" in err


def test_unknown_algorithm(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--algorithm", "nope", "--output", str(tmp_path)])
    assert "field 'algorithm'" in err and "allowed: " in err and "fedavg" in err


def test_missing_data_root(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--dataset", "pacs", "--output", str(tmp_path), "--no-progress"])
    assert "'pacs' needs data_root" in err and "--data-root" in err


def test_bad_set_value(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--set", "rounds=abc", "--output", str(tmp_path)])
    assert "field 'rounds'" in err and "expected an integer" in err


def test_set_out_of_range(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--set", "client_gpus=-1", "--output", str(tmp_path)])
    assert "field 'client_gpus'" in err and "allowed: >= 0" in err


def test_set_without_equals(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--set", "rounds", "--output", str(tmp_path)])
    assert "--set 'rounds': expected key=value" in err


def test_set_unknown_field(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--set", "local_lrr=0.1", "--output", str(tmp_path)])
    assert "unknown field 'local_lrr'" in err and "local_lr" in err


def test_missing_config_file(tmp_path, capsys):
    err = _error(capsys, ["run", "--config", str(tmp_path / "missing.yaml"), "--output", str(tmp_path)])
    assert "missing.yaml" in err and "does not exist" in err


def test_model_that_does_not_fit_the_dataset(tmp_path, capsys):
    err = _error(capsys, ["run", "--backend", "local", "--dataset", "rect4", "--set", "model=cnn",
                          "--output", str(tmp_path), "--no-progress"])
    assert "field 'model'" in err and "'cnn' needs image input" in err and "allowed here: mlp" in err


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize("flag, value, words", [
    ("--name", "x" * 300, "300 bytes long"), ("--name", "a/b", "path separators"), ("--name", "a\0b", "NUL"),
    ("--output", "out/" + "y" * 300, "300 bytes long"), ("--output", "out\0put", "NUL")])
def test_a_study_name_or_output_no_file_system_takes_is_one_line_up_front(tmp_path, capsys, monkeypatch, cmd, flag,
                                                                          value, words):
    """A 300-character study name was a 'File name too long' traceback from run and sweep."""
    monkeypatch.chdir(tmp_path)
    base = (["run", "--backend", "local", "--dataset", "rect4", "--rounds", "1", "--no-progress"] if cmd == "run"
            else ["sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "1", "--no-report"])
    extra = [flag, value] + (["--output", str(tmp_path)] if flag == "--name" else ["--name", "ok"])
    err = _error(capsys, [*base, *extra])
    assert words in err and flag.lstrip("-") in err, err
    assert list(tmp_path.iterdir()) == []  # nothing was made


def test_a_study_name_of_200_bytes_still_runs(tmp_path):
    assert _run(tmp_path, "--name", "n" * 200, rounds=1) == 0
    assert (tmp_path / ("n" * 200) / "trials.parquet").is_file()


def test_a_wrong_address_is_one_line_at_once(tmp_path, capsys, monkeypatch):
    """A wrong --address printed about 10 lines of Ray warnings over 20 s before the one-line error."""
    import time

    from fedtune.runtime import cluster, driver

    spent = []

    def timed(*args, **kwargs):
        t0 = time.time()
        try:
            return cluster.connect_ray(*args, **kwargs)
        finally:
            spent.append(time.time() - t0)

    monkeypatch.setattr(driver, "connect_ray", timed)
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # an earlier test's Ray in this process is not joined
    assert main(["run", "--backend", "ray", "--address", "127.0.0.1:1", "--dataset", "rect4", "--rounds", "1",
                 "--output", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error" in ln.lower() or "warn" in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith("fedtune: error: could not join the Ray cluster"), err
    assert "127.0.0.1:1" in err and "nothing answers" in err and "Traceback" not in err, err
    assert len(spent) == 1 and spent[0] < 8, spent  # Ray's own retries took about 20 s
