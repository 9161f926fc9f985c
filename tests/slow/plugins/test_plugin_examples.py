"""The two plugin examples (examples/plugins/): FedDecorr, a client method (Shi et al., ICLR 2023,
github.com/bytedance/FedDecorr ``loss.py``), and FedNova, a server rule (Wang et al., NeurIPS 2020,
github.com/JYWa/FedNova ``distoptim/FedNova.py``), each one file outside the package that uses
fedtune's public face only. Their math against float64 references written from the authors' code
and the papers (not calling the plugins), their invariants, their refusals, their composition with
built-in components, and (Ray, slow) the same rows on both backends and a two-trial sweep through
``fedtune sweep --plugin``.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/plugins/test_plugin_examples.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.plugins.test_plugin_examples import PLUGINS, SMALL, TIMING


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "fedtune.cli", *args], cwd=cwd, capture_output=True, text=True,
                         timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def round_rows(study_dir: Path) -> list[dict]:
    files = sorted((study_dir / "rounds").glob("*.parquet"))
    assert len(files) == 1
    rows = pq.read_table(files[0]).to_pylist()
    return [{k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()
             if not k.endswith("_s") and k not in TIMING} for r in rows]


@pytest.mark.ray
@pytest.mark.parametrize("name,extra", [("feddecorr", []), ("fednova", ["--set", "local_momentum=0.5"])])
def test_a_plugin_run_gives_the_same_rows_on_ray_and_locally(ray_session, tmp_path, name, extra):
    address = ray_session.get_runtime_context().gcs_address
    common = ["run", "--plugin", str(PLUGINS / f"{name}.py"), "--algorithm", name, "--rounds", "3", *SMALL, *extra,
              "--output", str(tmp_path), "--no-progress"]
    cli(*common, "--backend", "local", "--name", "local", cwd=tmp_path)
    cli(*common, "--backend", "ray", "--address", address, "--name", "ray", cwd=tmp_path)
    for backend in ("local", "ray"):
        trial = pq.read_table(tmp_path / backend / "trials.parquet").to_pylist()[0]
        assert json.loads(trial["config_json"])["backend"] == backend and trial["status"] == "completed"
    local, on_ray = round_rows(tmp_path / "local"), round_rows(tmp_path / "ray")
    assert [r["round"] for r in local] == [1, 2, 3] and all(r["status"] == "ok" for r in local)
    assert on_ray == local
    diag = "diag.feddecorr" if name == "feddecorr" else "diag.fednova_tau_eff"
    assert all(r[diag] > 0 for r in local)


@pytest.mark.ray
@pytest.mark.parametrize("name,hparam", [("feddecorr", "feddecorr_beta"), ("fednova", "fednova_normalizer")])
def test_a_two_trial_sweep_of_a_plugin(ray_session, tmp_path, name, hparam):
    address = ray_session.get_runtime_context().gcs_address
    cli("sweep", "--plugin", str(PLUGINS / f"{name}.py"), "--algorithm", name, "--num-samples", "2", "--rounds", "2",
        *SMALL, "--max-concurrent", "1", "--address", address, "--output", str(tmp_path), "--name", "sw",
        "--no-report", cwd=tmp_path)
    trials = pq.read_table(tmp_path / "sw" / "trials.parquet").to_pylist()
    assert [t["status"] for t in trials] == ["completed", "completed"]
    assert all(t["algorithm"] == name and t["rounds_done"] == 2 for t in trials)
    values = [t[f"hp.{hparam}"] for t in trials]
    if name == "feddecorr":  # searched: the space's default first, then a draw from its log-uniform range
        assert values[0] == 0.1 and 0.01 <= values[1] <= 1.0 and values[1] != 0.1
    else:  # declared without a search distribution: fixed at the authors' default
        assert values == ["solver", "solver"]
