"""Every contract check of a component, of a plugin module's components, and the assertion for
your own pytest suite.

Which checks run for which kind of component (each one row of results, in :data:`CHECKS` order):

=================  =====================================================================================
client method      hyperparameters, one-line errors, composition, finite first step, determinism,
                   checkpoint and resume, keeps_client_state, ray = local (``ray=True``)
server rule        the same but keeps_client_state
server optimizer   the same but keeps_client_state
algorithm          preset parts; each form it runs in: finite first step, determinism, checkpoint and
                   resume, ray = local (a form another component's checks ran already is not run again)
dataset            not checked here (a run checks a plugin's dataset when it builds it: ``fedtune
                   partition --dataset NAME``)
=================  =====================================================================================

A component's runs are its *form*: a client method under FedAvg (its own algorithm, when it has one
of its name), a server rule over local SGD, a server optimiser on FedAvg
(:func:`~fedtune.contracts.tiny.component_form`).

>>> split_target("examples/plugins/feddecorr.py"), split_target("my_methods:Clipped"), split_target("fedtune:sgd")
(('examples/plugins/feddecorr.py', None), ('my_methods', 'Clipped'), ('fedtune', 'sgd'))
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from fedtune.algorithms import owner_of
from fedtune.algorithms.base import ClientMethodSpec, Preset, ServerOptimizerSpec, ServerRuleSpec
from fedtune.algorithms.presets import PRESETS
from fedtune.contracts.compose import check_composition
from fedtune.contracts.declared import REGISTRIES, check_hparam, check_preset_parts, check_unused
from fedtune.contracts.result import (CHECKS, FIRST_STEP, HYPERPARAMETERS, ONE_LINE_ERRORS, CheckResult,
                                      exception_line, failed, merged, passed, skipped)
from fedtune.contracts.runs import check_client_state, check_form_runs, check_ray, ray_for_checks
from fedtune.contracts.tiny import Form, component_form, preset_forms
from fedtune.data.registry import DatasetSpec, dataset_owner
from fedtune.errors import clipped
from fedtune.errors import PluginError
from fedtune.plugins import components_of, load_plugins, parse_entry

__all__ = ["KINDS", "check_component", "check_components", "assert_component_ok", "check_plugin", "plugin_components",
           "split_target", "builtin_components"]

KINDS = ("client method", "server rule", "server optimizer", "algorithm", "dataset")
_SPEC_KINDS = ((ClientMethodSpec, "client method"), (ServerRuleSpec, "server rule"),
               (ServerOptimizerSpec, "server optimizer"))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _kinds_of(target: Any, kind: str | None) -> list[tuple[str, str]]:
    """The registered ``(kind, name)`` pairs ``target`` names: a name (every kind that has it, or
    ``kind``), a registered class, a declaration, a Preset or a DatasetSpec."""
    if isinstance(target, str):
        kinds = [kind] if kind is not None else list(KINDS)
        found = [(k, target) for k in kinds if owner_of(k, target) is not None or
                 (k == "dataset" and dataset_owner(target) is not None)]
        if not found:
            raise PluginError(f"no {kind or 'component'} is registered as {target!r}; register it first "
                              "(fedtune.register, --plugin MODULE)")
        return found
    spec = getattr(target, "spec", target) if isinstance(target, type) else target
    if isinstance(spec, Preset):
        return _kinds_of(spec.name, "algorithm")
    if isinstance(spec, DatasetSpec):
        return _kinds_of(spec.name, "dataset")
    for cls, k in _SPEC_KINDS:
        if isinstance(spec, cls):
            return _kinds_of(spec.name, k)
    raise PluginError(f"{clipped(repr(target), 80)} is not a fedtune component; allowed: a registered name, a "
                      "ClientMethod/ServerRule/ServerOptimizer subclass, its spec, a Preset or a DatasetSpec")


def _relabel(results: Iterable[CheckResult], who: str, prefix: str = "") -> list[CheckResult]:
    return [dataclasses.replace(r, component=who, reason=f"{prefix}{r.reason}") for r in results]


class _Session:
    """One ``fedtune check``: the forms whose runs were checked already, and the Ray runs reused."""

    def __init__(self, ray: bool) -> None:
        self.ray = ray
        self.forms: set[Form] = set()
        self.ray_runs: dict[int, Any] = {}

    def form_checks(self, who: str, form: Form, prefix: str = "") -> list[CheckResult]:
        if form in self.forms:
            return []
        self.forms.add(form)
        out = _relabel(check_form_runs(form), who, prefix)
        if self.ray:
            out += _relabel([check_ray(form, runs=self.ray_runs)], who, prefix)
        return out

    def close(self) -> None:
        for fr in self.ray_runs.values():
            fr.close()
        self.ray_runs.clear()


def _component_checks(kind: str, name: str, session: _Session) -> list[CheckResult]:
    who = f"{kind} {name}"
    if kind == "dataset":
        return [skipped(who, "dataset", f"a run checks it when it builds it (fedtune partition --dataset {name})")]
    if kind == "algorithm":
        forms = preset_forms([name])
        out = [check_preset_parts(name)]
        for form in forms:
            out += session.form_checks(who, form, f"{form.setting}: " if len(forms) > 1 else "")
        return out
    spec = REGISTRIES[kind][0].spec(name)
    names = [h.name for h in spec.hparams]
    if names:
        out = [merged(who, HYPERPARAMETERS, [check_hparam(h, (kind, name)) for h in names], "hyperparameters"),
               merged(who, ONE_LINE_ERRORS, [check_unused(h) for h in names], "hyperparameters")]
    else:
        out = [passed(who, HYPERPARAMETERS, "declares none"), passed(who, ONE_LINE_ERRORS, "no hyperparameter to refuse")]
    out.append(check_composition(kind, name))
    form = component_form(kind, name)
    if form is not None:
        out += session.form_checks(who, form)
    else:
        with_what = {"client method": "server rule fedavg", "server rule": "client method sgd"}[kind]
        out.append(failed(who, FIRST_STEP, f"it runs in no setting with {with_what}",
                          "declare the settings it runs in (supervised, needs_target_client, ...)"))
    if kind == "client method":
        out.append(check_client_state(name))
    return out


def check_components(components: Iterable[tuple[str, str]], *, ray: bool = False,
                     progress: Callable[[str], Any] | None = None) -> list[CheckResult]:
    """Every check of each ``(kind, name)`` (the module docstring's table), in order; ``progress``
    is called with each component before its checks run."""
    session = _Session(ray)
    out: list[CheckResult] = []
    with ray_for_checks() if ray else contextlib.nullcontext():
        try:
            for kind, name in components:
                if progress is not None:
                    progress(f"{kind} {name}")
                try:
                    found = _component_checks(kind, name, session)
                except Exception as exc:  # noqa: BLE001 - a declaration the checks cannot even read
                    found = [failed(f"{kind} {name}", "checks", f"checking it raises {exception_line(exc)}",
                                    "fix the error where it was raised (the file and line above)")]
                out += sorted(found, key=lambda r: CHECKS.index(r.check) if r.check in CHECKS else len(CHECKS))
        finally:
            session.close()
    return out


def check_component(component: Any, kind: str | None = None, *, ray: bool = False) -> list[CheckResult]:
    """Run every contract check on a registered component and return the results (none raised):
    ``component`` is its name (every kind registered under it, or only ``kind``: ``client method``,
    ``server rule``, ``server optimizer``, ``algorithm``), or the class, declaration or Preset you
    registered. ``ray=True`` adds *ray = local* (it starts a local Ray when none is connected)."""
    return check_components(_kinds_of(component, kind), ray=ray)


def assert_component_ok(component: Any, kind: str | None = None, *, ray: bool = False) -> list[CheckResult]:
    """:func:`check_component`, raising AssertionError with one line per failed check (what failed
    and what to fix) when any fails; returns the results when none does (for pytest)."""
    results = check_component(component, kind, ray=ray)
    bad = [r for r in results if r.failed]
    if bad:
        raise AssertionError(f"{len(bad)} of {len(results)} contract checks failed:\n" + "\n".join(r.line() for r in bad))
    return results


def split_target(target: str) -> tuple[str, str | None]:
    """``(module, NAME or None)`` of ``fedtune check``'s ``MODULE[:NAME]``: a module name or a path
    to a ``.py`` file, then optionally a component's name (or the attribute that holds it)."""
    head, sep, tail = str(target).strip().rpartition(":")
    if sep and head and _NAME.fullmatch(tail) and not (len(head) == 1 and head.isalpha()):  # not C:\\...
        return head, tail
    return str(target).strip(), None


def builtin_components(name: str) -> list[tuple[str, str]]:
    """fedtune's own components named ``name`` (``fedtune check fedtune:NAME``), every kind."""
    found = [(k, name) for k in KINDS[:4] if owner_of(k, name) == "fedtune"]
    if not found:
        raise PluginError(f"fedtune has no built-in component {name!r}; allowed: a name `fedtune algorithms` lists")
    return found


def plugin_components(target: str) -> list[tuple[str, str]]:
    """The components ``fedtune check MODULE[:NAME]`` checks: every one the plugin ``MODULE``
    registers (imported as ``--plugin MODULE`` imports it), or those named ``NAME`` (a component's
    name, or the attribute holding it: its algorithm of the same name comes with it);
    ``fedtune:NAME`` names a built-in. Bad input is one :class:`~fedtune.errors.PluginError` line."""
    module, name = split_target(target)
    if module == "fedtune":
        if name is None:
            raise PluginError("fedtune check: name one built-in component, fedtune:NAME "
                              "(tests/contracts/test_contracts.py checks them all)")
        return builtin_components(name)
    load_plugins([module], source="fedtune check")
    found = components_of(module)
    if name is None:
        if not found:
            raise PluginError(f"fedtune check: plugin {module!r} registers no component; allowed: a module whose "
                              "import calls fedtune.register(...), or MODULE:NAME naming one")
        return found
    chosen = [c for c in found if c[1] == name]
    if not chosen:
        attr = getattr(sys.modules.get(parse_entry(module)[0]), name, None)
        spec = getattr(attr, "spec", attr)
        own = getattr(spec, "name", None)
        chosen = [c for c in found if c[1] == own]
        if not chosen and attr is not None and parse_entry(module)[2] is None:
            entry = f"{module}:{name}"
            load_plugins([entry], source="fedtune check")
            chosen = [c for c in components_of(entry) if c[1] == own]
    if not chosen:
        names = ", ".join(f"{k} {n}" for k, n in found) or "none"
        raise PluginError(f"fedtune check: plugin {module!r} registers no component {name!r}; it registers: {names}")
    return chosen


def check_plugin(target: str, *, ray: bool = False) -> list[CheckResult]:
    """:func:`check_components` of :func:`plugin_components` (``fedtune check MODULE[:NAME]``)."""
    return check_components(plugin_components(target), ray=ray)
