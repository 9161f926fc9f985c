"""Scale-out pieces on their own (no cluster): joining vs starting Ray, planning on the nodes an
autoscaler may add, the scale-up watch, the storage path, restarts in the Arrow store, and the
sweep's new options. The same paths run for real on Ray's fake autoscaler in tests/slow/cluster/test_autoscaling.py."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results.store import load
from fedtune.runtime import cluster as cl
from fedtune.tune.tuner.capacity import concurrency_cap
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.tuner.storage import check_storage_path, restorable

AUTOSCALER = {"max_workers": 3, "head_node_type": "head", "available_node_types": {
    "head": {"resources": {"CPU": 2}, "max_workers": 0},
    "gpu": {"resources": {"CPU": 2, "GPU": 1, "object_store_memory": 1e8}, "min_workers": 0, "max_workers": 2},
    "cpu": {"resources": {"CPU": 4}, "max_workers": 5},
    "unknown": {"resources": {}, "max_workers": 3},  # resources detected at launch: nothing to plan with
}}


# ------------------------------------------------------------------------------------------------
# The nodes an autoscaler may add.
def test_launchable_nodes_respect_type_and_cluster_limits():
    nodes = cl.launchable_nodes(AUTOSCALER, alive_types={"head": 1})
    # 2 gpu (its max), then cpu until the cluster's max_workers (3) is reached; head/unknown never.
    assert nodes == [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 4.0}]
    assert cl.launchable_nodes(AUTOSCALER, alive_types={"head": 1, "gpu": 2}) == [{"CPU": 4.0}]
    assert cl.launchable_nodes(AUTOSCALER, alive_types={"gpu": 2, "cpu": 1}) == []  # 3 workers up: full


def test_alive_nodes_are_matched_to_types_by_resources_without_a_mapping():
    assert cl._type_by_resources({"CPU": 2.0, "GPU": 1.0, "memory": 5.0}, AUTOSCALER) == "gpu"
    assert cl._type_by_resources({"CPU": 2.0, "node:__internal_head__": 1.0}, AUTOSCALER) == "head"
    assert cl._type_by_resources({"CPU": 16.0}, AUTOSCALER) is None


def test_cluster_view_totals_and_description():
    view = cl.ClusterView([{"CPU": 2.0}], [{"CPU": 2.0, "GPU": 1.0}], "/tmp/cfg.yaml")
    assert view.total == {"CPU": 4.0, "GPU": 1.0}
    assert view.describe() == "1 node alive, up to 1 more from the autoscaler's node types (/tmp/cfg.yaml)"
    assert cl.ClusterView([{"CPU": 2.0}, {"CPU": 1.0}]).describe() == "2 nodes alive"


def test_gpu_trials_are_planned_on_nodes_the_autoscaler_may_add_and_refused_when_no_type_fits():
    alive = [{"CPU": 2.0}]  # the head: no GPU
    launchable = cl.launchable_nodes(AUTOSCALER, {"head": 1})
    cfg = {"dataset": "rect4", "client_gpus": 0.5, "client_cpus": 1, "max_client_actors": 1}
    with pytest.raises(ConfigError, match="GPU"):  # alive nodes only: refused (what min_workers: 0 used to get)
        concurrency_cap([cfg], None, {"CPU": 2.0}, alive)
    view = cl.ClusterView(alive, launchable, "x")
    cap, warning = concurrency_cap([cfg], None, view.total, view.nodes)
    assert (cap, warning) == (4, None)  # 2 GPU nodes x 2 client actors of 0.5 GPU
    with pytest.raises(ConfigError, match="no node has room"):  # no node type has 2 GPUs: fail fast
        concurrency_cap([{**cfg, "client_gpus": 2}], None, view.total, view.nodes)


# ------------------------------------------------------------------------------------------------
# Joining or starting Ray.
def test_cluster_address_order(monkeypatch):
    import ray._private.services as services

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: None)
    assert cl.cluster_address(None) is None  # nothing running: start a local Ray
    assert cl.cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert cl.cluster_address("local") is None
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: "127.0.0.1:6380")
    assert cl.cluster_address(None) == "127.0.0.1:6380"  # a `ray start --head` on this machine
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:7000")  # Ray Jobs sets it for the job's driver
    assert cl.cluster_address(None) == "127.0.0.1:7000"
    assert cl.cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"  # an explicit address wins


def test_auto_address_without_a_cluster_is_a_clear_error(monkeypatch):
    import ray._private.services as services

    def nothing(addr, temp_dir=None):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", nothing)
    with pytest.raises(ConfigError, match="field 'address': 'auto' joins a running Ray cluster, but none was found"):
        cl.cluster_address("auto")


@pytest.mark.parametrize("fields,named", [({"num_cpus": 2}, "'num_cpus'"),
                                          ({"num_cpus": 2, "num_gpus": 1.0}, "'num_cpus', 'num_gpus'")])
def test_joining_a_cluster_with_local_sizes_is_refused_before_ray_init(monkeypatch, fields, named):
    import ray

    called = []
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:7000")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: called.append(k))
    cfg = FederatedRunConfig.from_dict(fields)
    with pytest.raises(ConfigError) as err:
        cl.connect_ray(cfg)
    assert named in str(err.value) and "RAY_ADDRESS is set" in str(err.value) and "127.0.0.1:7000" in str(err.value)
    assert called == []
    # Without them, the same call joins with no num_cpus/num_gpus (what failed under `ray job submit`);
    # nothing listens at the address here, so the reachability check is told it answers.
    monkeypatch.setattr(cl, "_unreachable", lambda target: None)
    assert cl.connect_ray(FederatedRunConfig()) is True
    assert "num_cpus" not in called[-1] and "num_gpus" not in called[-1]


def test_starting_a_local_ray_passes_its_size(monkeypatch):
    import ray
    import ray._private.services as services

    called = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: called.append(k))
    assert cl.connect_ray(FederatedRunConfig.from_dict({"num_cpus": 3})) is True
    assert called[-1]["address"] == "local" and called[-1]["num_cpus"] == 3
    assert called[-1]["include_dashboard"] is False


# ------------------------------------------------------------------------------------------------
# Waiting for the autoscaler.
def _trials(*statuses):
    return [SimpleNamespace(status=s, placement_group_factory=SimpleNamespace(bundles=[{}, {"CPU": 1.0, "GPU": 0.5}]))
            for s in statuses]


def test_scale_up_watch_counts_only_time_with_nothing_running(monkeypatch):
    from fedtune.tune.trial.scale_up import ScaleUpTimeout, ScaleUpWatch

    clock = iter([0.0, 5.0, 50.0, 51.0, 100.0]).__next__
    w = ScaleUpWatch("s", timeout_s=30.0, clock=clock)
    w.on_step_begin(0, _trials("PENDING"))
    w.on_step_begin(1, _trials("PENDING"))
    assert w.waiting_s == 5.0
    w.on_step_begin(2, _trials("RUNNING", "PENDING"))  # a trial runs: queueing, not waiting for nodes
    assert w.waiting_s == 0.0
    w.on_step_begin(3, _trials("TERMINATED", "PENDING"))  # waiting again from t=50
    w.on_step_begin(4, _trials("PENDING"))
    assert w.waiting_s == 1.0  # since t=50
    w2 = ScaleUpWatch("fedavg", timeout_s=30.0, clock=iter([0.0, 31.0]).__next__)
    w2.on_step_begin(0, _trials("PENDING"))
    with pytest.raises(ScaleUpTimeout, match=r"search 'fedavg'.*wait for 1 CPU, 0.5 GPU.*ray status"):
        w2.on_step_begin(1, _trials("PENDING"))
    # A wait past ANNOUNCE_AFTER_S is printed (a Ray Job's log has no live table), once a minute.
    from fedtune.tune.common import active

    printed = []
    view = SimpleNamespace(console=SimpleNamespace(print=lambda text, **kw: printed.append(text)), rows={})
    monkeypatch.setitem(active.ACTIVE, "view", view)
    w3 = ScaleUpWatch("s", timeout_s=900.0, clock=iter([0.0, 5.0, 11.0, 40.0, 72.0]).__next__)
    for i in range(5):
        w3.on_step_begin(i, _trials("PENDING"))
    assert len(printed) == 2 and "11 s of at most 900 s" in printed[0] and "72 s" in printed[1], printed
    # Tune pickles callbacks: the clock and the waiting state are not part of it.
    back = pickle.loads(pickle.dumps(w))
    assert (back.key, back.timeout_s, back.waiting_s, back._clock) == ("s", 30.0, 0.0, None)


# ------------------------------------------------------------------------------------------------
# Storage path and options.
def test_storage_path_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_storage_path("shared/ckpt") == str(tmp_path / "shared" / "ckpt")
    assert check_storage_path(f"file://{tmp_path}/x/") == f"file://{tmp_path}/x"
    assert check_storage_path("gs://bucket/dir/") == "gs://bucket/dir"
    with pytest.raises(ConfigError, match="option '--storage-path': empty"):
        check_storage_path("  ")
    assert restorable(tmp_path) is False  # no Tune experiment there


def test_plan_puts_tune_experiments_under_the_storage_path(tmp_path):
    from fedtune.tune.study.plan import plan_study

    opts = SweepOptions(algorithms=["fedavg"], dataset="rect4", rounds=1, num_samples=1, output=str(tmp_path),
                        name="s", storage_path="s3://lab/fedtune/")
    plan = plan_study(opts)
    assert plan.tune_storage == "s3://lab/fedtune/s" and plan.tune_location("fedavg") == "s3://lab/fedtune/s/fedavg"
    default = plan_study(SweepOptions(algorithms=["fedavg"], dataset="rect4", rounds=1, num_samples=1,
                                      output=str(tmp_path), name="t"))
    assert default.tune_location("fedavg") == str(tmp_path / "t" / "tune" / "fedavg")


@pytest.mark.parametrize("field,value,flag", [("max_failures", -2, "--max-failures"),
                                              ("max_failures", 1.5, "--max-failures"),
                                              ("scale_up_timeout_s", 0, "--scale-up-timeout"),
                                              ("storage_path", "ftp://x/y", "--storage-path")])
def test_bad_scale_out_options_name_the_flag(field, value, flag):
    with pytest.raises(ConfigError, match=f"option '{flag}'"):
        SweepOptions(**{field: value}).validate()


def test_cli_flags_reach_the_options_and_resume_keeps_the_saved_ones():
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args

    args = build_parser().parse_args(["sweep", "--max-failures", "2", "--storage-path", "s3://b/d",
                                      "--scale-up-timeout", "60"])
    opts = options_from_args(args)
    assert (opts.max_failures, opts.storage_path, opts.scale_up_timeout_s) == (2, "s3://b/d", 60.0)
    assert options_from_args(build_parser().parse_args(["sweep"])).max_failures == 0
    with pytest.raises(ConfigError, match="--max-failures"):
        options_from_args(build_parser().parse_args(["sweep", "--resume", "--max-failures", "1"]))


# ------------------------------------------------------------------------------------------------
# Restarts in the Arrow store.
def test_restarted_trial_rows_record_their_attempt_and_the_trial_its_restarts(tmp_path):
    from fedtune.tune.trial.callback import ArrowCallback
    from fedtune.tune.trial.trainable import trial_run_config

    cfg = {"dataset": "rect4", "rounds": 3}
    run_cfg = trial_run_config(cfg)
    trial = SimpleNamespace(trial_id="tune_a", config=cfg, error_file=None, get_error=lambda: None, num_failures=0)
    cb = ArrowCallback(str(tmp_path), "s")

    def report(rnd):
        row = {"trial_id": run_cfg.trial_id(), "algorithm": "fedavg", "round": rnd, "status": "ok",
               "train_loss": 1.0, "val_acc": 0.5, "target_acc": 0.3}
        cb.on_trial_result(0, [], trial, {"fedtune_row": row})

    report(1)
    report(2)
    trial.num_failures = 1  # the node died during round 3; Tune restored the round-2 checkpoint
    report(3)
    cb.on_trial_complete(0, [], trial)
    rows = load(tmp_path / "s").to_pylist()
    assert [(r["round"], r["attempt"]) for r in rows] == [(1, 0), (2, 0), (3, 1)]
    (summary,) = load(tmp_path / "s", "trials").to_pylist()
    assert (summary["status"], summary["restarts"]) == ("completed", 1)
    # A callback pickled by an older fedtune (no _restarts) still works after unpickling.
    state = pickle.loads(pickle.dumps(cb)).__dict__
    state.pop("_restarts")
    old = ArrowCallback.__new__(ArrowCallback)
    old.__setstate__(state)
    assert old._restarts == {}
