"""Writes that the disk or the folder refuses: a full device (ENOSPC) while a round or a trial row is
written, and an output folder that cannot be written. Each is one line naming the file, with the
finished rounds intact and the trial row written when it can be; an unwritable ``--output`` is
refused before anything runs.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/results/test_write_failures.py."""

from __future__ import annotations

import pytest

from fedtune.results import atomic
from fedtune.results.atomic import StorageFullError
from fedtune.results.store import load

from tests.results.test_write_failures import REAL_WRITE, _full_from


@pytest.mark.ray
def test_a_full_disk_during_a_tune_run_stops_it_and_is_reported(ray_session, tmp_path, monkeypatch):
    from ray import tune

    from fedtune.tune.trial.callback import ArrowCallback, write_failure

    def trainable(config):
        import time

        from ray import tune as t

        for r in range(1, 4):
            t.report({"fedtune_row": {"trial_id": "x1", "round": r, "status": "ok", "val_acc": 0.5}, "score": 0.5})
            time.sleep(0.2)

    calls = _full_from(monkeypatch, 2)  # the driver's writes: round 1 fits, round 2 does not
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(num_samples=1),
                       run_config=tune.RunConfig(name="x", storage_path=str(tmp_path / "tune"), verbose=0,
                                                 callbacks=[ArrowCallback(str(tmp_path), "st")]))
    with pytest.raises(Exception) as err:  # Tune stops the run: TuneError wrapping the callback's error
        tuner.fit()
    failure = write_failure(tmp_path / "st")
    assert isinstance(failure, StorageFullError), err.value
    assert str(failure).startswith(f"no space left on device writing '{tmp_path / 'st' / 'rounds' / 'x1.parquet'}'")
    assert len(calls) == 2  # Tune did not go on writing after the refusal
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(tmp_path / "st").column("round").to_pylist() == [1]
