"""FedEx (Khodak et al. 2021; issue 31 item 3): the server's exponentiated-gradient step against a
float64 transcription of the authors' ``FedEx.step`` (mkhodak/FedEx, hyper.py), the configurations
as the authors perturb them, a client trains with the configuration drawn for it, ``fedex_eps: 0``
is the run without FedEx bit for bit, a checkpoint continues FedEx exactly, both backends agree,
it composes with every server rule, the trial row records the final distribution, bad input is one
line.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/algorithms/test_fedex.py."""

from __future__ import annotations

import json
import math

import pytest

from fedtune.results.store import load


@pytest.mark.ray
def test_population_training_over_a_methods_own_knob_with_fedex_over_the_fixed_shared_ones_runs(ray_session, tmp_path):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    o = SweepOptions(algorithms=["fedprox"], rounds=6, num_samples=3, scheduler="pbt", perturbation_interval=1,
                     knobs="own", output=str(tmp_path), name="p", report=False, sampler="random", sampler_seed=1,
                     overrides={"model": "mlp", "mlp_hidden": [16], "local_steps": 10, "max_client_actors": 1,
                                "fedex_configs": 3})
    trials = load(run_sweep(o).study_dir, "trials").to_pylist()
    assert len(trials) == 3 and {t["status"] for t in trials} == {"completed"}, [t.get("error") for t in trials]
    for t in trials:
        record = json.loads(t["fedex_json"])
        assert t["rounds_done"] == 6 and record["knobs"] == ["local_lr"] and math.isclose(sum(record["theta"]), 1.0)
