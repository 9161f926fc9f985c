"""The plugin core (fedtune.plugins, fedtune.entry_points, the registry's register_component): the three
ways in give one behaviour, a config carries the plugins its components come from, a bad plugin is one
line naming it, and a plugin module that is not installed where Ray's workers run reaches them through
Ray's runtime_env (and without it, fails there in one line naming it).

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/plugins/test_plugins.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import fedtune
from fedtune import plugins

from tests.plugins.test_plugins import RAY_SCRIPT, ROOT, TINY, write_plugin
from tests.plugins.test_plugins import isolated  # noqa: F401 - autouse: what a test registers is gone after it


@pytest.mark.ray
@pytest.mark.parametrize("no_shipping", [False, True], ids=["shipped", "not-shipped"])
def test_a_module_not_installed_reaches_the_workers_of_a_local_ray(tmp_path, no_shipping):
    """The plugin's folder is on the driver's path only and the run starts elsewhere: the client and
    coordinator actors of the local Ray fedtune starts can import it only because fedtune puts its
    folder on their path. Without that, the run stops in one line naming the plugin and the node.
    (A cluster's nodes get it through Ray's runtime_env: tests/slow/cluster/test_cluster_local.py.)"""
    folder = tmp_path / "only_here"
    write_plugin(folder, "unshipped_clip")
    base = {**TINY, "plugins": ["unshipped_clip"], "algorithm": "clipped", "num_cpus": 2,
            "output": str(tmp_path / "out")}
    script = RAY_SCRIPT.format(folder=str(folder), no_shipping=no_shipping, base=base)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(rows["local"], list) and len(rows["local"]) == 2
    if no_shipping:
        assert rows["ray"].startswith("PluginError: ") and "'unshipped_clip' does not import" in rows["ray"]
        assert "on Ray's node" in rows["ray"] and "runtime_env" in rows["ray"] and "\n" not in rows["ray"]
    else:
        assert rows["ray"] == rows["local"]


# ------------------------------------------------------------------------------------------------ everywhere
@pytest.mark.ray
def test_the_tuner_api_runs_a_plugin_registered_before_fedtune_trainable(ray_session, tmp_path):
    """Ray Tune's own Tuner: the trainable carries the plugins registered before it was made, and each
    trial process imports them; the plugin's hyperparameter is searched from its declaration."""
    from ray import tune

    from fedtune.tune.trial.callback import ArrowCallback

    path = write_plugin(tmp_path / "p", "tuner_clip")
    plugins.load_plugins([str(path)])
    space = {**fedtune.search_space("clipped"), **TINY, "backend": "ray", "clip_norm": tune.loguniform(0.1, 10.0),
             "output": str(tmp_path / "out")}
    tuner = tune.Tuner(fedtune.fedtune_trainable(), param_space=space,
                       tune_config=tune.TuneConfig(num_samples=2, metric="val_acc", mode="max"),
                       run_config=tune.RunConfig(name="t", storage_path=str(tmp_path / "tune"), verbose=0,
                                                 callbacks=[ArrowCallback(str(tmp_path / "out"), "tuner")]))
    grid = tuner.fit()
    assert not grid.errors, grid.errors
    trials = fedtune.load(tmp_path / "out" / "tuner", "trials").to_pylist()
    assert [t["status"] for t in trials] == ["completed", "completed"]
    assert {t["client_method"] for t in trials} == {"clipped"} and len({t["hp.clip_norm"] for t in trials}) == 2


@pytest.mark.ray
def test_a_study_records_its_plugin_and_a_resume_with_changed_or_missing_code_is_one_line(tmp_path):
    path = write_plugin(tmp_path / "p", "resume_clip")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def sweep(*extra):
        return subprocess.run([sys.executable, "-m", "fedtune", "sweep", "--output", str(tmp_path / "out"),
                               "--name", "s", "--no-report", *extra], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    first = sweep("--plugin", str(path), "--algorithm", "clipped", "--num-samples", "1", "--rounds", "1",
                  "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--set", "local_steps=1")
    assert first.returncode == 0, first.stderr[-2000:]
    (record,) = json.loads((tmp_path / "out" / "s" / "study.json").read_text())["plugins"]
    assert (record["entry"], record["module"]) == (str(path), "resume_clip")
    path.write_text(path.read_text() + "# changed\n")
    changed = sweep("--resume")
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines()[-1].startswith(
        f"fedtune: error: study 's' ran with plugin '{path}' (module resume_clip, sha256 ")
    assert "whose source has changed since" in changed.stderr
    path.unlink()
    missing = sweep("--resume")
    assert missing.returncode == 2 and "which does not import here" in missing.stderr.strip().splitlines()[-1]
