"""Composition contracts: any client method composes with any server rule and server optimiser, or
is refused before anything starts in one ConfigError line naming a field.

* :func:`check_pair`: a (client method, server rule) pair validates in exactly the settings its
  parts declare (:attr:`~fedtune.algorithms.Resolved.settings`) and is one line naming a field in
  the others;
* :func:`check_triple`: with a server optimiser, in the pair's first setting, it validates or is one
  line naming a field;
* :func:`check_trains`: where it validates, a tiny run of 2 rounds trains (status ok, finite losses);
* :func:`check_composition`: all three for one component against every registered component of the
  other kinds (every one: the tiny runs take milliseconds, so none is sampled).
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

from fedtune.algorithms import ALL_SETTINGS, CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, Resolved
from fedtune.config import FederatedRunConfig
from fedtune.contracts.result import (COMPOSITION, CheckResult, config_error_line, exception_line, failed, merged,
                                      passed, skipped)
from fedtune.contracts.tiny import preferred_setting, preset_of, tiny_config, validated
from fedtune.errors import ConfigError
from fedtune.runtime.driver import FederatedRun

__all__ = ["check_pair", "check_triple", "check_trains", "check_composition", "names_a_field"]

_FIELD = re.compile(r"\bfields? '[a-z_0-9]+'")
FIX_REFUSAL = "refuse the combination in the spec's check with one fedtune.ConfigError line naming the field"


def names_a_field(text: str) -> bool:
    """Whether an error names a field (``field 'x'``, ``fields 'a', 'b'``)."""
    return bool(_FIELD.search(text))


def _refusal(exc: BaseException) -> str | None:
    """Why ``exc`` is not a proper refusal (None: one ConfigError line naming a field)."""
    why = config_error_line(exc)
    if why is None and not names_a_field(str(exc)):
        why = f"refuses it as {str(exc)!r}, which names no field"
    return why


def check_pair(client: str, rule: str) -> CheckResult:
    """The pair in every setting: validates exactly where its parts run, else one line naming a field."""
    who = f"{client} + {rule}"
    algorithm = preset_of(client, rule)
    settings = Resolved(algorithm, client, rule).settings
    for setting in ALL_SETTINGS:
        try:
            cfg = validated({"algorithm": algorithm, "client_method": client, "server_rule": rule, "setting": setting})
        except Exception as exc:  # noqa: BLE001 - any failure but the one line is the finding
            why = _refusal(exc)
            if why is not None:
                return failed(who, COMPOSITION, f"in setting {setting}: {why}", FIX_REFUSAL)
            if setting in settings:
                return failed(who, COMPOSITION, f"refused in setting {setting}, which its parts declare: {exc}",
                              "declare only the settings it runs in (supervised, needs_target_client, ...)")
            continue
        if setting not in cfg.resolved.settings:
            return failed(who, COMPOSITION, f"validates in setting {setting}, which its parts do not declare",
                          "refuse the setting in the spec's check, or declare it")
    return passed(who, COMPOSITION, f"validates in {', '.join(settings) or 'no setting'}, refused in one line "
                                    "elsewhere")


def _triple_config(client: str, rule: str, optimizer: str) -> FederatedRunConfig:
    algorithm = preset_of(client, rule)
    settings = Resolved(algorithm, client, rule).settings
    setting = settings[0] if settings else None  # None: the dataset's default, which it does not run in
    return validated({"algorithm": algorithm, "client_method": client, "server_rule": rule,
                      "server_optimizer": optimizer, "setting": setting})


def check_triple(client: str, rule: str, optimizer: str) -> CheckResult:
    """The triple in the pair's first setting: validates (as itself) or is one line naming a field."""
    who = f"{client} + {rule} + {optimizer}"
    try:
        cfg = _triple_config(client, rule, optimizer)
    except Exception as exc:  # noqa: BLE001 - any failure but the one line is the finding
        why = _refusal(exc)
        return passed(who, COMPOSITION, f"refused in one line: {exc}") if why is None else \
            failed(who, COMPOSITION, why, FIX_REFUSAL)
    if cfg.setting not in cfg.resolved.settings or (cfg.resolved.client_method_name, cfg.resolved.server_rule_name,
                                                    cfg.server_optimizer) != (client, rule, optimizer):
        return failed(who, COMPOSITION, f"validates as {cfg.resolved.client_method_name} + "
                                        f"{cfg.resolved.server_rule_name} + {cfg.server_optimizer} in setting "
                                        f"{cfg.setting}", "keep the names and settings a config was given")
    return passed(who, COMPOSITION, f"validates in setting {cfg.setting}")


def check_trains(client: str, rule: str, optimizer: str = "sgd", out: str | Path | None = None, *,
                 n: int = 2) -> CheckResult:
    """A tiny run of fedavg with this client method, server rule and server optimiser, in the first
    setting it runs in: ``n`` rounds, each status ok with a finite training loss."""
    who = f"{client} + {rule}" + (f" + {optimizer}" if optimizer != "sgd" else "")
    setting = preferred_setting("fedavg", client, rule)
    if setting is None:
        return failed(who, COMPOSITION, "runs in no setting", "declare the settings it runs in")
    with tempfile.TemporaryDirectory(prefix="fedtune-check-") as tmp:
        try:
            cfg = tiny_config(out or tmp, "fedavg", setting, client_method=client, server_rule=rule,
                              server_optimizer=optimizer, rounds=n)
            with FederatedRun(cfg) as fr:
                results = [fr.step() for _ in range(n)]
        except Exception as exc:  # noqa: BLE001 - any failure of the run is the finding
            return failed(who, COMPOSITION, f"a tiny run in {setting} {_raised(exc)}", _fix(exc))
    for r in results:
        loss = r.metrics.get("train_loss")
        if r.status != "ok" or not isinstance(loss, float) or not math.isfinite(loss):
            return failed(who, COMPOSITION, f"a tiny run in {setting}: round {r.round} is {r.status} with train_loss "
                                            f"{loss!r}", "keep its steps finite on a tiny MLP (2 local steps)")
    return passed(who, COMPOSITION, f"trains in {setting}")


def _raised(exc: BaseException) -> str:
    return f"is refused: {exc}" if isinstance(exc, ConfigError) else f"raises {exception_line(exc)}"


def _fix(exc: BaseException) -> str:
    return ("a combination that validates must run: refuse it in the spec's check instead"
            if isinstance(exc, ConfigError) else "fix the error where it was raised (the file and line above)")


def check_composition(kind: str, name: str, out: str | Path | None = None) -> CheckResult:
    """One component against every registered component of the other kinds: each pair in every
    setting and each triple validates or is one line; where it validates, a tiny run trains (a
    client method with every server rule and every server optimiser under FedAvg; a server rule with
    every client method and every server optimiser over local SGD; a server optimiser with every
    server rule over local SGD)."""
    who = f"{kind} {name}"
    clients = [name] if kind == "client method" else list(CLIENT_METHODS)
    rules = [name] if kind == "server rule" else list(SERVER_RULES)
    optimizers = [name] if kind == "server optimizer" else list(SERVER_OPTIMIZERS)
    results: list[CheckResult] = []
    if kind != "server optimizer":
        results += [check_pair(c, r) for c in clients for r in rules]
    results += [check_triple(c, r, o) for c in clients for r in rules for o in optimizers]
    runs: list[tuple[str, str, str]] = []
    if kind == "client method":
        runs = [(name, r, "sgd") for r in rules] + [(name, "fedavg", o) for o in optimizers if o != "sgd"]
    elif kind == "server rule":
        runs = [(c, name, "sgd") for c in clients] + [("sgd", name, o) for o in optimizers if o != "sgd"]
    elif kind == "server optimizer":
        runs = [("sgd", r, name) for r in rules]
    for c, r, o in runs:
        if preferred_setting("fedavg", c, r) is None:
            results.append(skipped(f"{c} + {r}", COMPOSITION, "runs in no setting (refused in one line)"))
            continue
        if _validates(c, r, o):
            results.append(check_trains(c, r, o, out))
    return merged(who, COMPOSITION, results)


def _validates(client: str, rule: str, optimizer: str) -> bool:
    try:
        _triple_config(client, rule, optimizer)
    except Exception:  # noqa: BLE001 - a refusal is check_triple's to judge
        return False
    return True

