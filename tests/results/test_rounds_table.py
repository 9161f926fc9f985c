"""RoundsTable (fedtune.results.rounds_table): a trial's rounds converted one round at a time give
the table of converting them all at once, and ResultsStore.write_rounds writes the same files
through it as from scratch."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from fedtune.results.arrow import read_parquet, rows_to_table
from fedtune.results.schema import ROUND_CORE_SCHEMA
from fedtune.results.rounds_table import RoundsTable
from fedtune.results.store import ResultsStore


def _value(rng: np.random.Generator, kind: str):
    if rng.random() < 0.25:
        return None
    if kind == "mixed":
        kind = str(rng.choice(["int", "float", "bool", "str", "list", "dict", "bigint"]))
    return {
        "int": lambda: int(rng.integers(-5, 5)),
        "bigint": lambda: 2**70,
        "float": lambda: float(rng.choice([rng.normal(), math.nan, math.inf])),
        "bool": lambda: bool(rng.integers(2)),
        "str": lambda: str(rng.choice(["a", "b", "ok"])),
        "list": lambda: [float(x) for x in rng.normal(size=int(rng.integers(0, 3)))],
        "dict": lambda: {"k": int(rng.integers(3))},
    }[kind]()


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to NaN (Arrow's equals says NaN != NaN)."""
    def norm(v):
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if isinstance(v, list):
            return [norm(x) for x in v]
        return v

    return a.schema == b.schema and all(
        [norm(v) for v in a.column(n).to_pylist()] == [norm(v) for v in b.column(n).to_pylist()]
        for n in a.column_names)


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    """Rows whose columns come and go and change kind: ints meeting floats, bools meeting ints,
    nulls meeting values, lists under hp. (JSON) and elsewhere, strings mixed with numbers."""
    columns = {f"c{i}": str(rng.choice(["int", "float", "bool", "str", "list", "mixed"])) for i in range(8)}
    columns["hp.grid"] = "list"
    rows = []
    for r in range(n):
        row = {"round": r, "trial_id": "t", "train_loss": float(rng.normal()), "status": "ok"}
        for name, kind in columns.items():
            if rng.random() < 0.7:
                if rng.random() < 0.1:  # a column changes what it holds
                    kind = str(rng.choice(["int", "float", "bool", "str", "list"]))
                row[name] = _value(rng, kind)
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_one_round_at_a_time_is_the_table_of_all_rows(seed):
    rng = np.random.default_rng(seed)
    rows = _rows(rng, int(rng.integers(1, 30)))
    built = RoundsTable(ROUND_CORE_SCHEMA)
    done = 0
    while done < len(rows):
        step = int(rng.integers(1, 4))  # one row or a few at a time
        built.extend(rows[done:done + step])
        done = min(done + step, len(rows))
        got, want = built.table(), rows_to_table(rows[:done], ROUND_CORE_SCHEMA)
        assert got.schema == want.schema, (got.schema, want.schema)
        assert same(got, want), seed
        assert built.num_rows == done


def test_a_bad_core_value_is_refused_as_in_one_conversion():
    built = RoundsTable(ROUND_CORE_SCHEMA)
    built.extend([{"round": 1}])
    for bad in ({"round": "two"}, {1: 2}):
        with pytest.raises((ValueError, TypeError)) as err:
            rows_to_table([{"round": 1}, bad], ROUND_CORE_SCHEMA)
        with pytest.raises(type(err.value)):
            built.extend([bad])


def test_write_rounds_converts_only_new_rows_and_writes_what_a_fresh_store_writes(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    rows = _rows(rng, 25)
    store = ResultsStore(tmp_path / "a", "s")
    converted = []
    original = RoundsTable.extend
    monkeypatch.setattr(RoundsTable, "extend", lambda self, new: (converted.append(len(new)), original(self, new))[1])
    written: list[dict] = []
    for row in rows:
        written.append(row)
        path = store.write_rounds("t", written)  # the driver's way: one list, one more row each round
        fresh = ResultsStore(tmp_path / "b", "s")
        assert same(read_parquet(path), read_parquet(fresh.write_rounds("t", list(written))))
    # the growing list converted one row a round (the fresh stores' writes converted theirs whole)
    assert converted[0::2] == [1] * 25
    # a row replaced by a new object (a PBT member's round again), or fewer rows: converted afresh
    replaced = written[:10] + [{**written[10], "train_loss": 123.0}] + written[11:]
    table = read_parquet(store.write_rounds("t", replaced))
    assert table.column("train_loss")[10].as_py() == 123.0 and table.num_rows == 25
    table = read_parquet(store.write_rounds("t", replaced[:3]))
    assert table.num_rows == 3 and same(table, rows_to_table([{**r, "study": "s"} for r in replaced[:3]],
                                                              ROUND_CORE_SCHEMA))


def test_write_rounds_that_fails_starts_over_on_the_next(tmp_path, monkeypatch):
    import fedtune.results.store as store_module

    store = ResultsStore(tmp_path, "s")
    rows = [{"round": 1, "x": 1}]
    store.write_rounds("t", rows)
    calls = []

    def refuse(table, path):
        calls.append(table.num_rows)
        raise OSError("disk full")

    real = store_module.write_parquet
    monkeypatch.setattr(store_module, "write_parquet", refuse)
    rows.append({"round": 2, "x": 2.5})
    with pytest.raises(OSError):
        store.write_rounds("t", rows)
    monkeypatch.setattr(store_module, "write_parquet", real)
    rows.append({"round": 3, "x": 3})
    table = read_parquet(store.write_rounds("t", rows))
    assert calls == [2] and table.column("x").to_pylist() == [1.0, 2.5, 3.0]
    assert table.column("x").type == pa.float64()
