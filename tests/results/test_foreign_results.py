"""What is not fedtune's is refused, not read: a Parquet file of another schema (alone, or dropped into
a study's ``rounds/``), a folder that is not a study given to ``fedtune report``; and the atomic
writer's own stray temporary files are recognised, ignored by readers and cleaned up."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedtune.results import atomic  # noqa: E402
from fedtune.results.atomic import TEMP_MARKER, is_temp_name  # noqa: E402
from fedtune.results.arrow import ForeignResultsError, rows_to_table
from fedtune.results.schema import IDENTITY_COLUMNS
from fedtune.results.store import check_study_dir, clean_stray_temp_files, corrupt_files
from fedtune.cli import main  # noqa: E402
from fedtune.errors import ConfigError, DataError  # noqa: E402
from fedtune.results.store import ResultsStore, load
from fedtune.results.summary import summarize_trial

# The columns of the first schema fedtune ever wrote (git history of the results module, commit 0c700af):
# files of that version must still load.
OLD_ROUND_COLUMNS = {
    "study": pa.string(), "trial_id": pa.string(), "algorithm": pa.string(), "client_method": pa.string(),
    "server_rule": pa.string(), "dataset": pa.string(), "setting": pa.string(), "target_domain": pa.string(),
    "seed": pa.int64(), "round": pa.int64(), "train_loss": pa.float64(), "val_acc": pa.float64(),
    "target_acc": pa.float64(), "wall_s": pa.float64(), "client_s": pa.float64(), "server_s": pa.float64(),
    "status": pa.string(), "num_participants": pa.int64(), "skipped_clients": pa.int64(), "bytes_moved": pa.int64(),
}
OLD_TRIAL_COLUMNS = {
    **{k: v for k, v in OLD_ROUND_COLUMNS.items() if k in IDENTITY_COLUMNS},
    "status": pa.string(), "rounds_done": pa.int64(), "final_val_acc": pa.float64(), "final_target_acc": pa.float64(),
    "best_val_acc": pa.float64(), "best_round": pa.int64(), "best_target_acc": pa.float64(),
    "started_at": pa.timestamp("us", tz="UTC"), "ended_at": pa.timestamp("us", tz="UTC"), "error": pa.string(),
    "config_json": pa.string(),
}


def _rows(trial: str, n: int = 2) -> list[dict]:
    return [{"trial_id": trial, "round": r, "algorithm": "fedavg", "dataset": "rect4", "setting": "fdg",
             "target_domain": "d0", "seed": 0, "val_acc": 0.5 + r / 10, "target_acc": 0.4, "status": "ok"}
            for r in range(1, n + 1)]


def _study(out: Path, name: str = "s", trials: tuple[str, ...] = ("a",)) -> ResultsStore:
    store = ResultsStore(out, name)
    for t in trials:
        rows = _rows(t)
        store.write_rounds(t, rows)
        store.write_trial(summarize_trial(rows, config={"trial_id": t}, status="completed", error=None,
                                          started_at=None, ended_at=None))
    return store


def _foreign(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"a": [1, 2]}), path)
    return path


def _old_table(columns: dict, **values) -> pa.Table:
    return pa.table({k: pa.array([values.get(k)], t) for k, t in columns.items()})


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    return line


# --------------------------------------------------------------------------- foreign Parquet files


def test_a_foreign_parquet_file_is_refused_naming_it_and_what_is_missing(tmp_path):
    f = _foreign(tmp_path / "data.parquet")
    with pytest.raises(ForeignResultsError) as err:
        load(f)
    msg = str(err.value)
    assert f"'{f}'" in msg and "is not a fedtune rounds file" in msg and "missing columns" in msg
    assert "'trial_id'" in msg and "'round'" in msg
    assert err.value.path == f
    with pytest.raises(ForeignResultsError, match="is not a fedtune trials file"):
        load(f, "trials")
    # a folder holding only that file: refused too, not an all-null table
    with pytest.raises(ForeignResultsError, match="data.parquet"):
        load(tmp_path)


def test_a_column_of_the_wrong_type_is_refused(tmp_path):
    f = tmp_path / "x.parquet"
    table = rows_to_table(_rows("t"))
    i = table.column_names.index("round")
    pq.write_table(table.set_column(i, "round", pa.array(["one", "two"])), f)
    with pytest.raises(ForeignResultsError, match=r"column 'round' is string; allowed: int64"):
        load(f)


def test_a_foreign_file_dropped_into_rounds_is_refused_not_added(tmp_path):
    store = _study(tmp_path)
    assert load(store.study_dir).num_rows == 2
    f = _foreign(store.rounds_dir / "data.parquet")
    with pytest.raises(ForeignResultsError) as err:
        load(store.study_dir)
    assert str(f) in str(err.value) and "rounds file" in str(err.value)
    with pytest.raises(ForeignResultsError):
        load(tmp_path)  # the output folder holding the study
    # resume's check for truncated files refuses it too, instead of calling it corrupt (which would
    # quarantine it and re-run a "trial" named data)
    with pytest.raises(ForeignResultsError, match="data.parquet"):
        corrupt_files(store.study_dir)
    assert f.is_file() and not (f.parent / "data.parquet.corrupt").exists()


def test_a_truncated_file_is_still_corrupt_not_foreign(tmp_path):
    store = _study(tmp_path, trials=("a", "b"))
    bad = store.rounds_path("b")
    bad.write_bytes(bad.read_bytes()[:100])
    assert corrupt_files(store.study_dir) == [bad]


def test_a_foreign_trials_file_is_refused_and_never_overwritten(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_rounds("a", _rows("a"))
    _foreign(store.trials_path)
    before = store.trials_path.read_bytes()
    with pytest.raises(ForeignResultsError, match="trials.parquet.*is not a fedtune trials file"):
        load(store.study_dir, "trials")
    with pytest.raises(ForeignResultsError):
        store.write_trial({"trial_id": "a", "status": "completed"})
    assert store.trials_path.read_bytes() == before
    # a rounds file is not a trials file either (it lacks rounds_done)
    rounds_as_trials = tmp_path / "t" / "trials.parquet"
    rounds_as_trials.parent.mkdir()
    rounds_as_trials.write_bytes(store.rounds_path("a").read_bytes())
    with pytest.raises(ForeignResultsError, match="missing columns 'rounds_done'"):
        load(rounds_as_trials)


def test_files_of_the_first_schema_still_load(tmp_path):
    rounds = tmp_path / "old" / "rounds" / "t.parquet"
    rounds.parent.mkdir(parents=True)
    pq.write_table(_old_table(OLD_ROUND_COLUMNS, study="old", trial_id="t", round=1, val_acc=0.5), rounds)
    pq.write_table(_old_table(OLD_TRIAL_COLUMNS, study="old", trial_id="t", status="completed", rounds_done=1),
                   tmp_path / "old" / "trials.parquet")
    t = load(tmp_path / "old")
    assert t.num_rows == 1 and t.column("val_acc").to_pylist() == [0.5] and t.column("attempt").null_count == 1
    assert load(tmp_path / "old", "trials").column("status").to_pylist() == ["completed"]
    assert corrupt_files(tmp_path / "old") == []


def test_report_refuses_a_foreign_file_in_one_line(tmp_path, capsys):
    store = _study(tmp_path)
    f = _foreign(store.rounds_dir / "data.parquet")
    assert main(["report", str(store.study_dir), "--no-plots"]) == 2
    line = _error_line(capsys)
    assert line.startswith("fedtune: error: ") and str(f) in line and "not a fedtune rounds file" in line
    assert not store.files.report_md.exists()


# --------------------------------------------------------------------------- fedtune report on a non-study


@pytest.mark.parametrize("kind", ["missing", "empty", "unrelated"])
def test_report_refuses_a_folder_that_is_not_a_study_and_writes_nothing(tmp_path, capsys, kind):
    folder = tmp_path / "photos"
    if kind != "missing":
        folder.mkdir()
    if kind == "unrelated":
        (folder / "notes.txt").write_text("hello")
        (folder / "sub").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["report", str(folder)]) == 2
    line = _error_line(capsys)
    assert f"'{folder}'" in line
    if kind == "missing":
        assert "does not exist" in line
    else:
        assert "is not a fedtune study folder" in line and "study.json" in line and "rounds/" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no report.md, no plots/
    with pytest.raises(ConfigError):
        check_study_dir(folder)


def test_report_on_an_output_folder_names_the_studies_in_it(tmp_path, capsys):
    _study(tmp_path, "first")
    _study(tmp_path, "second")
    assert main(["report", str(tmp_path), "--no-plots"]) == 2
    line = _error_line(capsys)
    assert "is not a fedtune study folder" in line and "first, second" in line
    assert not (tmp_path / "report.md").exists()


def test_report_on_a_run_study_without_study_json_still_works(tmp_path, capsys):
    assert main(["run", "--backend", "local", "--dataset", "rect4", "--rounds", "1", "--output", str(tmp_path),
                 "--no-progress", "--set", "local_steps=1"]) == 0
    study = tmp_path / "default"
    assert not (study / "study.json").exists() and (study / "trials.parquet").is_file()
    capsys.readouterr()
    assert main(["report", str(study), "--no-plots"]) == 0
    assert (study / "report.md").is_file()
    # a study with round files only (trials.parquet not written yet) is a study too
    (study / "trials.parquet").unlink()
    (study / "report.md").unlink()
    assert main(["report", str(study), "--no-plots"]) == 0 and (study / "report.md").is_file()


# --------------------------------------------------------------------------- the atomic writer's temp files


def _age(path: Path, seconds: float) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_stray_temp_files_of_the_atomic_writer_are_removed_and_nothing_else(tmp_path):
    store = _study(tmp_path)
    root = store.study_dir
    (root / "plots").mkdir()
    strays = [
        root / ".trials.parquet.k2j3h4g5.tmp",  # the writer's names before the marker
        root / ".study.json.ab_cd123.tmp",
        store.rounds_dir / ".a.parquet.x9y8z7w6.tmp",
        root / "plots" / ".convergence.png.abcdefgh.tmp",
    ]
    for p in strays:
        p.write_bytes(b"PAR1 half")
    # the writer's own name now (with its marker), left by a write killed midway (SIGKILL: no cleanup)
    marked = root / f".report.md{TEMP_MARKER}q1w2e3r4.tmp"
    marked.write_text("new")
    strays.append(marked)
    keep = [root / "notes.tmp", root / ".notes.tmp", root / ".my.parquet.tmp", root / "data.abcdefgh.tmp",
            store.rounds_dir / ".b.parquet.short.tmp", root / ".trials.parquet.k2j3h4g5.tmp.bak"]
    for p in keep:
        p.write_text("mine")
    for p in strays + keep:
        _age(p, 3600)
    fresh = store.rounds_dir / f".c.parquet{TEMP_MARKER}aaaaaaaa.tmp"
    fresh.write_text("a write in progress")
    # readers never see them
    assert load(root).num_rows == 2 and store.trial_ids() == ["a"]

    removed = clean_stray_temp_files(root)
    assert sorted(removed) == sorted(strays)
    assert not any(p.exists() for p in strays)
    assert all(p.exists() for p in keep) and fresh.exists()  # a user's files, and a write still in progress
    assert clean_stray_temp_files(root, min_age_s=0) == [fresh] and not fresh.exists()
    assert clean_stray_temp_files(root) == []
    assert clean_stray_temp_files(tmp_path / "nowhere") == []
    assert load(root).num_rows == 2


def test_the_atomic_writer_names_its_temp_files_with_the_marker(tmp_path, monkeypatch):
    seen = []
    real = atomic._open_temp

    def spy(path):
        fd, tmp = real(path)
        seen.append(Path(tmp).name)
        return fd, tmp

    monkeypatch.setattr(atomic, "_open_temp", spy)
    ResultsStore(tmp_path, "s").write_rounds("t", _rows("t"))
    (name,) = seen
    assert name.startswith(".t.parquet" + TEMP_MARKER) and name.endswith(".tmp")
    assert is_temp_name(name) == "t.parquet"


def test_report_refuses_a_folder_whose_only_study_file_is_someone_elses_study_json(tmp_path, capsys):
    folder = tmp_path / "survey"
    folder.mkdir()
    (folder / "study.json").write_text('{"participants": 12}')
    assert main(["report", str(folder)]) == 2
    line = _error_line(capsys)
    assert str(folder / "study.json") in line and "not a fedtune sweep study file" in line
    assert sorted(p.name for p in folder.iterdir()) == ["study.json"]


def test_a_results_file_this_user_may_not_read_is_one_line(tmp_path, capsys, monkeypatch):
    store = _study(tmp_path)
    real = pa.OSFile

    def denied(path, *a, **k):
        if str(path).endswith("a.parquet"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, *a, **k)

    monkeypatch.setattr(pa, "OSFile", denied)  # chmod 000 does not stop root: the error a normal user gets
    assert main(["report", str(store.study_dir), "--no-plots"]) == 2
    line = _error_line(capsys)
    assert str(store.rounds_path("a")) in line and "cannot be read: permission denied" in line
    with pytest.raises(DataError, match="permission denied"):  # not "corrupt": resume must not quarantine it
        corrupt_files(store.study_dir)
