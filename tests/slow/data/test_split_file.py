"""The WILDS protocol beside leave-one-domain-out: split files (fedtune.data.split_file), the plan
they give, the metrics of their splits, selection by OOD validation and the report's columns.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/data/test_split_file.py."""

from __future__ import annotations

import pytest

from fedtune.results.store import load
from fedtune.runtime.driver import run

from tests.data.test_split_file import cfg_of, tree, write_split


@pytest.mark.ray
def test_a_split_file_run_gives_the_same_rows_on_both_backends_and_any_actor_count(ray_session, tmp_path):
    root = tree(tmp_path / "ds")
    write_split(root)
    metrics = ("train_loss", "val_acc", "ood_val_acc", "id_test_acc", "target_acc", "target_worst_acc")
    got = []
    for name, kw in (("local", {}), ("ray1", {"backend": "ray", "max_client_actors": 1}),
                     ("ray2", {"backend": "ray", "max_client_actors": 2})):
        res = run(cfg_of(tmp_path, root, name=name, clients_per_domain=2, client_cpus=0.5, **kw), progress=False)
        assert res.status == "completed"
        got.append([tuple(r[m] for m in metrics) for r in load(tmp_path / "out" / name, "rounds").to_pylist()])
    assert got[0] == got[1] == got[2] and len(got[0]) == 2
