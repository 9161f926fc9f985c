"""fedtune's public face (``fedtune/__init__.py``) and the one-line errors of old spellings
(``fedtune/old_names.py``).

The face: ``import fedtune`` stays light, every name of ``fedtune.__all__`` resolves to the object
its one home module defines, docs/python-api.md documents each. Old spellings:
every name and module path in :data:`~fedtune.old_names.MOVED_NAMES` /
:data:`~fedtune.old_names.MOVED_MODULES` fails with one line naming a spelling that works, by
attribute and by import; names that never existed keep Python's own errors. That code inside
the package never imports through the face is tests/project/test_architecture.py's (it reads the source).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fedtune
from fedtune.old_names import MOVED_MODULES, MOVED_NAMES, OldNamesFinder, install_finder, moved_message

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "ray", "pyarrow", "pandas", "optuna", "matplotlib", "sklearn", "scipy")
LIGHT_NAMES = ("FederatedRunConfig", "ConfigError", "PRESETS", "CLIENT_METHODS", "SERVER_RULES", "SERVER_OPTIMIZERS",
               "list_datasets", "search_space")


def resolve(dotted: str) -> Any:
    """The object a dotted spelling names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


# ------------------------------------------------------------------------------------------ the face
def test_import_fedtune_is_light():
    """``import fedtune``, its listing and its light names (configuration, errors, registries)
    load no torch, Ray, pyarrow, pandas or Optuna; nor do the packages that keep old names' hooks."""
    code = ("import json, sys, fedtune, fedtune.results, fedtune.runtime, fedtune.data, fedtune.tune\n"
            f"names = dir(fedtune), fedtune.__all__, [getattr(fedtune, n) for n in {LIGHT_NAMES!r}]\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_public_name_resolves_to_the_object_its_home_defines():
    homes = fedtune._HOMES
    assert set(fedtune.__all__) == set(homes) | {"__version__"}
    assert set(fedtune.__all__) <= set(dir(fedtune))
    for name in homes:
        assert getattr(fedtune, name) is getattr(importlib.import_module(homes[name]), name), name
    assert fedtune.run.__module__ == "fedtune.runtime.driver" and fedtune.load.__module__ == "fedtune.results.store"
    assert isinstance(fedtune.__version__, str)


def test_from_fedtune_import_gives_the_same_objects():
    from fedtune import ArrowCallback, load, make_report, run  # the README's spelling

    from fedtune.reports.report import make_report as home_make_report
    from fedtune.results.store import load as home_load
    from fedtune.runtime.driver import run as home_run
    from fedtune.tune.trial.callback import ArrowCallback as HomeArrowCallback

    assert (run, load, make_report, ArrowCallback) == (home_run, home_load, home_make_report, HomeArrowCallback)


def test_docs_python_api_documents_every_public_name():
    page = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")  # the README's "Python API" before issue 46
    section = page.split("# Python API\n", 1)[1].split("\n## ", 1)[0]
    missing = [n for n in fedtune.__all__ if n != "__version__" and not re.search(rf"`{re.escape(n)}\b", section)]
    assert not missing, f"public names docs/python-api.md does not document: {missing}"


# ------------------------------------------------------------------------------------------ old spellings
def import_error(statement: str) -> ImportError:
    with pytest.raises(ImportError) as info:
        exec(statement, {})
    return info.value


def one_line(message: str) -> str:
    assert "\n" not in message and message.strip() == message, repr(message)
    return message


# The modules whose old names raise their line on attribute access too (a module __getattr__ that
# only raises it). A plain module's hook answers attribute access only: `from fedtune.tune.study.plan
# import DEFAULT_STUDY` is Python's "cannot import name" (Python turns the AttributeError of a
# module __getattr__ into that ImportError for a module that is not a package).
ATTRIBUTE_HOOKS = ("fedtune", "fedtune.results", "fedtune.runtime", "fedtune.data", "fedtune.tune", "fedtune.tune.study.plan",
                   "fedtune.algorithms")


@pytest.mark.parametrize("old", sorted(MOVED_NAMES))
def test_an_old_name_is_one_line_naming_a_spelling_that_works(old):
    new = MOVED_NAMES[old]
    package, _, name = old.rpartition(".")
    if new.startswith("fedtune.") and new.count(".") == 1:  # the public face: the very object its home defines
        assert new.split(".")[1] in fedtune.__all__
    resolve(new)  # the new spelling works
    if package in MOVED_MODULES:  # in a module that moved: its line names the module's home and this name's
        message = one_line(str(import_error(f"from {package} import {name}")))
        assert message == moved_message(package) and f"{name}: {new}" in message
        return
    module = importlib.import_module(package)
    if hasattr(module, "__path__"):  # a package: `from package import name` asks for the module package.name
        assert one_line(str(import_error(f"from {package} import {name}"))) == f"{old} moved: use {new}"
    if package in ATTRIBUTE_HOOKS:
        with pytest.raises(AttributeError) as info:
            getattr(module, name)
        assert one_line(str(info.value)) == f"{old} moved: use {new}"
        assert not hasattr(module, name)



@pytest.mark.parametrize("package", sorted({old.rpartition(".")[0] for old in MOVED_NAMES} - set(MOVED_MODULES)))
def test_every_module_with_old_names_has_the_attribute_hook(package):
    old = min(o for o in MOVED_NAMES if o.rpartition(".")[0] == package)
    with pytest.raises(AttributeError, match=re.escape(moved_message(old))):
        getattr(importlib.import_module(package), old.rpartition(".")[2])


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_a_moved_module_is_one_line_naming_its_new_home(old):
    new = MOVED_MODULES[old]
    message = moved_message(old)
    assert one_line(message).startswith(f"{old} moved: use {new}")
    importlib.import_module(new)
    parent, _, leaf = old.rpartition(".")
    assert str(import_error(f"import {old}")) == message
    assert str(import_error(f"from {old} import anything")) == message
    assert str(import_error(f"from {parent} import {leaf}")) == message
    with pytest.raises(AttributeError, match=re.escape(message)):
        getattr(importlib.import_module(parent), leaf)
    assert old not in sys.modules


def test_names_that_never_existed_keep_pythons_errors():
    import fedtune.results

    with pytest.raises(AttributeError, match=r"^module 'fedtune' has no attribute 'nothing_here'$"):
        fedtune.nothing_here  # noqa: B018
    with pytest.raises(AttributeError, match=r"^module 'fedtune.results' has no attribute 'nothing_here'$"):
        fedtune.results.nothing_here  # noqa: B018
    with pytest.raises(ModuleNotFoundError, match="No module named 'fedtune.results.nothing_here'"):
        importlib.import_module("fedtune.results.nothing_here")
    with pytest.raises(ImportError, match="cannot import name 'nothing_here'"):
        exec("from fedtune.results import nothing_here", {})
    assert importlib.util.find_spec("fedtune.results.nothing_here") is None
    # submodules still import through the packages' hooks
    exec("from fedtune.results import status, study_dir", {})


def test_the_finder_comes_after_pythons_and_is_installed_once():
    finders = [f for f in sys.meta_path if isinstance(f, OldNamesFinder)]
    assert len(finders) == 1
    install_finder()
    assert [f for f in sys.meta_path if getattr(f, "fedtune_old_names", False)] == finders
    assert sys.meta_path.index(finders[0]) > sys.meta_path.index(importlib.machinery.PathFinder)


def test_a_study_saved_before_a_module_moved_still_unpickles():
    import pickle

    from fedtune.spaces.model import Switch
    from fedtune.tune.study.moved_modules import old_module_names

    old = pickle.dumps(Switch, protocol=0).replace(b"fedtune.spaces.model", b"fedtune.tune.spaces_model")
    with old_module_names():
        assert pickle.loads(old) is Switch
    with pytest.raises(ImportError, match=r"^fedtune.tune.spaces_model moved: use fedtune.spaces.model$"):
        pickle.loads(old)


def test_restoring_a_study_imports_a_moved_module_only_when_a_pickle_asks_for_it():
    code = (
        "import pickle, sys\n"
        "from fedtune.tune.study.moved_modules import old_module_names\n"
        "with old_module_names():\n"
        "    before = {'fedtune.spaces.model', 'torch'} & set(sys.modules)\n"
        "    old = b'cfedtune.tune.spaces_model\\nSwitch\\np0\\n.'\n"
        "    cls = pickle.loads(old)\n"
        "    print(sorted(before), cls.__module__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "fedtune.spaces.model", "False"], out.stdout + out.stderr


# ------------------------------------------------------------------ fedtune.run takes a mapping too
RUN = {"dataset": "rect4", "setting": "fl", "num_clients": 2, "local_steps": 1, "batch_size": 8, "model": "mlp",
       "mlp_hidden": [4], "rounds": 2, "backend": "local", "name": "r"}


def test_run_builds_and_validates_a_mapping_as_a_config_file_is(tmp_path):
    from fedtune.config import FederatedRunConfig

    by_dict = fedtune.run({**RUN, "output": str(tmp_path / "a")}, progress=False)
    by_cfg = fedtune.run(FederatedRunConfig.from_dict({**RUN, "output": str(tmp_path / "b")}), progress=False)
    assert by_dict.status == "completed" and by_dict.trial_id == by_cfg.trial_id
    keys = ("round", "train_loss", "val_acc")
    assert [[r[k] for k in keys] for r in by_dict.rows] == [[r[k] for k in keys] for r in by_cfg.rows]


@pytest.mark.parametrize("cfg, words", [
    ("run.yaml", ["fedtune.run: expected a FederatedRunConfig or a mapping of field: value, got str 'run.yaml'",
                  "FederatedRunConfig.from_yaml(path)"]),
    (["rounds", 3], ["got list"]),
    ({**RUN, "rounds": 0}, ["field 'rounds': 0 is out of range; allowed: >= 1"]),
    ({**RUN, "roundz": 2}, ["fedtune.run: unknown field 'roundz'", "rounds"]),
])
def test_run_of_anything_else_is_one_line_before_any_folder_is_made(tmp_path, cfg, words):
    if isinstance(cfg, dict):
        cfg = {**cfg, "output": str(tmp_path / "out")}
    with pytest.raises(fedtune.ConfigError) as err:
        fedtune.run(cfg, progress=False)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert not (tmp_path / "out").exists()
