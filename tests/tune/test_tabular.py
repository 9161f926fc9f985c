"""The tabular tuning benchmark (issue 31 item 4): a grid of real local runs becomes a table that
answers a trial with exactly the rows the run recorded; strategies spend compute round by round,
random search over the whole grid selects what the grid selects, a pruner spends less, the same
seed gives the same curve."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from fedtune.errors import ConfigError
from fedtune.results.store import load
from fedtune.tune.tabular.strategies import STRATEGIES, Strategy, simulate
from fedtune.tune.tabular.table import TabularBenchmark, build_table
from fedtune.tune.tabular.grid import grid_configs, run_grid
from fedtune.tune.tabular.strategies import at_budget
from fedtune.tune.tabular.table import Cell

BASE = {"dataset": "rotated-digits", "setting": "fdg", "model": "mlp", "mlp_hidden": [8], "rounds": 4, "eval_every": 1,
        "local_steps": 1}
KNOBS = ["local_lr", "local_momentum"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    configs = [{**c, **BASE} for c in grid_configs("fedavg", {"local_lr": [0.01, 0.05, 0.2], "local_momentum": [0.0, 0.9]})]
    cells = [{"target_domain": "0", "seed": 0}, {"target_domain": "30", "seed": 1}]
    assert run_grid(configs, cells, str(out), "g", workers=1) == 12
    table = build_table([out], KNOBS)
    pq.write_table(table, out / "grid.parquet")
    return out, TabularBenchmark(out / "grid.parquet")


def test_the_grid_is_the_product_of_the_named_parameters_over_the_space_defaults():
    configs = grid_configs("fedprox", {"local_lr": 3, "prox_mu": [0.01, 0.1]})
    assert len(configs) == 6 and {c["prox_mu"] for c in configs} == {0.01, 0.1}
    assert {c["local_lr"] for c in configs} == {0.005, 0.03162, 0.2}  # the shared range, log-spaced
    assert all(c["algorithm"] == "fedprox" and c["local_momentum"] == 0.9 for c in configs)  # defaults elsewhere
    with pytest.raises(ConfigError, match="'omg_kappa' is not a parameter of its search space"):
        grid_configs("fedprox", {"omg_kappa": 2})


def test_the_table_answers_a_trial_with_the_rows_the_run_recorded(grid):
    out, bench = grid
    assert bench.algorithms() == ["fedavg"]
    assert bench.cells("fedavg") == [Cell("rotated-digits", "0", 0), Cell("rotated-digits", "30", 1)]
    assert bench.axes("fedavg") == {"local_lr": [0.01, 0.05, 0.2], "local_momentum": [0.0, 0.9]}
    rows = [r for r in load(out).to_pylist()
            if r["target_domain"] == "30" and r["hp.local_lr"] == 0.05 and r["hp.local_momentum"] == 0.9]
    rows.sort(key=lambda r: r["round"])
    got = bench.answer("fedavg", Cell("rotated-digits", "30", 1), {"local_lr": 0.05, "local_momentum": 0.9})
    assert [(g["round"], g["val_acc"], g["target_acc"], g["num_participants"]) for g in got] == \
        [(r["round"], r["val_acc"], r["target_acc"], r["num_participants"]) for r in rows]
    assert len(got) == 4 and bench.answer("fedavg", Cell("rotated-digits", "30", 1),
                                          {"local_lr": 0.05, "local_momentum": 0.9}, rounds=2) == got[:2]
    assert bench.cost("fedavg", Cell("rotated-digits", "30", 1)) == 6 * 4 * 5  # configs x rounds x participants
    with pytest.raises(KeyError, match="no run of fedavg"):
        bench.answer("fedavg", Cell("rotated-digits", "30", 1), {"local_lr": 0.07, "local_momentum": 0.9})
    with pytest.raises(ValueError, match="hp.prox_mu"):
        build_table([out], ["prox_mu"])


def test_random_search_over_the_whole_grid_selects_what_the_grid_selects(grid):
    _, bench = grid
    for cell in bench.cells("fedavg"):
        points = simulate(bench, "fedavg", cell, STRATEGIES["random"], seed=3)
        assert len(points) == 6 and points[-1].compute == bench.cost("fedavg", cell)
        assert [p.compute for p in points] == [20 * (i + 1) for i in range(6)]  # 4 rounds x 5 clients a trial
        _, target = bench.grid_choice("fedavg", cell)
        assert points[-1].target_acc == target
        assert at_budget(points, 19) is None and at_budget(points, 45).trials == 2


def test_a_pruning_scheduler_spends_less_than_the_grid(grid):
    _, bench = grid
    cell = bench.cells("fedavg")[0]
    spent = [simulate(bench, "fedavg", cell, Strategy("sha", "random", "asha", grace_period=1, reduction_factor=2),
                      seed=s)[-1].compute for s in range(4)]
    assert min(spent) < bench.cost("fedavg", cell)


def test_the_same_seed_gives_the_same_curve_and_the_budget_is_respected(grid):
    _, bench = grid
    cell = bench.cells("fedavg")[1]
    a = simulate(bench, "fedavg", cell, STRATEGIES["tpe+hyperband"], seed=5, budget=0.5)
    assert a == simulate(bench, "fedavg", cell, STRATEGIES["tpe+hyperband"], seed=5, budget=0.5)
    assert a[-2].compute < 0.5 * bench.cost("fedavg", cell)  # the last trial started below the budget
    assert all(math.isfinite(p.target_acc) for p in a)


def test_a_pooled_space_tunes_the_algorithm_as_a_knob(grid):
    out, bench = grid
    from fedtune.tune.tabular.table import POOL

    extra = [{**c, **BASE} for c in grid_configs("fedprox", {"local_lr": [0.05], "prox_mu": [0.01, 1.0]})]
    run_grid(extra, [{"target_domain": "0", "seed": 0}], str(out), "p", workers=1)
    pooled = TabularBenchmark(build_table([out / "g-w0", out / "p-w0"], KNOBS + ["prox_mu"]))
    space = POOL.join(pooled.algorithms())
    assert space == "fedavg+fedprox" and pooled.cells(space) == [Cell("rotated-digits", "0", 0)]
    configs = pooled.configs(space)
    assert len(configs) == 6 + 2 and {c["algorithm"] for c in configs} == {"fedavg", "fedprox"}
    assert pooled.axes(space)["algorithm"] == ["fedavg", "fedprox"] and pooled.axes(space)["fedprox.prox_mu"] == [0.01, 1.0]
    cell = pooled.cells(space)[0]
    assert pooled.cost(space, cell) == pooled.cost("fedavg", cell) + pooled.cost("fedprox", cell)
    points = simulate(pooled, space, cell, STRATEGIES["random"], seed=0)
    assert len(points) == 8 and points[-1].target_acc == pooled.grid_choice(space, cell)[1]
    tpe = simulate(pooled, space, cell, STRATEGIES["tpe"], seed=0, max_trials=6)
    assert len(tpe) == 6 and all(math.isfinite(p.target_acc) for p in tpe)


def test_runs_along_the_client_fidelity_rungs_cost_their_sampled_clients(grid, tmp_path):
    out, full = grid
    fidelity = {"fidelity_participation": 0.2, "fidelity_grace_rounds": 2, "fidelity_factor": 3.0}
    configs = [{**c, **BASE, **fidelity} for c in grid_configs("fedavg", {"local_lr": [0.01, 0.05, 0.2],
                                                                       "local_momentum": [0.0, 0.9]})]
    run_grid(configs, [{"target_domain": "0", "seed": 0}], str(tmp_path), "cf", workers=1)
    cheap = TabularBenchmark(build_table([tmp_path / "cf-w0"], KNOBS))
    cell = Cell("rotated-digits", "0", 0)
    rows = cheap.answer("fedavg", cell, {"local_lr": 0.05, "local_momentum": 0.9})
    assert [r["num_participants"] for r in rows] == [1, 1, 3, 3]  # 5 clients: 0.2, then 0.6 after round 2
    assert cheap.cost("fedavg", cell) == 6 * (1 + 1 + 3 + 3) < full.cost("fedavg", cell)
    # measured against the full grid's compute: the whole cheap grid is 40 % of it
    points = simulate(cheap, "fedavg", cell, STRATEGIES["random"], seed=0, budget=0.4,
                      grid_cost=full.cost("fedavg", cell))
    assert len(points) == 6 and points[-1].compute == cheap.cost("fedavg", cell)
    assert len(simulate(cheap, "fedavg", cell, STRATEGIES["random"], seed=0, budget=0.2,
                        grid_cost=full.cost("fedavg", cell))) == 3


# ------------------------------------------------------------------ bad tables and arguments: one line
def _small_table(**columns):
    """Two configurations of fedavg in one cell, 3 rounds each (a table as build_table makes it)."""
    import pyarrow as pa

    rows = [("fedavg", "rotated-digits", "0", 0, f'{{"local_lr": {lr}}}', r, acc, acc / 2, 5)
            for lr, accs in ((0.01, (0.2, 0.3, 0.4)), (0.1, (0.5, 0.6, 0.55))) for r, acc in enumerate(accs, 1)]
    from fedtune.tune.tabular.table import COLUMNS

    data = {c: [row[i] for row in rows] for i, c in enumerate(COLUMNS)}
    data.update(columns)
    return pa.table({k: v for k, v in data.items() if v is not None})


def _one_line(exc_type, fn, *words):
    with pytest.raises(exc_type) as err:
        fn()
    text = str(err.value)
    assert "\n" not in text and len(text) < 400 and all(w in text for w in words), text
    return text


def test_a_small_table_answers_and_its_strategies_run():
    bench = TabularBenchmark(_small_table())
    cell = Cell("rotated-digits", "0", 0)
    points = simulate(bench, "fedavg", cell, STRATEGIES["random"], seed=0)
    assert [p.compute for p in points] == [15, 30] and points[-1].score == 0.6
    assert bench.grid_choice("fedavg", cell) == ({"local_lr": 0.1}, 0.3)


def test_a_corrupt_missing_or_empty_table_file_is_one_line(tmp_path):
    from fedtune.errors import DataError

    bad = tmp_path / "grid.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    _one_line(DataError, lambda: TabularBenchmark(bad), f"tabular table '{bad}' is unreadable", "build_table")
    _one_line(DataError, lambda: TabularBenchmark(tmp_path / "none.parquet"), "does not exist")
    empty = tmp_path / "empty.parquet"
    pq.write_table(_small_table().slice(0, 0), empty)
    _one_line(DataError, lambda: TabularBenchmark(empty), f"tabular table '{empty}' has no rows",
              "allowed: a table of build_table")


@pytest.mark.parametrize("columns, words", [
    ({"val_acc": None}, ["has no column val_acc"]),
    ({"round": [1, 2, None, 1, 2, 3]}, ["column round has 1 null value"]),
    ({"algorithm": [None] * 6}, ["column algorithm has 6 null value"]),
    ({"seed": [0.0] * 6}, ["column seed holds double, not integers"]),
    ({"config": ["{not json"] * 6}, ["configuration '{not json' is not a JSON object"]),
    ({"config": ["[1, 2]"] * 6}, ["is not a JSON object"]),
])
def test_a_table_missing_what_answers_a_trial_is_one_line(columns, words):
    from fedtune.errors import DataError

    _one_line(DataError, lambda: TabularBenchmark(_small_table(**columns)), "the tabular table", *words)


@pytest.mark.parametrize("kw, words", [
    ({"budget": -1.0}, ["simulate: budget: -1.0 is out of range; allowed: > 0"]),
    ({"budget": 0}, ["simulate: budget: 0.0 is out of range"]),
    ({"budget": float("nan")}, ["simulate: budget: nan is not a finite number"]),
    ({"budget": "all"}, ["simulate: budget: 'all' is not a number"]),
    ({"grid_cost": -5}, ["simulate: grid_cost"]),
    ({"max_trials": 0}, ["simulate: max_trials: 0 is out of range; allowed: >= 1"]),
    ({"max_trials": 2.5}, ["simulate: max_trials: 2.5 is not an integer"]),
    ({"seed": -1}, ["simulate: seed: -1 is out of range"]),
    ({"protocol": "oracle"}, ["protocol 'oracle': the table holds no oracle_acc column", "allowed: val"]),
    ({"algorithm": "fedprox"}, ["the table has no run of algorithm 'fedprox'; allowed: fedavg"]),
    ({"cell": Cell("rotated-digits", "45", 0)}, ["the table has no run of fedavg there",
                                                  "allowed: ('rotated-digits', '0', 0)"]),
])
def test_bad_simulate_arguments_are_one_line_not_an_empty_curve(kw, words):
    bench = TabularBenchmark(_small_table())
    args = {"algorithm": "fedavg", "cell": Cell("rotated-digits", "0", 0), "seed": 0}
    args.update(kw)
    algorithm, cell, seed = args.pop("algorithm"), args.pop("cell"), args.pop("seed")
    _one_line(ConfigError, lambda: simulate(bench, algorithm, cell, STRATEGIES["random"], seed, **args), *words)


@pytest.mark.parametrize("kw, words", [
    ({"sampler": "grid"}, ["strategy 'x': sampler: 'grid' is not allowed; allowed: tpe, random"]),
    ({"scheduler": "pbt"}, ["strategy 'x': scheduler: 'pbt' is not allowed; allowed: fifo, asha, hyperband"]),
    ({"scheduler": "asha", "grace_period": 0}, ["strategy 'x': grace_period: 0 is out of range; allowed: >= 1"]),
    ({"scheduler": "asha", "reduction_factor": 1}, ["strategy 'x': reduction_factor: 1 is out of range"]),
    ({"scheduler": "hyperband", "reduction_factor": 2.5}, ["reduction_factor: 2.5 is not an integer"]),
])
def test_a_bad_strategy_is_one_line(kw, words):
    _one_line(ConfigError, lambda: Strategy("x", **{"sampler": "random", **kw}), *words)
