"""The helpers that replaced repeated code in fedtune/ (issue 46 item 6, `duplicates`): each does what
every copy it replaced did."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.algorithms.base import HParam, read_hparams, variant
from fedtune.config import FederatedRunConfig


def test_a_subclass_reads_its_own_hyperparameters_and_its_bases():
    from fedtune.algorithms.client.method import ClientMethod
    from fedtune.algorithms.client.prox import Prox
    from fedtune.algorithms.declarations import CLIENT_WEIGHTING, OMG_KAPPA, OMG_SOLVER, PROX_MU
    from fedtune.algorithms.server.fedomg import FedOMG
    from fedtune.algorithms.server.rule import ServerRule

    cfg = FederatedRunConfig.from_dict({"algorithm": "fedprox", "prox_mu": 0.25, "server_rule": "fedomg",
                                        "omg_kappa": 0.3, "omg_solver": "sgd"})
    assert Prox(cfg).mu == 0.25 and Prox(cfg).cfg is cfg
    rule = FedOMG(cfg, None)
    assert (rule.kappa, rule.solver, rule.rescale) == (0.3, "sgd", False)

    class Base(ServerRule):
        reads = {"kappa": OMG_KAPPA}

    class Child(Base):
        reads = {"solver": OMG_SOLVER, "kappa": CLIENT_WEIGHTING}  # a subclass's entry wins over its base's

    child = Child(cfg, None)
    assert (child.kappa, child.solver) == ("examples", "sgd")
    assert Base(cfg, None).kappa == 0.3 and not hasattr(Base(cfg, None), "solver")

    class Plain(ClientMethod):
        name = "plain"

    assert not hasattr(Plain(cfg), "mu")  # nothing read that the class does not name
    holder = type("Holder", (), {"reads": {"mu": PROX_MU}})()
    read_hparams(holder, FederatedRunConfig.from_dict({"algorithm": "fedprox"}))
    assert holder.mu == PROX_MU.default == 0.01


def test_a_variant_is_a_choice_whose_first_value_is_the_default():
    v = variant("x_mode", "help text", ("paper", "code"))
    assert v == HParam("x_mode", "paper", "help text", kind="choice", choices=("paper", "code"), variant=True)
    from fedtune.algorithms import all_hparams

    variants = [h for _, h in all_hparams().values() if h.variant and h.kind == "choice"]
    assert len(variants) >= 20 and all(h.default == h.choices[0] for h in variants)


def test_normalised_weights_and_one_line_for_bad_values():
    from fedtune.algorithms.server.aggregate import fedavg_weights, normalised
    from fedtune.algorithms.server.fedga import aggregation_weights

    n = np.array([3, 1, 4], dtype=np.int64)
    expected = np.array([3 / 8, 1 / 8, 4 / 8], dtype=np.float64)
    for got in (normalised(n), fedavg_weights(n), aggregation_weights(n.astype(np.float64))):
        assert got.dtype == np.float64 and np.array_equal(got, expected)
    for bad in (np.array([]), np.array([1.0, -1.0]), np.array([0.0, 0.0]), np.ones((2, 2))):
        with pytest.raises(ValueError, match="^scores must be non-negative with a positive sum, got "):
            aggregation_weights(bad)
        with pytest.raises(ValueError, match="^num_examples must be non-negative"):
            fedavg_weights(bad)


def test_a_datasets_per_domain_arrays_are_copies_and_a_bad_domain_one_line():
    from fedtune.data.colored_digits import ColoredDigits
    from fedtune.data.rect4 import Rect4
    from fedtune.errors import DataError

    ds = ColoredDigits()
    d = ds.info.domains[0]
    for method, table in ((ds.members, ds._members), (ds.labels, ds._labels), (ds.colors, ds._colors)):
        got = method(d)
        assert np.array_equal(got, table[d]) and got is not table[d]
        got[:] = 7
        assert not np.array_equal(method(d), got)  # the dataset's own array is untouched
        with pytest.raises(DataError, match="nope"):
            method("nope")
    assert ds.colors.__doc__.startswith("The colour (0/1")
    r = Rect4()
    assert np.array_equal(r.labels(r.info.domains[1]), r._y[r.info.domains[1]])
    assert r.noisy_mask(r.info.domains[0]).dtype == bool


def test_a_study_folders_and_a_cache_entrys_paths(tmp_path):
    from fedtune.data.cache import CacheEntry
    from fedtune.results import study_dir as sd

    s = sd.StudyDir(tmp_path)
    assert (s.study_json, s.optuna_db, s.tune_dir, s.spaces_dir, s.trials, s.trials_lock, s.driver_lock, s.driver,
            s.rounds_dir, s.report_md, s.plots_dir) == tuple(
        tmp_path / n for n in (sd.STUDY_FILE, sd.OPTUNA_FILE, sd.TUNE_DIR, sd.SPACES_DIR, sd.TRIALS_FILE, sd.LOCK_FILE,
                               sd.DRIVER_LOCK_FILE, sd.DRIVER_FILE, sd.ROUNDS_DIR, sd.REPORT_FILE, sd.PLOTS_DIR))
    assert s.rounds_file("t1") == tmp_path / sd.ROUNDS_DIR / "t1.parquet"
    e = CacheEntry(directory=Path("/c"), key="ab" * 32, stem="pacs-photo-32px-abab", num_images=3, image_size=32)
    assert [p.name for p in (e.array_path, e.record_path, e.crc_path, e.lock_path, e.owner_path)] == [
        f"pacs-photo-32px-abab.{x}" for x in ("npy", "json", "crc", "lock", "owner")]
    assert all(p.parent == Path("/c") for p in (e.array_path, e.owner_path))


def test_rows_with_a_column_name_that_is_not_a_string_are_refused_by_both_writers():
    from fedtune.results.arrow import rows_to_table
    from fedtune.results.rounds_table import RoundsTable
    from fedtune.results.schema import ROUND_CORE_SCHEMA

    with pytest.raises(TypeError, match="column names must be strings, got 3"):
        rows_to_table([{"round": 1}, {3: 1.0}])
    with pytest.raises(TypeError, match="column names must be strings, got 3"):
        RoundsTable(ROUND_CORE_SCHEMA).extend([{"round": 1}, {3: 1.0}])
    assert rows_to_table([{"round": 1, "b": 2.0}, {"a": "x"}]).column_names[len(ROUND_CORE_SCHEMA):] == ["a", "b"]
