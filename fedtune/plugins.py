"""Your own components in fedtune: client methods, server rules, server optimisers, algorithms
(presets) and datasets from outside the package, run, swept and checked like the built-ins.

Three ways in, one behaviour:

* ``fedtune.register(Clipped)`` from Python (a notebook, a script driving Ray Tune's ``Tuner``, or a
  plugin module's own body);
* ``--plugin MODULE`` on the command line, or ``plugins: [MODULE, ...]`` in a run or sweep YAML
  file: ``MODULE`` is a dotted module name or a path to a ``.py`` file, imported (it registers its
  components as it runs); ``MODULE:NAME`` registers that attribute (a component or a list of them);
* an installed package's entry points, group ``fedtune.plugins`` (:mod:`fedtune.entry_points`),
  loaded on the first use of a registry.

Every process that builds a component imports the same plugins. A run's config carries them in its
``plugins`` field: the ones the user named and, derived when the config is validated, where every
component from outside fedtune that the run uses comes from (:func:`plugins_of_run`).
:meth:`~fedtune.config.FederatedRunConfig.from_dict` and ``from_validated`` import them before
anything else, so the driver, Ray Tune's trial processes, the coordinator and the client actors
and a resumed driver all register the same components. A plugin module that is not installed
where Ray's workers run travels with Ray's own ``runtime_env`` (``py_modules``,
:func:`runtime_env_for`), which fedtune passes when it starts or joins Ray; no file is copied by
hand. A study records each plugin's module, version and source hash (:func:`plugin_records`), and
a resume checks them (:func:`check_plugin_records`).

A component defined in ``__main__`` (a notebook cell, the script itself) runs on the local backend;
Ray's workers cannot import ``__main__``, so a Ray run of it is refused in one line that says to
move it into a module file.

>>> from fedtune.plugins import parse_entry
>>> parse_entry("my_methods"), parse_entry("my_methods:Clipped"), parse_entry("plugins/clipped.py")
(('my_methods', None, None), ('my_methods', 'Clipped', None), ('clipped', None, 'plugins/clipped.py'))
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from fedtune import algorithms
from fedtune.algorithms import (CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, all_hparams, owner_of,
                                register_component)
from fedtune.algorithms.base import ClientMethodSpec, Preset, ServerRuleSpec
from fedtune.algorithms.presets import PRESETS
from fedtune.data import registry as datasets
from fedtune.data.registry import DatasetSpec, dataset_owner, register_dataset
from fedtune.errors import ConfigError, PluginError, clipped, shown

__all__ = ["PluginRecord", "register", "load_plugins", "parse_entry", "plugins_of_run", "loaded_plugin_entries",
           "components_of", "plugin_runtime_env", "plugin_worker_paths", "runtime_env_for", "plugin_records",
           "check_plugin_records", "check_run_field_names", "isolated", "MAIN_MODULE",
           "parse_model_factory", "model_factory_entry"]

MAIN_MODULE = "__main__"


@dataclass(frozen=True)
class PluginRecord:
    """What a study records of one plugin: the ``entry`` as given, the ``module`` it imports, the
    installed distribution's ``version`` (None for a module that is not installed) and the SHA-256
    of its source (the module's file, or every ``.py`` file of its top-level package)."""

    entry: str
    module: str
    version: str | None
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "module": self.module, "version": self.version, "sha256": self.sha256}


_lock = threading.RLock()
_loaded: dict[str, str] = {}  # entry -> the module it imported (this process)
_importing: list[str] = []  # the plugin entries being imported now (their register() calls are theirs)
_source_of: dict[tuple[str, str], str] = {}  # (kind, name) -> the plugin entry that registers it again elsewhere
_files: dict[str, str] = {}  # module name -> the .py file it was loaded from by path


def parse_entry(entry: str) -> tuple[str, str | None, str | None]:
    """``(module, attribute or None, file path or None)`` of a plugin entry: ``pkg.mod``,
    ``pkg.mod:Name`` or ``path/to/file.py`` (its module is the file's stem)."""
    text = str(entry).strip()
    if text.endswith(".py") or os.sep in text or "/" in text:
        return Path(text).stem, None, text
    module, _, attr = text.partition(":")
    return module, attr or None, None


# ------------------------------------------------------------------------------------------------ registering
def register(*components: Any) -> None:
    """Register components from outside fedtune, each a subclass of
    :class:`~fedtune.ClientMethod`, :class:`~fedtune.ServerRule` or
    :class:`~fedtune.ServerOptimizer` carrying its declaration as ``spec``, a declaration alone
    (its class imported from ``spec.where``), a :class:`~fedtune.Preset` or a
    :class:`~fedtune.DatasetSpec`. A client method or server rule that has no algorithm of its
    name gets one, so ``--algorithm NAME`` runs it: the method under FedAvg's weighted mean, or the
    rule over plain local SGD. Registering the same component again is a no-op; a bad one is one
    :class:`PluginError` naming it (a name taken by fedtune or another plugin, no declaration, a
    hyperparameter declared differently elsewhere).

    A component registered while a plugin module is imported belongs to that plugin; one registered
    from other code is found again by its class's module (``module:Class``) in every process."""
    caller = sys._getframe(1).f_globals.get("__name__", MAIN_MODULE)
    for component in components:
        entry = _entry_for(component, caller)
        owner = f"plugin {entry}" if entry else f"{caller} (python)"
        try:
            if isinstance(component, DatasetSpec):
                register_dataset(component, owner)
                kind, name = "dataset", component.name
            else:
                kind, name = register_component(component, owner)
        except ValueError as exc:  # ConfigError, DataError: already one line naming the plugin
            raise PluginError(str(exc)) from None
        with _lock:
            _source_of[(kind, name)] = entry or MAIN_MODULE
        if kind in ("client method", "server rule") and name not in PRESETS:
            _register_own_preset(kind, name, owner, entry)


def _entry_for(component: Any, caller: str) -> str | None:
    """Where ``component`` is registered from in another process: the plugin being imported, the
    module that called :func:`register`, or (called from ``__main__``) its class's module."""
    if _importing:
        return _importing[-1]
    if caller != MAIN_MODULE:
        return caller
    cls = component if isinstance(component, type) else None
    if cls is not None and cls.__module__ != MAIN_MODULE:
        return f"{cls.__module__}:{cls.__qualname__}"
    return None


def _register_own_preset(kind: str, name: str, owner: str, entry: str | None) -> None:
    """The algorithm ``name`` for a component that has none: the client method under FedAvg, or
    plain SGD under the server rule, in every setting its declarations allow."""
    if kind == "client method":
        spec: Any = CLIENT_METHODS.spec(name)
        pair = (name, "fedavg")
        settings = ("fdg", "fl", "fda") if spec.supervised else ("ufdg",)
    else:
        spec = SERVER_RULES.spec(name)
        pair = ("sgd", name)
        settings = ("fda",) if spec.needs_target_client else ("fdg", "fl") if spec.needs_supervised_client \
            else ("fdg", "fl", "fda")
    preset = Preset(name, pair[0], pair[1], settings, spec.description or f"{kind} {name} ({owner})")
    register_component(preset, owner)
    with _lock:
        _source_of[("algorithm", name)] = entry or MAIN_MODULE


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Every registry, and this module's record of plugins, as they were before the block: a test
    (fedtune's, or a plugin author's) registers components inside it and no later code sees them.

    >>> import fedtune
    >>> with isolated():
    ...     fedtune.register(fedtune.Preset("sgd-twice", "sgd", "fedavg", ("fl",), "a test's"))
    ...     "sgd-twice" in fedtune.PRESETS
    True
    >>> "sgd-twice" in fedtune.PRESETS
    False
    """
    registries = (algorithms.CLIENT_METHODS, algorithms.SERVER_RULES, algorithms.SERVER_SIDES,
                  algorithms.SERVER_OPTIMIZERS)
    saved = [(r, dict(r._specs), dict(r._classes)) for r in registries]
    dicts = (PRESETS, algorithms._OWNERS, datasets._PLUGIN_DATASETS, datasets._BY_NAME, _loaded, _source_of, _files)
    kept = [(d, dict(d)) for d in dicts]
    before = set(_loaded.values()) | set(_files)
    modules = dict(sys.modules)
    with _lock:
        try:
            yield
        finally:
            imported = (set(_loaded.values()) | set(_files)) - before
            for registry, specs, classes in saved:
                registry._specs.clear()
                registry._specs.update(specs)
                registry._classes.clear()
                registry._classes.update(classes)
            for d, old in kept:
                d.clear()
                d.update(old)
            for name in imported:  # plugin modules imported inside the block: imported afresh next time;
                if name in modules:  # one imported before it (``fedtune.errors`` named as a plugin) stays
                    sys.modules[name] = modules[name]
                else:
                    sys.modules.pop(name, None)


# ------------------------------------------------------------------------------------------------ loading
def load_plugins(entries: Iterable[str] | None, *, source: str = "plugins") -> list[str]:
    """Import every plugin entry of ``entries`` not imported yet in this process (each once), in
    order; returns the entries. A module that does not import is one :class:`PluginError` naming it,
    its own error and, where it fits, how to ship it to Ray's workers."""
    out: list[str] = []
    for entry in entries or ():
        if not isinstance(entry, str) or not entry.strip():
            raise PluginError(f"{source}: plugin entry {shown(entry, 80)} is not allowed; allowed: a module name "
                              "(pkg.mod), MODULE:NAME or a path to a .py file")
        entry = entry.strip()
        with _lock:
            if entry not in _loaded:
                _loaded[entry] = _import_entry(entry, source)
        out.append(entry)
    return out


def _import_entry(entry: str, source: str) -> str:
    module_name, attr, path = parse_entry(entry)
    _importing.append(entry)
    try:
        module = _import_module(module_name, path, entry, source)
        if attr is not None:
            if not hasattr(module, attr):
                raise PluginError(f"{source}: plugin {entry!r}: module {module_name!r} has no attribute {attr!r}")
            value = getattr(module, attr)
            items = value if isinstance(value, (list, tuple)) else (value,)
            _importing[-1] = entry  # their registrations belong to this entry
            register(*items)
    finally:
        _importing.pop()
    return module_name


def _import_module(name: str, path: str | None, entry: str, source: str) -> ModuleType:
    if name in sys.modules and (path is None or _files.get(name) == str(Path(path).resolve())):
        return sys.modules[name]
    try:
        if path is not None and Path(path).is_file():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[name] = module
            _files[name] = str(Path(path).resolve())
            try:
                spec.loader.exec_module(module)  # type: ignore[union-attr]
            except BaseException:
                sys.modules.pop(name, None)
                _files.pop(name, None)
                raise
            return module
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name.partition(".")[0] or os.getcwd() in sys.path:
                raise
            sys.path.append(os.getcwd())  # as `python -m` would find it: the directory it runs in
            return importlib.import_module(name)
    except PluginError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plugin's own error, in one line
        hint = ""
        node = _on_ray_worker()
        if isinstance(exc, ModuleNotFoundError) and exc.name == name.partition(".")[0]:
            hint = (f" (on Ray's node {node}): fedtune ships plugins that are not installed with the Ray it starts "
                    "or joins (runtime_env py_modules); with a Ray started by other code pass "
                    "ray.init(runtime_env=fedtune.plugin_runtime_env()), or install the module on every node") \
                if node else "; allowed: an importable module, MODULE:NAME, or a path to a .py file"
        raise PluginError(f"{source}: plugin {entry!r} does not import: {type(exc).__name__}: "
                          f"{clipped(str(exc), 200)}{hint}") from None


def _on_ray_worker() -> str | None:
    """The node address when this process is one of Ray's workers (an actor, a Tune trial), else None."""
    ray = sys.modules.get("ray")
    try:
        # lazy: keeps ray out of this module's import
        from ray._private.worker import WORKER_MODE, global_worker

        if ray is not None and ray.is_initialized() and global_worker.mode == WORKER_MODE:
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - a partial Ray import: not a worker we can name
        return None
    return None


# ------------------------------------------------------------------------------------------------ a run's plugins
class PluginRun(Protocol):
    """What :func:`plugins_of_run` reads of a run's configuration (a
    :class:`~fedtune.config.FederatedRunConfig`, a layer above this module): its plugin entries,
    its model and the components it uses."""

    plugins: list[str] | None
    model: str | None
    algorithm: str
    server_optimizer: str
    dataset: str

    @property
    def resolved(self) -> Any: ...  # fedtune.algorithms.Resolved


def plugins_of_run(cfg: PluginRun) -> list[str]:
    """The plugin entries every process of a run of ``cfg`` must import: ``cfg.plugins`` as the user
    gave them, then the module of the run's model factory (``model: MODULE:FUNCTION``), then where
    each component from outside fedtune that the run uses comes from (its algorithm, client method,
    server rule, the client method's server side, server optimiser, dataset). A component
    registered from ``__main__`` has no entry: :data:`MAIN_MODULE`."""
    out = list(cfg.plugins or [])
    factory = model_factory_entry(cfg.model)  # the module of ``model: MODULE:FUNCTION``, unless an entry imports it
    if factory is not None and parse_entry(factory)[0] not in {parse_entry(e)[0] for e in out}:
        out.append(factory)
    resolved = cfg.resolved
    used = [("algorithm", cfg.algorithm), ("client method", resolved.client_method_name),
            ("server rule", resolved.server_rule_name), ("server optimizer", cfg.server_optimizer),
            ("dataset", str(cfg.dataset).strip().lower().replace("_", "-"))]
    for kind, name in used:
        entry = _source_of.get((kind, name))
        if entry is None and _outside(kind, name):
            entry = MAIN_MODULE
        if entry is not None and entry not in out:
            out.append(entry)
    return out


def parse_model_factory(model: Any) -> tuple[str, str] | None:
    """``(plugin entry, function name)`` of a ``model`` that names a factory, ``MODULE:FUNCTION`` or
    ``path/to/file.py:FUNCTION``; None for a model named otherwise (cnn, mlp, a torchvision model).
    The entry is the module (or file) :func:`load_plugins` imports; a factory in ``__main__`` (a
    notebook) has :data:`MAIN_MODULE`.

    >>> parse_model_factory("mypkg.nets:build"), parse_model_factory("nets/small.py:make"), parse_model_factory("cnn")
    (('mypkg.nets', 'build'), ('nets/small.py', 'make'), None)
    """
    if not isinstance(model, str) or ":" not in model:
        return None
    entry, _, function = model.strip().rpartition(":")
    return entry.strip(), function.strip()


def model_factory_entry(model: Any) -> str | None:
    """The plugin entry of ``model``'s factory module (:func:`parse_model_factory`), None when
    ``model`` names no factory."""
    parsed = parse_model_factory(model)
    return parsed[0] if parsed is not None else None


def _outside(kind: str, name: str) -> bool:
    if kind == "dataset":
        return dataset_owner(name) is not None
    owner = owner_of(kind, name)
    return owner is not None and owner != "fedtune"


def check_run_field_names(field_names: Iterable[str]) -> None:
    """No plugin hyperparameter may share a run field's name (``--set NAME=`` would mean two things)."""
    fields = set(field_names)
    for name, (owners, _) in all_hparams().items():
        if name in fields:
            raise PluginError(f"{owners}: hyperparameter {name!r} has the name of a run field; allowed: a name "
                              f"no run field has (`fedtune fields` lists them)")


# ------------------------------------------------------------------------------------------------ shipping and records
def _module_root(module_name: str) -> tuple[Path, bool] | None:
    """The file or top-level package folder of a loaded plugin module, and whether it is installed
    (lives under site-packages or the standard library); None when it has no source file."""
    top = module_name.partition(".")[0]
    module = sys.modules.get(top)
    if module is None:
        return None
    if getattr(module, "__path__", None):
        root = Path(list(module.__path__)[0])
    elif getattr(module, "__file__", None):
        root = Path(module.__file__)  # type: ignore[arg-type]
    else:
        return None
    installed_dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    installed = any(Path(d) in root.resolve().parents for d in installed_dirs if d)
    return root, installed


def loaded_plugin_entries() -> list[str]:
    """Every plugin entry this process imported or registered from (the runs it starts may use any)."""
    with _lock:
        out = list(_loaded)
        out += [e for e in dict.fromkeys(_source_of.values()) if e not in out and e != MAIN_MODULE]
    return out


def components_of(entry: str) -> list[tuple[str, str]]:
    """The components ``(kind, name)`` registered from the module of plugin ``entry`` in this process
    (by any entry naming that module), in registration order; ``kind`` is ``client method``,
    ``server rule``, ``server optimizer``, ``algorithm`` (a preset, or the one a method or rule gets
    of its name) or ``dataset``. ``fedtune check`` checks them."""
    module = parse_entry(entry)[0]
    with _lock:
        return [key for key, source in _source_of.items() if source != MAIN_MODULE and parse_entry(source)[0] == module]


def plugin_runtime_env() -> dict[str, Any] | None:
    """Ray's ``runtime_env`` for a Ray you start yourself (``ray.init(runtime_env=...)``, before
    Ray Tune's ``Tuner``): every plugin of this process that is not installed, as ``py_modules``
    (:func:`runtime_env_for`); None when there is none. fedtune passes it itself when it joins a
    Ray cluster (``fedtune run``/``sweep`` with an address); a local Ray it starts gets the plugins'
    folders on its workers' path instead (:func:`plugin_worker_paths`)."""
    return runtime_env_for(loaded_plugin_entries())


def plugin_worker_paths() -> list[str]:
    """The folders a local Ray's workers need on their path to import this process's plugins: the
    folder holding each plugin module (or top-level package) that is not installed and is named by
    its module (one named by a ``.py`` path is loaded from that path, which a local worker can
    read). fedtune puts them in the ``PYTHONPATH`` of a local Ray it starts, which its workers
    inherit: no ``runtime_env`` (which costs every worker a fresh start, about 0.75 s here)."""
    paths: list[str] = []
    for entry in loaded_plugin_entries():
        module_name, _, path = parse_entry(entry)
        found = _module_root(module_name)
        if path is not None or found is None or found[1]:
            continue
        folder = str(found[0].parent)
        if folder not in paths:
            paths.append(folder)
    return paths


def runtime_env_for(entries: Iterable[str]) -> dict[str, Any] | None:
    """Ray's ``runtime_env`` that makes ``entries``' modules importable on every node: ``py_modules``
    with each plugin's file or top-level package that is not installed (a module under
    site-packages is expected to be installed on the nodes too); None when there is nothing to ship."""
    paths: list[str] = []
    for entry in entries:
        if entry == MAIN_MODULE:
            continue
        module_name = parse_entry(entry)[0]
        found = _module_root(module_name)
        if found is None or found[1]:
            continue
        if str(found[0]) not in paths:
            paths.append(str(found[0]))
    return {"py_modules": paths} if paths else None


def _source_sha256(root: Path) -> str:
    digest = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    for f in files:
        digest.update(str(f.relative_to(root.parent)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _version(module_name: str) -> str | None:
    for dist in packages_distributions().get(module_name.partition(".")[0], []):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def plugin_records(entries: Iterable[str]) -> list[dict[str, Any]]:
    """What a study records of each plugin of ``entries`` (loaded in this process): its module,
    version and source hash (:class:`PluginRecord`)."""
    out = []
    for entry in entries:
        module_name = parse_entry(entry)[0]
        found = _module_root(module_name) if entry != MAIN_MODULE else None
        sha = _source_sha256(found[0]) if found is not None else ""
        version = _version(module_name) if found is not None and found[1] else None  # an installed module's
        out.append(PluginRecord(entry, module_name, version, sha).to_dict())
    return out


def check_plugin_records(recorded: Iterable[dict[str, Any]], *, where: str = "the study") -> None:
    """Import the plugins ``where`` recorded and check each is the same code: a missing one or a
    changed one (another source hash) is one :class:`PluginError` naming it and what to do."""
    for record in recorded:
        entry = str(record.get("entry", ""))
        if entry == MAIN_MODULE:
            continue
        try:
            load_plugins([entry], source=where)
        except PluginError as exc:
            why = str(exc).split(" does not import: ", 1)[-1]
            raise PluginError(f"{where} ran with plugin {entry!r}, which does not import here ({why}); make it "
                              "importable again (the same code), or start a new study (--name)") from None
        now = plugin_records([entry])[0]
        if record.get("sha256") and now["sha256"] != record["sha256"]:
            raise PluginError(f"{where} ran with plugin {entry!r} (module {now['module']}, sha256 "
                              f"{str(record['sha256'])[:12]}), whose source has changed since (sha256 {now['sha256'][:12]}): "
                              "resume with the same code, or start a new study (--name)")
