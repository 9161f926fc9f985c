"""The plugin core (fedtune.plugins, fedtune.entry_points, the registry's register_component): the three
ways in give one behaviour, a config carries the plugins its components come from, a bad plugin is one
line naming it, and a plugin module that is not installed where Ray's workers run reaches them through
Ray's runtime_env (and without it, fails there in one line naming it)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fedtune
from fedtune import plugins
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError, PluginError

ROOT = Path(__file__).resolve().parents[2]
TINY = {"backend": "local", "dataset": "rect4", "model": "mlp", "mlp_hidden": [8], "rounds": 2, "local_steps": 2,
        "batch_size": 8, "setting": "fl", "num_clients": 2}

CLIPPED = '''
import torch
from torch.nn import functional as F
import fedtune

CLIP = fedtune.HParam("{hp}", 1.0, "largest gradient norm", lo=0.0, lo_open=True)


class Clipped(fedtune.SGD):
    spec = fedtune.ClientMethodSpec("{name}", description="SGD with clipped gradients", hparams=(CLIP,))

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clip = CLIP.of(cfg)

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, F.cross_entropy(model(x), y), ctx.record_step,
                                                                 clip))

{register}
'''


def write_plugin(folder: Path, module: str, *, name: str = "clipped", hp: str = "clip_norm",
                 register: str = "fedtune.register(Clipped)") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(CLIPPED.format(name=name, hp=hp, register=register))
    return path


@pytest.fixture(autouse=True)
def isolated():
    with plugins.isolated():
        yield


def test_a_plugin_file_registers_its_method_and_an_algorithm_of_its_name(tmp_path):
    path = write_plugin(tmp_path / "p", "clipped_a")
    cfg = FederatedRunConfig.from_dict({**TINY, "plugins": [str(path)], "algorithm": "clipped", "clip_norm": 0.5,
                                        "output": str(tmp_path / "out")})
    assert (cfg.resolved.client_method_name, cfg.resolved.server_rule_name) == ("clipped", "fedavg")
    assert fedtune.CLIENT_METHODS.where("clipped") == "clipped_a:Clipped"
    assert cfg.plugins == [str(path)]
    assert cfg.params["clip_norm"] == 0.5
    result = fedtune.run(cfg, progress=False)
    assert result.status == "completed" and len(result.rows) == 2


def test_a_config_gains_the_module_of_a_component_registered_from_python_and_not_in_its_trial_id(tmp_path):
    write_plugin(tmp_path / "p", "clipped_b", register="")
    sys.path.insert(0, str(tmp_path / "p"))
    try:
        clipped_b = importlib.import_module("clipped_b")  # a user's module (written above)
        fedtune.register(clipped_b.Clipped)
        fedtune.register(clipped_b.Clipped)  # again: a no-op
        cfg = FederatedRunConfig.from_dict({**TINY, "algorithm": "clipped", "output": str(tmp_path)})
        assert cfg.plugins == [__name__]  # this module called register: workers import it again
        twin = FederatedRunConfig.from_dict({**TINY, "algorithm": "clipped", "output": str(tmp_path),
                                             "plugins": ["clipped_b"]})
        assert twin.trial_id() == cfg.trial_id()  # plugins never enter the trial id
    finally:
        sys.path.remove(str(tmp_path / "p"))
        sys.modules.pop("clipped_b", None)


def test_a_component_registered_from_main_runs_locally_and_is_refused_on_ray_in_one_line(tmp_path):
    class FromMain(fedtune.SGD):
        spec = fedtune.ClientMethodSpec("from-main", description="a notebook's")

    FromMain.__module__ = "__main__"  # as a notebook cell defines it, and registers it (below)
    exec("fedtune.register(FromMain)", {"fedtune": fedtune, "FromMain": FromMain, "__name__": "__main__"})
    local = FederatedRunConfig.from_dict({**TINY, "algorithm": "from-main", "output": str(tmp_path)})
    assert local.plugins == []
    with pytest.raises(ConfigError, match=r"^field 'backend': a component of this run is registered from __main__"):
        FederatedRunConfig.from_dict({**TINY, "algorithm": "from-main", "backend": "ray", "output": str(tmp_path)})


@pytest.mark.parametrize("body,match", [
    ("raise ValueError('boom')", r"plugin '.*bad_import\.py' does not import: ValueError: boom$"),
    ("import not_a_module_anywhere", r"does not import: ModuleNotFoundError: No module named 'not_a_module_anywhere'"),
])
def test_a_module_that_does_not_import_is_one_line_with_its_own_error(tmp_path, body, match):
    path = tmp_path / "bad_import.py"
    path.write_text(body + "\n")
    with pytest.raises(PluginError, match=match) as info:
        plugins.load_plugins([str(path)], source="--plugin")
    assert "\n" not in str(info.value)


def test_an_unknown_module_names_it_and_what_is_allowed():
    with pytest.raises(PluginError, match=r"^--plugin: plugin 'no_such_plugin_x' does not import: .*allowed: an "
                                          r"importable module, MODULE:NAME, or a path to a \.py file$"):
        plugins.load_plugins(["no_such_plugin_x"], source="--plugin")


@pytest.mark.parametrize("register,match", [
    ("class NoSpec(fedtune.SGD):\n    pass\nfedtune.register(NoSpec)", r"class nospec_mod\.NoSpec has no 'spec' declaration"),
    ("fedtune.register(42)", r"42 is not a fedtune component"),
    ("class Wrong:\n    spec = fedtune.ClientMethodSpec('wrong')\nfedtune.register(Wrong)",
     r"Wrong declares a client method .* but does not subclass ClientMethod"),
    ("class Sgd2(fedtune.SGD):\n    spec = fedtune.ClientMethodSpec('sgd')\nfedtune.register(Sgd2)",
     r"client method 'sgd' is fedtune's built-in \(fedtune\.algorithms\.client\.method:SGD\); allowed: a name of its own"),
    ("fedtune.register(fedtune.ClientMethodSpec('nowhere'))", r"client method 'nowhere' declares no place for its class"),
])
def test_a_bad_component_is_one_line_naming_the_plugin(tmp_path, register, match):
    path = tmp_path / "nospec_mod.py"
    path.write_text("import fedtune\n" + register + "\n")
    with pytest.raises(PluginError, match=match) as info:
        plugins.load_plugins([str(path)])
    assert "nospec_mod" in str(info.value) and "\n" not in str(info.value)


def test_a_name_another_plugin_has_is_refused_naming_both(tmp_path):
    plugins.load_plugins([str(write_plugin(tmp_path / "a", "first_clip"))])
    with pytest.raises(PluginError, match=r"plugin .*/second_clip\.py: client method 'clipped' is already registered "
                                          r"by plugin .*/first_clip\.py \(first_clip:Clipped\)"):
        plugins.load_plugins([str(write_plugin(tmp_path / "b", "second_clip"))])


def test_a_hyperparameter_declared_differently_elsewhere_is_refused(tmp_path):
    with pytest.raises(PluginError, match=r"hyperparameter 'prox_mu' is declared differently by client method prox"):
        plugins.load_plugins([str(write_plugin(tmp_path, "mu_clip", hp="prox_mu"))])


def test_a_hyperparameter_named_like_a_run_field_is_refused_when_a_config_is_built(tmp_path):
    plugins.load_plugins([str(write_plugin(tmp_path, "rounds_clip", hp="rounds"))])
    with pytest.raises(PluginError, match=r"hyperparameter 'rounds' has the name of a run field"):
        FederatedRunConfig.from_dict({**TINY, "output": str(tmp_path)})


def test_plugins_field_must_be_a_list_of_entries(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'plugins': expected a list"):
        FederatedRunConfig.from_dict({**TINY, "plugins": 3, "output": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"plugin entry '' is not allowed"):
        FederatedRunConfig.from_dict({**TINY, "plugins": [""], "output": str(tmp_path)})


# ------------------------------------------------------------------------------------------------ isolation
def test_isolated_forgets_what_the_block_registers_and_imports_but_keeps_a_module_imported_before_it(tmp_path):
    """``fedtune check fedtune.errors`` loads a module imported long before as a plugin; dropping it
    from ``sys.modules`` after the block made a second ``fedtune.errors``, whose ConfigError the
    ``except ConfigError`` of the modules imported before no longer caught."""
    import fedtune.errors as errors

    path = write_plugin(tmp_path / "p", "iso_clip")
    try:
        with plugins.isolated():
            plugins.load_plugins(["fedtune.errors", str(path)])
            assert "clipped" in fedtune.PRESETS and "iso_clip" in sys.modules
        assert "clipped" not in fedtune.PRESETS and "iso_clip" not in sys.modules  # imported afresh next time
        assert sys.modules["fedtune.errors"] is errors  # one ConfigError class for the whole process
    finally:
        sys.modules["fedtune.errors"] = errors


# ------------------------------------------------------------------------------------------------ entry points
class _EntryPoint:
    def __init__(self, name, value, obj=None, error=None):
        self.name, self.value, self._obj, self._error = name, value, obj, error
        self.dist = type("Dist", (), {"name": "somepkg", "version": "1.2"})()

    def load(self):
        if self._error is not None:
            raise self._error
        return self._obj


def test_entry_points_load_on_first_use_and_a_failing_one_is_named_while_the_others_load(tmp_path, monkeypatch):
    from fedtune import algorithms, entry_points

    sys.path.insert(0, str(tmp_path))
    write_plugin(tmp_path, "ep_clip", register="")
    ep_clip = importlib.import_module("ep_clip")

    good = _EntryPoint("clipped", "ep_clip:Clipped", obj=ep_clip.Clipped)
    broken = _EntryPoint("broken", "broken_pkg", error=ImportError("no module named broken_pkg"))
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [good, broken] if group == entry_points.GROUP
                        else [])
    entry_points.forget_entry_points()
    monkeypatch.setattr(algorithms, "_entry_points_seen", 0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert "clipped" in fedtune.CLIENT_METHODS  # the first use of a registry loads them
        messages = [str(w.message) for w in caught if issubclass(w.category, entry_points.PluginWarning)]
        assert messages == ["fedtune plugin entry point 'broken' (broken_pkg, from somepkg) failed to load and is "
                            "skipped: ImportError: no module named broken_pkg"]
        assert algorithms.owner_of("client method", "clipped") == "plugin entry point 'clipped' (somepkg)"
    finally:
        entry_points.forget_entry_points()
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ep_clip", None)


# ------------------------------------------------------------------------------------------------ records
def test_a_record_names_the_module_and_hashes_its_source_and_a_change_is_one_line(tmp_path):
    path = write_plugin(tmp_path, "rec_clip")
    plugins.load_plugins([str(path)])
    (record,) = plugins.plugin_records([str(path)])
    import hashlib

    expected = hashlib.sha256(b"rec_clip.py\0" + path.read_bytes() + b"\0").hexdigest()
    assert record == {"entry": str(path), "module": "rec_clip", "version": None, "sha256": expected}
    plugins.check_plugin_records([record], where="study 's'")
    path.write_text(path.read_text() + "# changed\n")
    with pytest.raises(PluginError, match=r"study 's' ran with plugin .* whose source has changed since"):
        plugins.check_plugin_records([record], where="study 's'")


def test_a_module_outside_site_packages_is_shipped_and_an_installed_one_is_not(tmp_path):
    path = write_plugin(tmp_path, "ship_clip")
    plugins.load_plugins([str(path)])
    assert plugins.runtime_env_for([str(path)]) == {"py_modules": [str(path)]}
    assert plugins.runtime_env_for(["numpy"]) is None
    assert plugins.plugin_worker_paths() == []  # loaded from its .py path: a local worker reads the same file


def test_a_module_named_plugin_puts_its_folder_on_a_local_rays_worker_path(tmp_path):
    write_plugin(tmp_path / "pkgs", "named_clip")
    sys.path.insert(0, str(tmp_path / "pkgs"))
    try:
        plugins.load_plugins(["named_clip"])
        assert plugins.plugin_worker_paths() == [str(tmp_path / "pkgs")]
        assert plugins.runtime_env_for(["named_clip"]) == {"py_modules": [str(tmp_path / "pkgs" / "named_clip.py")]}
    finally:
        sys.path.remove(str(tmp_path / "pkgs"))


# ------------------------------------------------------------------------------------------------ Ray's workers
RAY_SCRIPT = '''
import sys, json
sys.path.insert(0, {folder!r})  # the driver imports the plugin from here; Ray's workers cannot
import fedtune, fedtune.plugins
if {no_shipping}:
    import fedtune.runtime.cluster
    fedtune.runtime.cluster.plugin_worker_paths = lambda: []
from fedtune.config import FederatedRunConfig
from fedtune.errors import PluginError
base = {base!r}
rows = {{}}
for backend in ("local", "ray"):
    cfg = FederatedRunConfig.from_dict({{**base, "backend": backend, "name": backend}})
    try:
        rows[backend] = [r["train_loss"] for r in fedtune.run(cfg, progress=False).rows]
    except PluginError as exc:
        rows[backend] = "PluginError: " + str(exc)
print(json.dumps(rows))
'''


# ------------------------------------------------------------------------------------------------ everywhere
def test_a_report_of_a_plugins_study_reads_it_without_the_plugin(tmp_path):
    """`fedtune report` reads the results alone: a fresh process that cannot import the plugin names
    its components from the stored rows."""
    path = write_plugin(tmp_path / "p", "report_clip")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "fedtune", "run", "--plugin", str(path), "--algorithm", "clipped",
                          "--backend", "local", "--dataset", "rect4", "--rounds", "2", "--output", str(out),
                          "--name", "s", "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    path.unlink()  # the plugin is gone
    report = subprocess.run([sys.executable, "-m", "fedtune", "report", str(out / "s"), "--no-plots"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "clipped" in report.stdout
