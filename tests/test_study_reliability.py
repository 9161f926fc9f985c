"""A study's driver and its resume when things go wrong (issue 19): one driver per study, rows
rebuilt after ``trials.parquet`` was renamed away, a deleted Optuna storage, SIGTERM in every
phase of a sweep, and the options ``--resume`` refuses."""

from __future__ import annotations

import json
import os
import shutil
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
# A finished study, resumed after trials.parquet or optuna.db went away.
@pytest.fixture(scope="module")
def finished_study(ray_session, tmp_path_factory):
    """A finished study: 2 searched trials and one --seeds re-run (3 trial rows)."""
    out = tmp_path_factory.mktemp("finished")
    run_sweep(SweepOptions(algorithms=["fedavg"], rounds=2, num_samples=2, seeds=2, output=str(out), name="done",
                           overrides=dict(TINY), sampler="random", max_concurrent=1, report=False))
    return out / "done"


def copy_study(study_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / study_dir.name
    shutil.copytree(study_dir, dest)
    return dest


@pytest.mark.slow
def test_resume_rebuilds_every_missing_trial_row_of_a_finished_study(finished_study, tmp_path):
    from fedtune.results.store import load
    from fedtune.cli_sweep import _any_completed

    study_dir = copy_study(finished_study, tmp_path)
    before = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert len(before) == 3 and {r["status"] for r in before.values()} == {"completed"}
    # fedtune's advice for an unreadable trials.parquet: rename it to *.corrupt, then --resume
    (study_dir / "trials.parquet").rename(study_dir / "trials.parquet.corrupt")
    # and a driver killed while writing trials.parquet left the atomic writer's temp file
    stray = study_dir / ".trials.parquet.fedtune-0a1b2c3d.tmp"
    stray.write_bytes(b"PAR1 half a file")
    os.utime(stray, (time.time() - 3600, time.time() - 3600))

    result = run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)

    after = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert sorted(after) == sorted(before)  # the seed re-run's row too (it is not an Optuna trial)
    def config(row):  # the copy lives in another output folder
        return {k: v for k, v in json.loads(row["config_json"]).items() if k != "output"}

    for tid, row in after.items():
        for col in ("status", "rounds_done", "best_val_acc", "best_round", "target_acc_at_best_val", "seed"):
            assert row[col] == before[tid][col], (tid, col)
        assert config(row) == config(before[tid]), tid
    assert _any_completed(study_dir)
    assert sum("rebuilt" in w for w in result.warnings) == 3
    assert not stray.exists() and any(stray.name in w for w in result.warnings)
    from fedtune.reports.report import make_report

    report = make_report(study_dir, plots=False, write=False)
    assert report.cells[("fedavg", report.domains[0])].n == 2  # the two seeds, as before


@pytest.mark.slow
def test_resume_with_the_optuna_storage_deleted_says_so_and_changes_nothing(finished_study, tmp_path):
    from fedtune.reports.importances import study_optuna

    study_dir = copy_study(finished_study, tmp_path)
    (study_dir / "optuna.db").unlink()
    with pytest.raises(ConfigError) as err:
        run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)
    text = str(err.value)
    assert "Optuna storage" in text and "optuna.db' is missing" in text and "fedavg" in text
    assert "fedtune report" in text and "another --name" in text
    assert not (study_dir / "optuna.db").exists()  # not silently re-created empty
    storage, names, notes = study_optuna(study_dir)  # the report says what happened, not "not an Optuna sweep"
    assert storage is None and "optuna.db is missing" in notes[0]


def _orphan_with_rounds(study_dir: Path, optuna_state: str) -> str:
    """The state two SIGKILLs leave: a trial Optuna asked (left RUNNING, or already closed FAIL as
    orphaned) that Tune's snapshot never held, with its first round on disk and no trials.parquet
    row. Returns its trial id."""
    import optuna

    from fedtune.results.store import ResultsStore, load
    from fedtune.results.study_dir import read_study, write_study
    from fedtune.tune.study.plan import optuna_storage_url
    from fedtune.tune.trial.trainable import trial_run_config

    data = read_study(study_dir)
    key = next(k for k in data["searches"] if not k.endswith(" seeds"))
    study = optuna.load_study(study_name=data["searches"][key]["optuna_study"], storage=optuna_storage_url(study_dir))
    config = dict(study.trials[0].user_attrs["config"], local_lr=0.0123)
    trial_id = trial_run_config(config).trial_id()
    first = study.trials[0].user_attrs["fedtune_trial_id"]
    rows = [dict(r, trial_id=trial_id) for r in load(study_dir / "rounds" / f"{first}.parquet").to_pylist()
            if r["round"] == 1]
    ResultsStore(study_dir.parent, study_dir.name).write_rounds(trial_id, rows)
    asked = study.ask()
    asked.set_user_attr("fedtune_trial_id", trial_id)
    asked.set_user_attr("config", config)
    if optuna_state == "orphaned":  # a driver after it closed it: the search ended
        asked.set_user_attr("fedtune_status", "orphaned")
        study.tell(asked, state=optuna.trial.TrialState.FAIL)
    else:  # the search is unfinished: the resumed driver restores it, and closes the trial at its end
        data["searches"][key]["status"] = "running"
        write_study(study_dir, data)
    return trial_id


@pytest.mark.slow
@pytest.mark.parametrize("optuna_state", ["orphaned", "running"])
def test_a_trial_no_driver_continued_gets_a_row_and_the_four_records_agree(finished_study, tmp_path,
                                                                           optuna_state):
    """Two SIGKILLs (the first with a trial's rounds on disk, the second while its resume ran) left a
    trial with a round file, no trials.parquet row and Optuna holding it RUNNING or FAIL/orphaned:
    --resume records it as interrupted, and Optuna, trials.parquet, the round files and the report
    name the same trials."""
    import optuna

    from fedtune.reports.report import make_report
    from fedtune.results.store import load
    from fedtune.results.study_dir import read_study
    from fedtune.tune.study.plan import optuna_storage_url

    study_dir = copy_study(finished_study, tmp_path)
    orphan = _orphan_with_rounds(study_dir, optuna_state)

    result = run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)

    rows = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert rows[orphan]["status"] == "interrupted" and rows[orphan]["rounds_done"] == 1
    assert any(orphan in w and "not continued" in w for w in result.warnings), result.warnings
    round_files = {p.stem for p in (study_dir / "rounds").glob("*.parquet")}
    report = make_report(study_dir, plots=False, write=False)
    assert set(rows) == round_files == set(report.trials["trial_id"]) and len(rows) == 4
    assert report.trials["has_trial_row"].all()
    seeds = set(read_study(study_dir)["searches"]["fedavg seeds"]["trial_ids"][1:])  # --seeds re-runs: not Optuna's
    trials = optuna.load_study(study_name=read_study(study_dir)["searches"]["fedavg"]["optuna_study"],
                               storage=optuna_storage_url(study_dir)).trials
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    told = {t.user_attrs["fedtune_trial_id"]: (t.state.name, t.user_attrs.get("fedtune_status")) for t in trials}
    assert set(told) == set(rows) - seeds
    assert told[orphan] == ("FAIL", "orphaned")
    assert all(told[t] == ("COMPLETE", "completed") and rows[t]["status"] == "completed" for t in told if t != orphan)


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


@pytest.mark.parametrize("phase", ["ray-start", pytest.param("between-searches", marks=pytest.mark.slow),
                                   pytest.param("report", marks=pytest.mark.slow)])
def test_sigterm_ends_every_phase_of_a_sweep_with_exit_130_and_the_resume_line(ray_session, tmp_path, phase, capsys):
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
    from fedtune.tune.study.active import ACTIVE

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
    from fedtune.tune.study.active import ACTIVE

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


# ------------------------------------------------------------------------------------------------
# Ray lost mid-sweep: one line; after --resume, Optuna and the Arrow store agree.
def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every descendant of ``pid`` (from /proc; no psutil needed)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        p = int(stat.parent.name)
        parent[p], names[p] = int(fields[1]), name
    out = []
    for p in parent:
        q = p
        while q in parent and q != pid and q > 1:
            q = parent[q]
        if q == pid and p != pid:
            out.append((p, names[p]))
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the raylet through /proc (Linux)")
def test_ray_lost_mid_sweep_is_one_line_and_resume_leaves_optuna_and_arrow_agreeing(ray_session, tmp_path, capsys):
    import optuna

    from fedtune.cli import main
    from fedtune.results.store import load

    args = ["sweep", "--algorithm", "fedavg", "--rounds", "4", "--num-samples", "2", "--set", "local_steps=20",
            "--set", "model=mlp", "--set", "num_cpus=2", "--set", "max_client_actors=1", "--max-concurrent", "1",
            "--output", str(tmp_path), "--name", "lost", "--no-report"]
    # The sweep starts a Ray of its own (its raylet is killed below). Its GCS marks the dead node dead
    # after 3 failed health checks 0.5 s apart instead of Ray's default 5 x 3 s: the same loss, seen sooner.
    env = {**os.environ, "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "fedtune.cli", *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not list((tmp_path / "lost" / "rounds").glob("*.parquet")):
            time.sleep(0.05)
        raylets = [p for p, name in _descendants(proc.pid) if name == "raylet"]
        assert proc.poll() is None and raylets, proc.stderr.read()[-3000:] if proc.poll() is not None else "no raylet"
        os.kill(raylets[0], signal.SIGKILL)  # the node is lost mid-trial
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.startswith("fedtune:")]
    assert proc.returncode == 2 and "Traceback" not in err and "ActorDiedError" not in err, err[-3000:]
    assert len(lines) == 1 and "Ray went away" in lines[0] and "--resume --name lost" in lines[0], err[-3000:]

    # The resume command, run by the CLI's main in this process: a new driver of the study, on this
    # session's Ray (already up, so the study's num_cpus, which sizes a Ray fedtune starts, is not used).
    capsys.readouterr()
    rc = main(["sweep", "--resume", "--name", "lost", "--output", str(tmp_path), "--no-report"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    study = optuna.load_study(study_name="lost/fedavg", storage=f"sqlite:///{tmp_path / 'lost' / 'optuna.db'}")
    trials = {r["trial_id"]: r["status"] for r in load(tmp_path / "lost", "trials").to_pylist()}
    optuna_says = {t.user_attrs["fedtune_trial_id"]: t.user_attrs.get("fedtune_status") for t in study.trials
                   if t.state != optuna.trial.TrialState.FAIL or t.user_attrs.get("fedtune_status") != "orphaned"}
    assert optuna_says == trials and set(trials.values()) == {"completed"} and len(trials) == 2
