"""A study's driver and its resume when things go wrong (issue 19): one driver per study, rows
rebuilt after ``trials.parquet`` was renamed away, a deleted Optuna storage, SIGTERM in every
phase of a sweep, and the options ``--resume`` refuses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.sweep import StudyInterrupted, run_sweep


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedtune.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


TINY = {"local_steps": 1, "model": "mlp", "mlp_hidden": [8], "max_client_actors": 1}
# With ``max_client_actors=1`` (and one trial at a time: ``--max-concurrent 1``) a trial starts one
# client actor (one torch import) instead of one per CPU: the studies below test bookkeeping, not packing.
TINY_ARGS = ["--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--set", "max_client_actors=1",
             "--max-concurrent", "1"]


# ------------------------------------------------------------------------------------------------
# One driver per study.
HOLDER = textwrap.dedent("""
    import sys, time
    from fedtune.tune.study.driver_lock import study_driver
    with study_driver(sys.argv[1], "fedtune sweep --name busy"):
        print("held", flush=True)
        time.sleep(300)
""")


def test_a_second_driver_of_a_study_is_refused_at_once_and_a_killed_one_leaves_no_stuck_lock(tmp_path):
    study_dir = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(study_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in (["--algorithm", "fedavg"], ["--resume"]):
            t0 = time.time()
            res = cli("sweep", "--output", str(tmp_path), "--name", "busy", *extra, cwd=tmp_path)
            assert res.returncode == 2 and time.time() - t0 < 60, res.stderr
            assert "already being run by another fedtune sweep" in res.stderr, res.stderr
            assert f"pid {holder.pid}" in res.stderr and "Traceback" not in res.stderr
            assert len(res.stderr.strip().splitlines()) == 1
        assert not (study_dir / "study.json").exists()  # the refused driver wrote nothing
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    # The OS released the dead holder's lock: the next driver gets past it (and fails later, on
    # something else: no study to resume).
    res = cli("sweep", "--resume", "--output", str(tmp_path), "--name", "busy", cwd=tmp_path)
    assert res.returncode == 2 and "no study 'busy'" in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------
# SIGTERM in every phase: exit 130 and the --resume line, whatever the phase.
PHASE_DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    marker, phase = Path(sys.argv[1]), sys.argv[2]

    def stall(*args, **kwargs):
        marker.write_text(phase)
        time.sleep(120)
        raise SystemExit("SIGTERM did not stop the driver")

    if phase == "ray-start":
        import fedtune.runtime.cluster as m
        real = m.connect_ray
        def patched(*a, **k):
            marker.write_text(phase); time.sleep(120)
        m.connect_ray = patched
        import fedtune.runtime.driver as d
        d.connect_ray = patched
    elif phase == "between-searches":  # after the first search's Tuner.fit, before the next one
        import fedtune.tune.tuner.optuna_search as m
        m.reconcile_optuna = stall
    elif phase == "report":
        import fedtune.reports.report as m
        m.make_report = stall
    from fedtune.cli import main
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.parametrize("phase", ["ray-start"])  # the later phases (a whole study each): tests/slow/tune/
def test_sigterm_ends_every_phase_of_a_sweep_with_exit_130_and_the_resume_line(ray_session, tmp_path, phase, capsys):
    sigterm_a_sweep_in(phase, ray_session, tmp_path, capsys)


def sigterm_a_sweep_in(phase: str, ray_session, tmp_path: Path, capsys) -> None:
    """SIGTERM a sweep's driver in ``phase``: exit 130, no traceback, and the resume line (which resumes)."""
    from fedtune.cli import main

    marker = tmp_path / "phase"
    address = ray_session.get_runtime_context().gcs_address
    args = ["sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "1", *TINY_ARGS,
            "--output", str(tmp_path), "--name", "st", "--address", address]
    if phase == "between-searches":
        args += ["--trial-seeds", "2"]
    proc = subprocess.Popen([sys.executable, "-c", PHASE_DRIVER, str(marker), phase, *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate(timeout=30)[1][-3000:]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "did not stop" not in err, err[-3000:]
    if phase == "ray-start":  # nothing ran yet: nothing to resume
        assert "interrupted before it started" in err, err
    else:
        assert f"fedtune sweep --resume --name st --output {tmp_path}" in err, err
        # The command that line names, run by the CLI's main in this process (which is on the same
        # Ray): a fresh driver of the study, without a second interpreter importing Ray Tune and torch.
        capsys.readouterr()
        rc = main(["sweep", "--resume", "--name", "st", "--output", str(tmp_path), "--address", address,
                   "--no-report"])
        assert rc == 0, capsys.readouterr().err[-3000:]
        data = json.loads((tmp_path / "st" / "study.json").read_text())
        assert {s["status"] for s in data["searches"].values()} == {"done"}


# ------------------------------------------------------------------------------------------------
# --resume keeps the study's options: every one given again is refused, by name.
@pytest.mark.parametrize("flag", [["--seeds", "3"], ["--trial-seeds", "2"], ["--scheduler", "asha"],
                                  ["--sampler", "random"], ["--grace-period", "2"], ["--reduction-factor", "3"],
                                  ["--sampler-seed", "5"], ["--num-samples", "4"], ["--knobs", "own"]])
def test_resume_refuses_every_option_it_would_ignore(tmp_path, flag):
    res = cli("sweep", "--resume", "--output", str(tmp_path), "--name", "x", *flag, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{flag[0]} cannot change them" in res.stderr, res.stderr
    assert "--no-report" in res.stderr  # the flags --resume does take, all of them


def test_flags_left_out_still_take_their_defaults():
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args

    opts = options_from_args(build_parser().parse_args(["sweep", "--algorithm", "fedavg"]))
    assert (opts.seeds, opts.trial_seeds, opts.scheduler, opts.sampler, opts.grace_period, opts.reduction_factor,
            opts.sampler_seed) == (1, 1, "fifo", "tpe", 1, 2.0, 0)
    opts = options_from_args(build_parser().parse_args(["sweep", "--seeds", "3", "--sampler", "random"]))
    assert (opts.seeds, opts.sampler) == (3, "random")


def test_resume_accepts_the_studys_own_options_given_again_and_refuses_a_changed_one(tmp_path):
    """--resume with the options the study was started with said they "cannot change"."""
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args
    from fedtune.results.study_dir import write_study

    space = tmp_path / "fedavg.yaml"
    space.write_text("algorithm: fedavg\ndescription: the study's own override\n")
    (tmp_path / "s" / "spaces").mkdir(parents=True)
    (tmp_path / "s" / "spaces" / "fedavg.yaml").write_text(space.read_text())
    saved = SweepOptions(spaces=["spaces/fedavg.yaml"], num_samples=4, sampler="random", seeds=2,
                         overrides={"rounds": 2}, output=str(tmp_path), name="s")
    write_study(tmp_path / "s", {"options": saved.to_json(), "started_at": "2024-01-01T00:00:00"})
    base = ["sweep", "--resume", "--output", str(tmp_path), "--name", "s"]
    same = ["--num-samples", "4", "--sampler", "random", "--seeds", "2", "--set", "rounds=2", str(space)]
    opts = options_from_args(build_parser().parse_args(base + same))
    assert (opts.name, opts.num_samples) == ("s", 4)
    with pytest.raises(ConfigError) as err:
        options_from_args(build_parser().parse_args(base + ["--num-samples", "5", "--sampler", "random"]))
    assert "--num-samples cannot change them" in str(err.value) and "--sampler" not in str(err.value).split(";")[1]


def test_an_interrupt_before_the_study_starts_has_no_resume_line(tmp_path, monkeypatch):
    import fedtune.tune.study.sweep as sweep_module

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "_drive", interrupted)
    with pytest.raises(StudyInterrupted, match="before it started; nothing ran"):
        run_sweep(SweepOptions(algorithms=["fedavg"], rounds=1, num_samples=1, output=str(tmp_path), name="n",
                               overrides=dict(TINY), report=False))
    assert not (tmp_path / "n" / "driver.json").exists()  # the lock and its note are released
    assert not os.path.exists(tmp_path / "n" / "study.json")


# ------------------------------------------------------------------------------------------------
# The "waiting for the autoscaler" line only where there is an autoscaler.
@pytest.mark.parametrize("autoscaler", [False, True])
def test_the_wait_line_speaks_of_an_autoscaler_only_where_there_is_one(monkeypatch, autoscaler):
    import threading

    from rich.console import Console

    from fedtune.tune.trial import scale_up
    from fedtune.tune.common.active import ACTIVE

    class View:
        console = Console(record=True, width=400)
        rows: dict = {}
        lock = threading.Lock()

    class Trial:
        status, placement_group_factory = "PENDING", None

    monkeypatch.setitem(ACTIVE, "view", View())
    monkeypatch.setitem(ACTIVE, "autoscaler", autoscaler)
    watch = scale_up.ScaleUpWatch("fedavg", timeout_s=30.0, clock=iter([0.0, 12.0, 31.0]).__next__)
    watch.on_step_begin(0, [Trial()])
    watch.on_step_begin(1, [Trial()])
    with pytest.raises(scale_up.ScaleUpTimeout) as err:
        watch.on_step_begin(2, [Trial()])
    said = View.console.export_text()
    assert ("autoscaler (" in said) == autoscaler and ("no autoscaler" in said) != autoscaler, said
    assert ("no autoscaler" in str(err.value)) != autoscaler and "--resume" in str(err.value)


def test_on_a_ray_fedtune_started_a_waiting_trial_blames_nothing_else(monkeypatch):
    """Every sweep on fedtune's own Ray printed that "something else on this Ray holds" the CPUs
    while its first trial's actors started: nothing else runs there."""
    import threading

    from rich.console import Console

    from fedtune.tune.trial import scale_up
    from fedtune.tune.common.active import ACTIVE

    class View:
        console = Console(record=True, width=400)
        rows: dict = {}
        lock = threading.Lock()

    class Trial:
        status, placement_group_factory = "PENDING", None

    monkeypatch.setitem(ACTIVE, "view", View())
    monkeypatch.setitem(ACTIVE, "autoscaler", False)
    monkeypatch.setitem(ACTIVE, "own_ray", True)
    watch = scale_up.ScaleUpWatch("fedavg", timeout_s=30.0, clock=iter([0.0, 12.0, 31.0]).__next__)
    watch.on_step_begin(0, [Trial()])
    watch.on_step_begin(1, [Trial()])
    assert View.console.export_text().strip() == ""
    with pytest.raises(scale_up.ScaleUpTimeout) as err:
        watch.on_step_begin(2, [Trial()])
    assert "something else" not in str(err.value) and "fedtune started" in str(err.value)


# ------------------------------------------------------------------------------------------------
# val_fraction=0: no selection by a validation split that does not exist.
@pytest.mark.parametrize("selection", ["val", None])
def test_a_sweep_selecting_by_validation_refuses_val_fraction_0_up_front(tmp_path, selection):
    from fedtune.tune.study.plan import plan_study

    with pytest.raises(ConfigError) as err:
        plan_study(SweepOptions(algorithms=["fedavg"], output=str(tmp_path), selection=selection,
                                overrides={"val_fraction": 0.0}))
    assert "'val_fraction' is 0" in str(err.value) and "allowed: val_fraction in (0, 0.9]" in str(err.value)
    # the oracle protocol does not use it: allowed
    plan_study(SweepOptions(algorithms=["fedavg"], output=str(tmp_path), selection="oracle",
                            overrides={"val_fraction": 0.0}))


def test_a_run_without_validation_shows_no_best_validation_round(tmp_path, capsys):
    from fedtune.cli import main

    rc = main(["run", "--backend", "local", "--rounds", "2", "--set", "val_fraction=0", "--set", "local_steps=1",
               "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--output", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "best val round" not in out
    assert "no best-validation round: no round has a val_acc (val_fraction=0" in out
