"""How fedtune writes a Parquet file (fedtune.results.arrow.write_parquet, atomic_write_bytes): the file
reads back as the table written (every value bit for bit) and as the same table, schema and
metadata included, that a write with pyarrow's default options gives (fedtune's before), without the dictionary pages and column
statistics that only cost time on a rounds file of a few rows (issue 47 item 5); the temporary
file gets a new file's ordinary permissions and is gone afterwards."""

from __future__ import annotations

import datetime as dt
import math
import os
import struct

import pyarrow as pa
import pyarrow.parquet as pq

from fedtune.results.arrow import read_parquet, rows_to_table, write_parquet
from fedtune.results.atomic import atomic_write_bytes, is_temp_name
from fedtune.results.schema import ROUND_CORE_SCHEMA, TRIAL_CORE_SCHEMA


def _rows() -> list[dict]:
    return [{"study": "s", "trial_id": "t", "algorithm": "fedavg", "round": r, "status": "ok",
             "train_loss": [0.5, math.nan, math.inf, -0.0, 1e-310][r], "val_acc": None if r == 2 else r / 3,
             "hp.local_lr": 0.05, "hp.batch_size": 32, "hp.local_steps": None, "hp.grid": [1, 2],
             "diag.flag": r % 2 == 0, "curve": [0.25 * r, None], "note": "é" * r}
            for r in range(5)]


def _bits(table: pa.Table) -> list:
    """Every value, floats as their 64 bits (NaN, -0.0 and subnormals compared exactly)."""
    def b(v):
        if isinstance(v, float):
            return struct.pack("<d", v)
        if isinstance(v, list):
            return [b(x) for x in v]
        return v
    return [[b(v) for v in table.column(n).to_pylist()] for n in table.column_names]


def test_a_written_table_reads_back_the_same_and_as_a_default_write_does(tmp_path):
    started = dt.datetime(2026, 11, 28, 13, 0, tzinfo=dt.timezone.utc)
    for table in (rows_to_table(_rows(), ROUND_CORE_SCHEMA),
                  rows_to_table([{"trial_id": "t", "status": "completed", "started_at": started,
                                  "best_val_acc": 0.5, "config": {"a": 1}}], TRIAL_CORE_SCHEMA)):
        path = write_parquet(table, tmp_path / "x.parquet")
        back = read_parquet(path)
        pq.write_table(table, tmp_path / "default.parquet")  # pyarrow's defaults: what fedtune wrote before
        before = read_parquet(tmp_path / "default.parquet")
        # the same schema as before, Arrow's metadata included (a list reads back with Parquet's child
        # name 'element' either way), every other field as written
        assert back.schema.equals(before.schema, check_metadata=True)
        assert [f for f in back.schema if not pa.types.is_list(f.type)] == [
            f for f in table.schema if not pa.types.is_list(f.type)]
        assert _bits(back) == _bits(table) == _bits(before)


def test_the_file_has_no_dictionary_pages_and_no_statistics(tmp_path):
    meta = pq.ParquetFile(write_parquet(rows_to_table(_rows(), ROUND_CORE_SCHEMA), tmp_path / "r.parquet")).metadata
    chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    assert chunks and not any(c.has_dictionary_page for c in chunks)
    assert not any(c.is_stats_set for c in chunks)
    assert {c.compression for c in chunks} == {"SNAPPY"}


def test_atomic_write_bytes_makes_the_folder_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "new" / "deeper" / "f.bin"
    assert atomic_write_bytes(path, b"one") == path and path.read_bytes() == b"one"
    atomic_write_bytes(path, pa.py_buffer(b"two" * 100_000))  # an Arrow buffer, as write_parquet gives
    assert path.read_bytes() == b"two" * 100_000
    assert [p.name for p in path.parent.iterdir()] == ["f.bin"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # a new file's permissions, not mkstemp's 0600


def test_a_write_that_fails_keeps_the_previous_file_and_removes_its_temporary_file(tmp_path, monkeypatch):
    from fedtune.results import atomic

    path = atomic_write_bytes(tmp_path / "f.bin", b"kept")
    names = []

    def failing(fd, data):
        os.write(fd, b"ha")
        names.append(sorted(p.name for p in tmp_path.iterdir()))
        raise KeyboardInterrupt  # Ctrl-C mid-write

    monkeypatch.setattr(atomic, "_write_all", failing)
    try:
        atomic_write_bytes(path, b"new content")
    except KeyboardInterrupt:
        pass
    (during,) = names
    assert len(during) == 2 and is_temp_name([n for n in during if n != "f.bin"][0]) == "f.bin"
    assert path.read_bytes() == b"kept" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
