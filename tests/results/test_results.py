"""Tests of the Parquet results store (fedtune/results.py)."""

from __future__ import annotations

import datetime as dt
import doctest
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


from fedtune.errors import ConfigError
from fedtune.results import atomic
from fedtune.results.schema import ROUND_CORE_SCHEMA, TRIAL_CORE_SCHEMA, schema_markdown
from fedtune.results.store import ResultsStore, load
from fedtune.results.summary import summarize_trial

NCORE = len(ROUND_CORE_SCHEMA)


def _round(trial: str, r: int, **extra) -> dict:
    row = {
        "study": "s",
        "trial_id": trial,
        "algorithm": "fedavg",
        "client_method": "erm",
        "server_rule": "mean",
        "dataset": "digits",
        "setting": "fdg",
        "target_domain": "d3",
        "seed": 7,
        "round": r,
        "train_loss": 1.0 / (r + 1),
        "val_acc": 0.5 + r / 100,
        "target_acc": 0.4 + r / 100,
        "wall_s": 1.5,
        "client_s": 1.0,
        "server_s": 0.25,
        "status": "ok",
        "num_participants": 4,
        "skipped_clients": 0,
        "bytes_moved": 1 << 40,
    }
    row.update(extra)
    return row


# --------------------------------------------------------------------------- round files


def test_schemas_have_required_columns_in_order():
    assert ROUND_CORE_SCHEMA.names[:10] == [
        "study", "trial_id", "algorithm", "client_method", "server_rule",
        "dataset", "setting", "target_domain", "seed", "round",
    ]
    assert ROUND_CORE_SCHEMA.field("bytes_moved").type == pa.int64()
    assert ROUND_CORE_SCHEMA.field("target_domain").nullable
    assert TRIAL_CORE_SCHEMA.names[-4:] == ["started_at", "ended_at", "error", "config_json"]
    assert TRIAL_CORE_SCHEMA.field("best_round").type == pa.int64()
    assert pa.types.is_timestamp(TRIAL_CORE_SCHEMA.field("started_at").type)


def test_round_trip_core_and_extra_columns(tmp_path):
    store = ResultsStore(tmp_path, "s")
    rows = [
        _round("t1", 0, **{"val_acc.d1": 0.5, "hp.lr": 1, "hp.opt": "sgd", "hp.nesterov": True,
                           "hp.layers": [64, 32], "hp.sched": {"kind": "cos"},
                           "diag.grad_norm": 2.0, "diag.client_loss": [0.1, 0.2]}),
        _round("t1", 1, **{"val_acc.d1": 0.6, "hp.lr": 0.01, "hp.opt": "sgd",
                           "hp.nesterov": False, "hp.layers": [64, 32], "hp.sched": None,
                           "diag.grad_norm": 3, "diag.client_loss": [0.3],
                           "target_acc.d3": 0.7, "test_acc": 0.55}),
        # a row with fewer keys and a mix of str and numbers in hp.mixed
        {"round": 2, "val_acc": 0.1, "target_domain": None, "hp.mixed": 3},
        {"round": 3, "hp.mixed": "auto", "hp.none": None},
    ]
    path = store.write_rounds("t1", rows)
    assert path == tmp_path / "s" / "rounds" / "t1.parquet"
    t = pq.read_table(path)
    schema = t.schema
    # core first, in order, with the declared types
    assert schema.names[:NCORE] == ROUND_CORE_SCHEMA.names
    for f in ROUND_CORE_SCHEMA:
        assert schema.field(f.name).type == f.type, f.name
    # extras sorted, with inferred types
    extras = schema.names[NCORE:]
    assert extras == sorted(extras)
    assert schema.field("val_acc.d1").type == pa.float64()
    assert schema.field("hp.lr").type == pa.float64()  # int + float -> float
    assert schema.field("hp.opt").type == pa.string()
    assert schema.field("hp.nesterov").type == pa.bool_()
    assert schema.field("hp.layers").type == pa.string()  # hp lists -> JSON
    assert schema.field("hp.sched").type == pa.string()
    assert schema.field("hp.mixed").type == pa.string()  # str + number -> string
    assert schema.field("diag.grad_norm").type == pa.float64()
    assert schema.field("diag.client_loss").type == pa.list_(pa.float64())
    d = t.to_pylist()
    assert [r["round"] for r in d] == [0, 1, 2, 3]
    assert d[0]["study"] == "s" and d[2]["study"] == "s"  # filled in
    assert d[3]["trial_id"] == "t1"
    assert d[0]["bytes_moved"] == 1 << 40
    assert d[1]["hp.lr"] == 0.01 and d[0]["hp.lr"] == 1.0
    assert json.loads(d[0]["hp.layers"]) == [64, 32]
    assert json.loads(d[0]["hp.sched"]) == {"kind": "cos"}
    assert d[1]["hp.sched"] is None
    assert d[2]["hp.mixed"] == "3" and d[3]["hp.mixed"] == "auto"
    assert d[0]["diag.client_loss"] == [0.1, 0.2]
    assert d[0]["target_acc.d3"] is None and d[1]["target_acc.d3"] == 0.7
    assert d[2]["train_loss"] is None and d[2]["target_domain"] is None
    assert d[3]["hp.none"] is None


def test_nan_and_inf_round_trip(tmp_path):
    store = ResultsStore(tmp_path, "s")
    rows = [
        _round("t", 0, **{"diag.g": float("inf")}),
        _round("t", 1, train_loss=float("nan"), val_acc=float("nan"),
               **{"diag.g": float("-inf"), "diag.v": [float("nan"), 1.0]}),
    ]
    t = load(store.write_rounds("t", rows))
    d = t.to_pylist()
    assert math.isnan(d[1]["train_loss"]) and math.isnan(d[1]["val_acc"])
    assert d[0]["diag.g"] == math.inf and d[1]["diag.g"] == -math.inf
    assert math.isnan(d[1]["diag.v"][0])
    # NaN is a value, not a null
    assert t.column("train_loss").null_count == 0


def test_rewriting_rows_replaces_them(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_rounds("t", [_round("t", 0)])
    store.write_rounds("t", [_round("t", 0), _round("t", 1)])
    store.write_rounds("t", [_round("t", 0), _round("t", 1), _round("t", 2)])
    assert load(store.study_dir).column("round").to_pylist() == [0, 1, 2]
    # re-running the trial from scratch replaces, never duplicates
    store.write_rounds("t", [_round("t", 0, val_acc=0.99)])
    t = load(store.study_dir)
    assert t.num_rows == 1 and t.column("val_acc").to_pylist() == [0.99]
    assert store.trial_ids() == ["t"]
    assert sorted(p.name for p in store.rounds_dir.iterdir()) == ["t.parquet"]  # no temp files


def test_row_ids_must_match(tmp_path):
    store = ResultsStore(tmp_path, "s")
    with pytest.raises(ValueError, match="trial_id"):
        store.write_rounds("t", [_round("other", 0)])
    with pytest.raises(ValueError, match="study"):
        store.write_rounds("t", [_round("t", 0, study="x")])
    with pytest.raises(ValueError, match="trial_id"):
        store.write_rounds("../evil", [])
    with pytest.raises(ValueError, match="round"):
        store.write_rounds("t", [_round("t", 0.5)])


def test_crash_mid_write_keeps_previous_file(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path, "s")
    path = store.write_rounds("t", [_round("t", 0), _round("t", 1)])
    store.write_trial({"trial_id": "t", "status": "running"})
    real = atomic._write_all  # where a Parquet file's bytes go to the disk

    def crashing(fd, data):
        os.write(fd, b"PAR1 half a file")  # a partial, corrupt file
        raise OSError("disk died")

    monkeypatch.setattr(atomic, "_write_all", crashing)
    with pytest.raises(OSError, match="disk died"):
        store.write_rounds("t", [_round("t", r) for r in range(3)])
    with pytest.raises(OSError, match="disk died"):
        store.write_trial({"trial_id": "t", "status": "ok"})
    monkeypatch.setattr(atomic, "_write_all", real)

    assert load(path).column("round").to_pylist() == [0, 1]
    assert load(store.study_dir, "trials").column("status").to_pylist() == ["running"]
    assert sorted(p.name for p in store.rounds_dir.iterdir()) == ["t.parquet"]
    # a process killed before cleanup leaves a hidden temp file: it is ignored
    (store.rounds_dir / ".t.parquet.abc.tmp").write_bytes(b"PAR1 junk")
    (store.rounds_dir / ".u.parquet").write_bytes(b"PAR1 junk")
    assert load(store.study_dir).num_rows == 2
    assert store.trial_ids() == ["t"]


# --------------------------------------------------------------------------- trials.parquet


def test_trials_upsert(tmp_path):
    store = ResultsStore(tmp_path, "s")
    t0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    store.write_trial({"trial_id": "a", "status": "running", "started_at": t0, "hp.lr": 1})
    store.write_trial({"trial_id": "b", "status": "running", "hp.mu": "x"})
    path = store.write_trial(
        {"trial_id": "a", "status": "ok", "best_val_acc": 0.9, "started_at": t0,
         "ended_at": "2024-05-01T12:00:30+00:00", "hp.lr": 0.5}
    )
    assert path == tmp_path / "s" / "trials.parquet"
    assert (tmp_path / "s" / ".trials.lock").exists()
    t = load(path, "trials")
    assert t.num_rows == 2
    assert t.schema.names[: len(TRIAL_CORE_SCHEMA)] == TRIAL_CORE_SCHEMA.names
    assert t.schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    by_id = {r["trial_id"]: r for r in t.to_pylist()}
    assert by_id["a"]["status"] == "ok" and by_id["a"]["best_val_acc"] == 0.9
    assert by_id["a"]["hp.lr"] == 0.5 and by_id["a"]["hp.mu"] is None
    assert by_id["a"]["ended_at"] - by_id["a"]["started_at"] == dt.timedelta(seconds=30)
    assert by_id["b"]["status"] == "running" and by_id["b"]["hp.mu"] == "x"
    assert by_id["b"]["study"] == "s"
    assert store.trial_ids() == ["a", "b"]


def test_trials_upsert_with_clashing_types(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial({"trial_id": "a", "hp.k": 3})
    store.write_trial({"trial_id": "b", "hp.k": "auto"})
    store.write_trial({"trial_id": "c", "hp.k": 2.5})
    t = load(store.study_dir, "trials")
    assert t.column("hp.k").type == pa.string()
    assert sorted(t.column("hp.k").to_pylist()) == ["2.5", "3", "auto"]
    with pytest.raises(ValueError, match="trial_id"):
        store.write_trial({"status": "ok"})


def _upsert_worker(out: str, worker: int, n_trials: int, n_updates: int) -> None:
    store = ResultsStore(out, "conc")
    for u in range(n_updates):
        for i in range(n_trials):
            store.write_trial(
                {"trial_id": f"w{worker}-t{i}", "status": "ok" if u == n_updates - 1 else "running",
                 "rounds_done": u, f"hp.w{worker}": float(u)}
            )


def test_concurrent_writers(tmp_path):
    ctx = mp.get_context("spawn")
    n_workers, n_trials, n_updates = 4, 5, 6
    procs = [
        ctx.Process(target=_upsert_worker, args=(str(tmp_path), w, n_trials, n_updates))
        for w in range(n_workers)
    ]
    for p in procs:
        p.start()
    # lock-free readers meanwhile always see a complete file (old or new, never a mix)
    reads = 0
    while any(p.is_alive() for p in procs):
        if (tmp_path / "conc" / "trials.parquet").exists():
            seen = load(tmp_path / "conc", "trials").column("trial_id").to_pylist()
            assert len(seen) == len(set(seen))
            reads += 1
        time.sleep(0.002)  # a spinning reader took a core from the 4 writers (2-core machines)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert reads > 0
    t = load(tmp_path / "conc", "trials")
    ids = t.column("trial_id").to_pylist()
    expected = sorted(f"w{w}-t{i}" for w in range(n_workers) for i in range(n_trials))
    assert sorted(ids) == expected  # every trial exactly once
    assert set(t.column("status").to_pylist()) == {"ok"}
    assert set(t.column("rounds_done").to_pylist()) == {n_updates - 1}
    assert sorted(p.name for p in (tmp_path / "conc").iterdir()) == [".trials.lock", "trials.parquet"]


# --------------------------------------------------------------------------- load


def test_load_study_output_dir_and_file(tmp_path):
    a = ResultsStore(tmp_path, "study_a")
    b = ResultsStore(tmp_path, "study_b")
    a.write_rounds("t1", [_round("t1", r, study="study_a", **{"hp.lr": 1, "val_acc.d1": 0.5})
                          for r in range(3)])
    a.write_rounds("t2", [_round("t2", r, study="study_a", **{"hp.lr": 0.1}) for r in range(2)])
    b.write_rounds("u1", [_round("u1", r, study="study_b",
                                 **{"hp.mu": "prox", "val_acc.d9": 0.7, "target_domain": None})
                          for r in range(4)])
    a.write_trial({"trial_id": "t1", "status": "ok", "hp.lr": 1})
    b.write_trial({"trial_id": "u1", "status": "error", "error": "boom"})

    # a study dir
    ta = load(a.study_dir)
    assert ta.num_rows == 5
    assert ta.schema.field("hp.lr").type == pa.float64()  # int file + float file -> float
    assert "hp.mu" not in ta.column_names

    # an output dir with two studies whose schemas differ
    t = load(tmp_path)
    assert t.num_rows == 9
    assert t.schema.names[:NCORE] == ROUND_CORE_SCHEMA.names
    assert t.schema.names[NCORE:] == sorted(t.schema.names[NCORE:])
    rows = t.to_pylist()
    by_study = {s: [r for r in rows if r["study"] == s] for s in ("study_a", "study_b")}
    assert len(by_study["study_a"]) == 5 and len(by_study["study_b"]) == 4
    assert all(r["hp.mu"] is None and r["val_acc.d9"] is None for r in by_study["study_a"])
    assert all(r["hp.lr"] is None and r["val_acc.d1"] is None for r in by_study["study_b"])
    assert all(r["hp.mu"] == "prox" for r in by_study["study_b"])

    # a single file
    one = load(b.rounds_dir / "u1.parquet")
    assert one.num_rows == 4 and one.column("hp.mu").to_pylist() == ["prox"] * 4
    # the rounds/ dir itself
    assert load(a.rounds_dir).num_rows == 5

    # trials
    tt = load(tmp_path, "trials")
    assert sorted(tt.column("trial_id").to_pylist()) == ["t1", "u1"]
    assert tt.schema.names[: len(TRIAL_CORE_SCHEMA)] == TRIAL_CORE_SCHEMA.names
    assert load(a.study_dir, table="trials").num_rows == 1
    assert load(b.study_dir / "trials.parquet").column("error").to_pylist() == ["boom"]


@pytest.mark.parametrize("inside", [[], ["notes.txt"], ["sub/"], ["sub/data.csv"]])
def test_load_of_a_folder_that_holds_no_results_is_one_line_saying_so(tmp_path, inside):
    for name in inside:
        if name.endswith("/"):
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text("x")
    for table in ("rounds", "trials"):
        with pytest.raises(ConfigError) as err:
            load(tmp_path, table)
        text = str(err.value)
        assert "\n" not in text and text.startswith(f"no fedtune results in '{tmp_path}'"), text
        assert "allowed: a study folder (OUTPUT/STUDY with rounds/, trials.parquet or study.json" in text


def test_a_study_with_no_rows_yet_gives_the_core_schema(tmp_path):
    store = ResultsStore(tmp_path, "fresh")
    store.study_dir.mkdir(parents=True)
    (store.study_dir / "study.json").write_text("{}")  # a sweep that has started, no round written yet
    for path in (store.study_dir, tmp_path):  # the study, and the output folder holding it
        t = load(path)
        assert t.num_rows == 0 and t.schema == ROUND_CORE_SCHEMA
        assert load(path, "trials").schema == TRIAL_CORE_SCHEMA
    (store.study_dir / "study.json").unlink()
    store.rounds_dir.mkdir()  # an empty rounds/ folder: a run that has written nothing yet
    assert load(store.rounds_dir).num_rows == 0 and load(store.study_dir).num_rows == 0


# --------------------------------------------------------------------------- summaries


def test_summarize_trial_selects_by_val_acc():
    rows = [
        _round("t", 0, val_acc=0.50, target_acc=0.40, wall_s=1.0, **{"hp.lr": 0.1}),
        _round("t", 2, val_acc=0.80, target_acc=0.30, wall_s=1.0, **{"hp.lr": 0.1}),
        _round("t", 1, val_acc=0.60, target_acc=0.95, wall_s=1.0, **{"hp.lr": 0.1}),
        _round("t", 3, val_acc=0.80, target_acc=0.10, wall_s=1.0, **{"hp.lr": 0.1}),  # tie
        _round("t", 4, val_acc=0.70, target_acc=0.20, wall_s=1.0, **{"hp.lr": 0.1}),
    ]
    cfg = {"trial_id": "t", "algorithm": "fedavg", "hp": {"lr": 0.1}}
    s = summarize_trial(rows, config=cfg, status="ok", error=None,
                        started_at=None, ended_at=None)
    assert s["best_round"] == 2  # earliest of the tied best rounds
    assert s["best_val_acc"] == 0.80
    assert s["target_acc_at_best_val"] == 0.30  # honest: at the selected round
    assert "best_target_acc" not in s  # the old oracle (best target round on the reported set) is gone
    assert s["final_val_acc"] == 0.70 and s["final_target_acc"] == 0.20  # round 4 is last
    assert s["rounds_done"] == 5
    assert s["total_wall_s"] == 5.0
    assert s["trial_id"] == "t" and s["algorithm"] == "fedavg" and s["seed"] == 7
    assert s["hp.lr"] == 0.1
    assert json.loads(s["config_json"]) == cfg
    assert set(TRIAL_CORE_SCHEMA.names) <= set(s)


def test_summarize_trial_records_every_selection_protocol():
    # val picks round 1, target-val round 2, oracle the last round (3): three different rounds
    rows = [
        _round("t", 1, val_acc=0.9, target_val_acc=0.1, oracle_acc=0.2, target_acc=0.31),
        _round("t", 2, val_acc=0.5, target_val_acc=0.8, oracle_acc=0.9, target_acc=0.32),
        _round("t", 3, val_acc=0.4, target_val_acc=0.3, oracle_acc=0.6, target_acc=0.33),
    ]
    s = summarize_trial(rows, config={}, status="completed", error=None, started_at=None, ended_at=None)
    assert (s["best_round"], s["best_val_acc"], s["target_acc_at_best_val"]) == (1, 0.9, 0.31)
    assert (s["target_val_round"], s["best_target_val_acc"], s["target_acc_at_best_target_val"]) == (2, 0.8, 0.32)
    assert s["final_oracle_acc"] == 0.6 and s["final_target_acc"] == 0.33  # last round, not the best (0.9)
    diverged = rows[:2] + [_round("t", 3, status="diverged", val_acc=float("nan"), oracle_acc=float("nan"))]
    s = summarize_trial(diverged, config={}, status="diverged", error=None, started_at=None, ended_at=None)
    assert s["final_oracle_acc"] is None and s["best_round"] == 1  # no last model to report


def test_summarize_trial_nan_and_empty(tmp_path):
    rows = [
        _round("t", 0, val_acc=0.3, target_acc=0.2),
        _round("t", 1, val_acc=0.6, target_acc=0.5),
        _round("t", 2, train_loss=float("nan"), val_acc=float("nan"), target_acc=float("nan")),
    ]
    start = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    s = summarize_trial(rows, config={}, status="diverged", error=None,
                        started_at=start, ended_at=start + dt.timedelta(seconds=90))
    assert s["best_round"] == 1 and s["best_val_acc"] == 0.6  # NaN never wins
    assert s["target_acc_at_best_val"] == 0.5
    assert math.isnan(s["final_val_acc"]) and math.isnan(s["final_target_acc"])
    assert s["total_wall_s"] == 90.0

    all_nan = [_round("t", 0, val_acc=float("nan"), target_acc=float("nan"))]
    s2 = summarize_trial(all_nan, config={}, status="diverged", error=None,
                         started_at=None, ended_at=None)
    assert s2["best_round"] is None and s2["best_val_acc"] is None
    assert s2["target_acc_at_best_val"] is None and s2["final_oracle_acc"] is None

    cfg = {"study": "s", "trial_id": "e", "dataset": "digits", "seed": 3, "hp.lr": 0.5}
    s3 = summarize_trial([], config=cfg, status="error", error="Traceback: boom",
                         started_at=1_700_000_000.0, ended_at="2023-11-14T22:13:25+00:00")
    assert s3["rounds_done"] == 0 and s3["best_round"] is None and s3["final_val_acc"] is None
    assert s3["trial_id"] == "e" and s3["dataset"] == "digits" and s3["seed"] == 3
    assert s3["total_wall_s"] == pytest.approx(5.0)
    assert s3["hp.lr"] == 0.5

    # the summaries are valid trials.parquet rows, NaN surviving the round trip
    store = ResultsStore(tmp_path, "s")
    store.write_trial({**s, "trial_id": "t"})
    store.write_trial({**s2, "trial_id": "t2"})
    store.write_trial(s3)
    t = {r["trial_id"]: r for r in load(store.study_dir, "trials").to_pylist()}
    assert math.isnan(t["t"]["final_val_acc"]) and t["t"]["best_round"] == 1
    assert t["e"]["error"] == "Traceback: boom" and t["e"]["rounds_done"] == 0
    assert t["e"]["started_at"] == dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)


# --------------------------------------------------------------------------- errors & docs


@pytest.mark.parametrize("bad", ["", "a/b", "a\\b", "..", ".", ".hidden", None, 3])
def test_bad_study_name(tmp_path, bad):
    with pytest.raises(ValueError, match="name"):
        ResultsStore(tmp_path, bad)


def test_missing_path_and_bad_table(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load(missing)
    with pytest.raises(ValueError, match="rounds.*trials"):
        load(tmp_path, table="runs")


def test_schema_markdown():
    md = schema_markdown()
    for name in ROUND_CORE_SCHEMA.names + TRIAL_CORE_SCHEMA.names:
        assert f"| `{name}` |" in md
    assert "| `best_round` | int64 |" in md
    assert "| column | type | meaning |" in md


def test_docstring_examples_run():
    import fedtune.results

    res = doctest.testmod(fedtune.results, verbose=False)
    assert res.attempted > 5
    assert res.failed == 0
