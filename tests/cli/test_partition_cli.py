"""`fedtune partition`: the plan `fedtune run` would train on, as client x domain counts, no training."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from fedtune.cli import main
from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import build_plan

ARGS = ["--dataset", "rotated-digits", "--target-domain", "30", "--set", "domain_homogeneity=0.1",
        "--set", "num_clients=7", "--set", "setting=fda", "--seed", "3"]


def _expected(split):
    """(client names, domains, counts) straight from the plan the run would build."""
    cfg = FederatedRunConfig.from_dict({"dataset": "rotated-digits", "target_domain": "30", "domain_homogeneity": 0.1,
                                        "num_clients": 7, "setting": "fda", "seed": 3})
    plan = build_plan(cfg)
    domains = [*plan.source_domains, "30"]
    counts = [[len(getattr(c, split).get(d, ())) for d in domains] for c in plan.clients]
    return [c.name for c in plan.clients], domains, counts


def test_json_counts_equal_the_plans(capsys):
    assert main(["partition", *ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names, domains, train = _expected("train")
    assert out["domains"] == domains and [c["name"] for c in out["clients"]] == names
    assert out["train"] == train and out["val"] == _expected("val")[2]
    assert out["setting"] == "fda" and out["target_domains"] == ["30"] and out["domain_homogeneity"] == 0.1
    assert names[-1] == "target" and train[-1] == [0, 0, 0, 0, 0, train[-1][-1]] and train[-1][-1] > 0
    # lambda = 0.1 is the paper's "heterogeneous": each source client mostly holds one domain
    src = np.array(train[:-1])
    assert (src.max(axis=1) / src.sum(axis=1) > 0.85).all()


def test_table_numbers_equal_the_plans(capsys):
    assert main(["partition", *ARGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "TRAIN examples" in lines[0] and "domain_homogeneity 0.1" in lines[0]
    names, domains, train = _expected("train")
    val = _expected("val")[2]
    assert lines[1].split() == ["client", *domains, "train", "val"]
    for line, name, row, vrow in zip(lines[2:], names, train, val):
        assert line.split() == [name, *map(str, row), str(sum(row)), str(sum(vrow))]
    total = np.array(train).sum(axis=0)
    assert lines[2 + len(names)].split() == ["total", *map(str, total), str(total.sum()), str(np.sum(val))]
    assert len(lines) == 3 + len(names)


@pytest.mark.parametrize("argv,message", [
    (["--set", "domain_homogeneity=2"], "field 'domain_homogeneity': 2.0 is out of range; allowed: >= 0 and <= 1"),
    (["--set", "domain_heterogeneity=0.3"], "field 'domain_heterogeneity' was renamed domain_homogeneity"),
    (["--set", "domain_homogeneity=0.5", "--set", "setting=fl"], "field 'domain_homogeneity': setting 'fl' pools"),
    (["--dataset", "nope"], "nope"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert main(["partition", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err
    assert captured.err.startswith("fedtune: error: ")


def test_partition_trains_nothing_and_never_imports_ray(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # any `import ray` now raises ImportError
    assert main(["partition", "--dataset", "rect4", "--output", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train"] == [[400, 0, 0], [0, 400, 0], [0, 0, 400]]
    assert list(tmp_path.iterdir()) == []  # no study folder, no results


@pytest.mark.parametrize("command", [["partition"], ["run", "--backend", "local"]])
@pytest.mark.parametrize("setting", ["fdg", "fda"])
def test_a_billion_clients_with_domain_homogeneity_are_refused_at_once_in_one_line(command, setting, tmp_path,
                                                                                   monkeypatch, capsys):
    import fedtune.data.partition as partition

    def computed(*args):
        raise AssertionError("the split was computed client by client")

    monkeypatch.setattr(partition, "homogeneity_counts", computed)
    argv = [*command, "--output", str(tmp_path), "--set", "num_clients=1000000000", "--set", "domain_homogeneity=0.1",
            "--set", f"setting={setting}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == ("fedtune: error: field 'num_clients': 1000000000 clients with domain_homogeneity=0.1 need at least "
                   "4 examples each, but the 5 source domain(s) hold only 1497; allowed: at most 374 (lower "
                   "num_clients)\n")
