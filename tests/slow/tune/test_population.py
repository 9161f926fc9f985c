"""PBT and PB2 (issue 31 item 1): Ray Tune's population-based training over federated runs. A
member exploiting another restarts from the donor's whole federated state with the donor's
configuration, perturbed within the space; its rows say so (``pbt_history``), its fedtune trial id
stays one per member, every (member, round) is recorded once, Optuna holds every member once with
the Arrow records' values, also after a killed driver resumed; structural choices (the server
optimiser) are never mutated; bad options are one line.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_population.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fedtune.tune.study.options import SweepOptions

from tests.tune.test_sweep import TINY_SET, load_optuna, paused_driver, rounds_by_trial, wait_until_paused


def _check_records(study_dir, name: str, members: int, rounds: int) -> list[dict]:
    from optuna.trial import TrialState

    from fedtune.results.store import load

    rows = rounds_by_trial(study_dir)  # asserts (member, round) exactly once
    trials = {t["trial_id"]: t for t in load(study_dir, "trials").to_pylist()}
    assert len(trials) == members and set(rows) == set(trials)
    assert all(sorted(rows[t]) == list(range(1, rounds + 1)) for t in trials)
    study = load_optuna(study_dir, name)
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in study.trials) == sorted(trials)  # each member once
    for t in study.trials:
        row = trials[t.user_attrs["fedtune_trial_id"]]
        assert t.state == TrialState.COMPLETE and t.value == pytest.approx(row["best_val_acc"])
        assert t.user_attrs["pbt_history"] == json.loads(row.get("pbt_history") or "[]")
    return [{"trial": tid, "rows": rows[tid], "history": json.loads(trials[tid].get("pbt_history") or "[]")}
            for tid in sorted(trials)]


@pytest.mark.ray
@pytest.mark.parametrize("scheduler", ["pbt", "pb2"])
def test_a_member_exploits_another_with_its_whole_state_and_the_records_agree(ray_session, tmp_path, scheduler):
    from fedtune.tune.study.sweep import run_sweep

    # Two members train side by side; PBT exploits only when a member reports while another has a
    # checkpointed result, so the runs must overlap: 6 rounds of 10 steps (at 4 rounds of 1 step, once
    # the rounds got faster, a busy CI machine twice saw the members barely overlap and no exploit).
    rounds = 6
    o = SweepOptions(algorithms=["fedavg"], rounds=rounds, num_samples=3, scheduler=scheduler, perturbation_interval=1,
                     output=str(tmp_path), name="p", report=False, sampler_seed=1,
                     overrides={"model": "mlp", "mlp_hidden": [16], "local_steps": 10, "max_client_actors": 1})
    study_dir = run_sweep(o).study_dir
    members = _check_records(study_dir, "p/fedavg", 3, rounds)
    exploited = [m for m in members if m["history"]]
    assert exploited, f"no member exploited another in {rounds} rounds at interval 1"
    ids = {m["trial"] for m in members}
    for m in exploited:
        for event in m["history"]:
            assert event["from"] in ids - {m["trial"]} and 1 <= event["round"] < rounds
        last = m["history"][-1]
        after = m["rows"][last["round"] + 1]  # the round after the restart runs the new configuration
        for k, v in last["config"].items():
            assert after[f"hp.{k}"] == pytest.approx(v), k
        assert after["hp.server_optimizer"] == last["config"]["server_optimizer"]  # taken with the donor's state


@pytest.mark.ray
def test_a_killed_pbt_driver_resumes_every_member_exactly_once(ray_session, tmp_path):
    from fedtune.tune.study.sweep import run_sweep

    study_dir = tmp_path / "pk"
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "4", "--num-samples",
           "3", "--scheduler", "pbt", "--perturbation-interval", "1", "--set", "local_steps=1", *TINY_SET,
           "--output", str(tmp_path), "--name", "pk", "--address", address, "--no-report"]
    env, flag, _ = paused_driver(tmp_path, "result:2")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        os.kill(proc.pid, signal.SIGKILL)  # mid-population: a member has results, the others run or wait
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert json.loads((study_dir / "study.json").read_text())["searches"]["fedavg"]["status"] == "running"
    run_sweep(SweepOptions(output=str(tmp_path), name="pk", report=False), resume=True)
    _check_records(study_dir, "pk/fedavg", 3, 4)
