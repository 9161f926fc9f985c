"""Contract tests generated from the registry (issue 28): every preset, and every (client method x
server rule x server optimiser) combination the declarations allow, parametrised from
:mod:`fedtune.algorithms.declarations` alone. No list of methods is kept here: a component added
to the declarations is tested by every contract below without touching this file.

* a preset is registered parts, in the settings those parts run in;
* local backend: 2 + 2 rounds through a checkpoint on disk equal 4 straight rounds, and where a
  run carries state beyond the weights (client state, a server side, the server rule's state),
  dropping that state changes the continuation;
* a checkpoint of another preset is refused in one line;
* Ray backend: 1 and 2 client actors give the local backend's rounds bit for bit;
* every (client method, server rule) pair in every setting, and every triple with a server
  optimiser, either validates (then it runs in that setting) or is one ConfigError line naming a
  field;
* every client method trains under FedAvg, every server optimiser steps every server rule;
* every declared hyperparameter: values out of its bounds, of the wrong kind or not among its
  choices are one line naming the field and the allowed values;
* the README's table of algorithms is the registry.

The methods' equations are tested against independent references in their own files
(test_fedomg, test_fedsr, test_moon, test_fediir_fishr, test_scaffold_feddyn, test_fedga, ...).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedtune.algorithms import (ALL_SETTINGS, CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, Resolved, all_hparams,
                                resolve_names)
from fedtune.algorithms.base import HParam
from fedtune.algorithms.declarations import GFM_INTERVAL
from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime import driver
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.data.partition import sample_participants
from fedtune.runtime.driver import FederatedRun, build_plan
from fedtune.runtime.placement import keeps_client_state

# ================================================================== the tiny runs
# The setting a preset's form runs in, cheapest first: fl (4 clients, half of them sampled each
# round, so a client's state waits for it across rounds), then fda, ufdg, fdg.
PREFERRED = ("fl", "fda", "ufdg", "fdg")

# rect4's 2-D points and an MLP with one hidden layer of 8: the smallest run that trains.
TINY = {"num_clients": 4, "participation": 0.5, "local_steps": 2, "batch_size": 8, "model": "mlp",
        "mlp_hidden": [8], "eval_every": 2, "backend": "local"}

# Hyperparameter values that make a 2-step, 4-round run exercise its method: small widths, and
# what happens every few steps (an augmenter update, the end of a warm-up) inside the run. A value
# is set only where the run's components declare the name.
EXERCISE = {"simclr_proj_dim": 4, "fedsr_z_dim": 4, "gfm_interval": TINY["local_steps"],
            "fishr_anneal_iters": TINY["local_steps"], "fedadg_noise": 4, "fedadg_latent": 8,
            "fedadg_disc_width": 8}


def dataset_for(client_method: str) -> str:
    """rect4, or rotated-digits for a client method that needs images or augments them (one with an
    augmenter: it declares the augmenter's update interval)."""
    spec = CLIENT_METHODS.spec(client_method)
    return "rotated-digits" if spec.needs_images or GFM_INTERVAL in spec.hparams else "rect4"


def tiny_config(out: Path, algorithm: str, setting: str | None, *, client_method: str | None = None,
                server_rule: str | None = None, **kw: Any) -> FederatedRunConfig:
    """A tiny valid run of ``algorithm`` (and overrides) in ``setting``."""
    pair = resolve_names(algorithm, client_method, server_rule, setting)
    declared = {*Resolved(algorithm, *pair).hparam_specs(),
                *(h.name for h in SERVER_OPTIMIZERS.spec(kw.get("server_optimizer", "sgd")).hparams)}
    values: dict[str, Any] = {**TINY, "algorithm": algorithm, "setting": setting, "dataset": dataset_for(pair[0]),
                              "rounds": 4, "output": str(out),
                              **{k: v for k, v in EXERCISE.items() if k in declared}}
    if client_method is not None:
        values["client_method"] = client_method
    if server_rule is not None:
        values["server_rule"] = server_rule
    return FederatedRunConfig.from_dict({**values, **kw})


def preferred_setting(algorithm: str, client_method: str | None = None, server_rule: str | None = None) -> str | None:
    """The first of :data:`PREFERRED` the pair runs in (None: none)."""
    for setting in PREFERRED:
        if setting in Resolved(algorithm, *resolve_names(algorithm, client_method, server_rule, setting)).settings:
            return setting
    return None


@dataclass(frozen=True)
class Form:
    """One form of a preset: its pair in one setting (FedGaLA has two: gala in fl, gala-simclr in ufdg)."""

    algorithm: str
    client_method: str
    server_rule: str
    setting: str

    @property
    def id(self) -> str:
        return f"{self.algorithm}-{self.setting}"

    def config(self, out: Path, **kw: Any) -> FederatedRunConfig:
        return tiny_config(out, self.algorithm, self.setting, **kw)


def preset_forms() -> list[Form]:
    """Every preset, once per distinct pair it resolves to, each in its preferred setting."""
    forms = []
    for name in PRESETS:
        seen = set()
        for setting in PREFERRED:
            pair = resolve_names(name, setting=setting)
            if pair not in seen and setting in Resolved(name, *pair).settings:
                seen.add(pair)
                forms.append(Form(name, *pair, setting))
    return forms


FORMS = preset_forms()
FORM_IDS = [f.id for f in FORMS]


def metrics(rows: list[dict]) -> list[tuple]:
    """What a round computed: losses, accuracies and every diagnostic but timings (NaN as None)."""
    out = []
    for r in rows:
        keys = sorted(k for k in r if k in ("train_loss", "val_acc", "target_acc", "num_participants")
                      or (k.startswith("diag.") and not k.endswith("_s")))
        out.append(tuple((k, None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keys))
    return out


def rounds(fr: FederatedRun, n: int) -> list[dict]:
    return [fr.step().metrics for _ in range(n)]


def carried(state: dict[str, Any]) -> list[str]:
    """What a run's state carries from round to round beyond the weights."""
    parts = ["clients"] if any(state.get("clients", {}).values()) else []
    return parts + [part for part in ("side", "rule") if state.get(part)]


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


def names_a_field(text: str) -> None:
    assert re.search(r"\bfields? '[a-z_0-9]+'", text), text


# ================================================================== presets
def test_every_preset_has_at_least_one_form():
    assert {f.algorithm for f in FORMS} == set(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_is_registered_parts_declared_for_the_settings_they_run_in(name):
    p = PRESETS[name]
    assert p.client_method in CLIENT_METHODS and p.server_rule in SERVER_RULES
    resolved = Resolved(name, p.client_method, p.server_rule)
    assert resolved.settings == p.settings  # what the preset says = what its parts allow
    if p.unsupervised_client_method:
        assert not CLIENT_METHODS.spec(p.unsupervised_client_method).supervised
        assert Resolved(name, p.unsupervised_client_method, p.server_rule).settings == ("ufdg",)
    specs = resolved.hparam_specs()
    for key, value in p.defaults:  # its own defaults are its pair's hyperparameters, and valid
        assert key in specs and specs[key].check(value, name) == value, (name, key)
    assert set(p.own_shared) <= set(FederatedRunConfig.field_names())


@pytest.fixture(scope="module")
def checkpoints() -> dict[Form, dict[str, Any]]:
    """Each form's checkpoint after 2 rounds (written by the resume test, read back from disk)."""
    return {}


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_checkpoint_continues_exactly_as_an_uninterrupted_run(tmp_path, form, checkpoints):
    cfg = form.config(tmp_path)
    with FederatedRun(cfg) as fr:
        straight = rounds(fr, 4)
    with FederatedRun(cfg) as fr:
        first = rounds(fr, 2)
        write_checkpoint(tmp_path / "ckpt", fr.get_state())  # what a killed trial leaves on disk
    state = checkpoints[form] = read_checkpoint(tmp_path / "ckpt")
    assert np.asarray(state["weights"]).dtype == np.float32
    # a client method with a server side checkpoints it; one without has none
    assert (state["side"] is not None) == (CLIENT_METHODS.spec(form.client_method).server_side is not None)
    with FederatedRun(cfg) as fr:
        fresh = fr.get_state()  # what a new run starts from
        fr.set_state(state)
        resumed = rounds(fr, 2)
    assert all(math.isfinite(m["train_loss"]) for m in straight)
    assert metrics(first + resumed) == metrics(straight)
    if carried(state):  # the state is what makes it continue: the weights alone do not
        with FederatedRun(cfg) as fr:
            fr.set_state({**state, "clients": {}, "side": fresh["side"], "rule": fresh["rule"]})
            weights_only = rounds(fr, 2)
        assert metrics(weights_only) != metrics(straight[2:]), carried(state)


@pytest.fixture(scope="module")
def fresh_runs(tmp_path_factory):
    """Started, never stepped local runs of each form (opened on first use, closed at the end)."""
    runs: dict[Form, FederatedRun] = {}

    def of(form: Form) -> FederatedRun:
        if form not in runs:
            fr = FederatedRun(form.config(tmp_path_factory.mktemp(form.id)))
            fr.start()
            runs[form] = fr
        return runs[form]

    yield of
    for fr in runs.values():
        fr.close()


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_checkpoint_of_another_preset_is_refused_in_one_line(tmp_path, form, checkpoints, fresh_runs):
    state = checkpoints.get(form)
    if state is None:  # run alone: a one-round checkpoint of its own
        with FederatedRun(form.config(tmp_path)) as fr:
            rounds(fr, 1)
            state = fr.get_state()
    assert state["identity"]["algorithm"] == form.algorithm and isinstance(state["identity"]["rule_keys"], list)
    own = fresh_runs(form).get_state()["identity"]
    other_keys = 0
    for other in FORMS:
        if other == form:
            continue
        fr = fresh_runs(other)
        with pytest.raises(ConfigError) as err:
            fr.set_state(state)
        text = one_line(err)
        assert f"algorithm {form.algorithm}" in text and f"algorithm {other.algorithm}" in text, text
        assert fr.round == 0  # nothing was loaded
        identity = fr.get_state()["identity"]
        if (identity["rule_keys"], identity["side_keys"]) != (own["rule_keys"], own["side_keys"]):
            other_keys += 1  # a checkpoint written before checkpoints named their run: its state's keys
            with pytest.raises(ConfigError) as err:
                fr.set_state({k: v for k, v in state.items() if k != "identity"})
            assert "state keys" in one_line(err)
            assert fr.round == 0
    assert other_keys, "every form's state keys differ from some other form's"
    if state["side"] is not None:  # its own server side's state is not optional
        with pytest.raises(ValueError) as err:
            fresh_runs(form).set_state({**state, "side": None})
        assert "server side" in one_line(err)
    with FederatedRun(form.config(tmp_path)) as fr:  # a run of its own form takes it
        fr.set_state(state)
        assert fr.round == state["round"] and fr.step().status == "ok"


@pytest.fixture(scope="module")
def ray_runs(ray_session):
    """One Ray run per actor count, re-configured in place for each form (no actor restarts)."""
    runs: dict[int, FederatedRun] = {}
    yield runs
    for fr in runs.values():
        fr.close()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_both_backends_and_any_actor_count_give_the_same_rounds(ray_runs, tmp_path, form):
    with FederatedRun(form.config(tmp_path, rounds=3, name="local")) as fr:
        expected = rounds(fr, 3)
    for actors in (1, 2):
        cfg = form.config(tmp_path, rounds=3, backend="ray", client_cpus=0.5, max_client_actors=actors,
                          name=f"ray{actors}")
        fr = ray_runs.get(actors)
        if fr is None:
            fr = ray_runs[actors] = FederatedRun(cfg)
            fr.start()
        else:
            fr.reconfigure(cfg)  # what Tune's reuse_actors does: the same rounds as a fresh run
        assert len(fr.client_handles()) == actors
        # two actors and sampled clients: a method without per-client state roams (each round's
        # clients dealt out afresh, fedtune.runtime.placement), one with it stays with its owners
        roaming = actors == 2 and not keeps_client_state(cfg)
        assert fr.describe()["client_placement"] == ("roaming" if roaming else "fixed")
        assert metrics(rounds(fr, 3)) == metrics(expected), actors


# ================================================================== every combination
PAIRS = [(c, r) for c in CLIENT_METHODS for r in SERVER_RULES]
TRIPLES = [(c, r, o) for c, r in PAIRS for o in SERVER_OPTIMIZERS]


def preset_of(client_method: str, server_rule: str) -> str:
    """The preset of this pair (its supervised or unsupervised form), else fedavg's with overrides."""
    for name, p in PRESETS.items():
        if server_rule == p.server_rule and client_method in (p.client_method, p.unsupervised_client_method):
            return name
    return "fedavg"


_datasets = functools.lru_cache(maxsize=None)(driver.get_dataset)


@pytest.fixture
def one_dataset_each(monkeypatch):
    """Each dataset built once for the module's validation checks (they read labels only)."""
    monkeypatch.setattr(driver, "get_dataset", _datasets)


def validated(values: dict[str, Any]) -> FederatedRunConfig:
    """A config as a run checks it before anything starts: its fields, then its data plan (on the
    dataset :func:`dataset_for` its client method)."""
    client = FederatedRunConfig.from_dict(values).resolved.client_method_name
    cfg = FederatedRunConfig.from_dict({"dataset": dataset_for(client), "num_clients": 4, "backend": "local",
                                        **values})
    build_plan(cfg)
    return cfg


@pytest.mark.parametrize("client,rule", PAIRS, ids=[f"{c}-{r}" for c, r in PAIRS])
def test_a_pair_runs_in_exactly_its_settings_or_is_one_line(one_dataset_each, client, rule):
    algorithm = preset_of(client, rule)
    settings = Resolved(algorithm, client, rule).settings
    for setting in ALL_SETTINGS:
        try:
            cfg = validated({"algorithm": algorithm, "client_method": client, "server_rule": rule, "setting": setting})
        except ConfigError as err:
            text = str(err)
            assert text and "\n" not in text, text
            names_a_field(text)
            assert setting not in settings, text  # refused exactly in the settings its parts do not run in
            continue
        assert setting in cfg.resolved.settings, (setting, cfg.resolved.settings)


@pytest.mark.parametrize("client,rule,optimizer", TRIPLES, ids=[f"{c}-{r}-{o}" for c, r, o in TRIPLES])
def test_a_triple_validates_or_is_one_line(one_dataset_each, client, rule, optimizer):
    algorithm = preset_of(client, rule)
    settings = Resolved(algorithm, client, rule).settings
    setting = settings[0] if settings else None  # None: the dataset's default, which it does not run in
    try:
        cfg = validated({"algorithm": algorithm, "client_method": client, "server_rule": rule,
                         "server_optimizer": optimizer, "setting": setting})
    except ConfigError as err:
        text = str(err)
        assert text and "\n" not in text, text
        names_a_field(text)
        return
    assert cfg.setting in cfg.resolved.settings
    assert cfg.resolved.client_method_name == client and cfg.resolved.server_rule_name == rule
    assert cfg.server_optimizer == optimizer


def finished(cfg: FederatedRunConfig, n: int = 2) -> list[dict]:
    with FederatedRun(cfg) as fr:
        results = [fr.step() for _ in range(n)]
    assert [r.status for r in results] == ["ok"] * n
    rows = [r.metrics for r in results]
    assert all(math.isfinite(m["train_loss"]) for m in rows), rows
    return rows


@pytest.mark.parametrize("client", list(CLIENT_METHODS))
def test_every_client_method_trains_under_fedavg(tmp_path, client):
    setting = preferred_setting("fedavg", client, "fedavg")
    assert setting is not None, f"client method {client} runs in no setting with fedavg"
    finished(tiny_config(tmp_path, "fedavg", setting, client_method=client, rounds=2))


STATE_CASES = [(c, {}) for c in CLIENT_METHODS] + [("fedsr", {"fedsr_prior": "local"})]


@pytest.mark.parametrize("client,params", STATE_CASES, ids=[c + "".join(f"-{v}" for v in p.values())
                                                            for c, p in STATE_CASES])
def test_a_client_method_keeps_client_state_exactly_when_it_declares_it(tmp_path, client, params):
    """The declaration decides whether a client may roam between actors (fedtune.runtime.placement):
    a method that keeps state undeclared would lose it on the next actor, one that declares it
    needlessly never roams. Four rounds of half the clients: every client trains."""
    setting = preferred_setting("fedavg", client, "fedavg")
    cfg = tiny_config(tmp_path, "fedavg", setting, client_method=client, rounds=4, params=params)
    with FederatedRun(cfg) as fr:
        trained = set()
        for r in range(1, 5):
            fr.step()
            trained |= set(sample_participants(fr.plan.num_clients, cfg.participation, cfg.seed, r).tolist())
        kept = {cid for cid, state in fr.get_state()["clients"].items() if state}
    assert trained == set(range(fr.plan.num_clients))
    if keeps_client_state(cfg):
        assert kept == trained, kept
    else:
        assert kept == set(), kept


@pytest.mark.parametrize("client", list(CLIENT_METHODS))
def test_fp16_is_refused_in_one_line_exactly_where_a_method_bypasses_the_gradient_scaler(client):
    values = {"algorithm": preset_of(client, "fedavg"), "client_method": client, "precision": "fp16", "client_gpus": 1}
    if CLIENT_METHODS.spec(client).scales_fp16_gradients:
        assert FederatedRunConfig.from_dict(values).precision == "fp16"
        return
    with pytest.raises(ConfigError) as err:
        FederatedRunConfig.from_dict(values)
    text = one_line(err)
    assert text.startswith("field 'precision'") and f"client method {client}" in text, text


RULE_OPTIMIZERS = [(r, o) for r in SERVER_RULES for o in SERVER_OPTIMIZERS]


@pytest.mark.parametrize("rule,optimizer", RULE_OPTIMIZERS, ids=[f"{r}-{o}" for r, o in RULE_OPTIMIZERS])
def test_every_server_optimizer_steps_every_server_rule(tmp_path, rule, optimizer):
    setting = preferred_setting("fedavg", "sgd", rule)
    assert setting is not None, f"server rule {rule} runs in no setting with sgd clients"
    finished(tiny_config(tmp_path, "fedavg", setting, server_rule=rule, server_optimizer=optimizer, rounds=2))


# ================================================================== hyperparameters
HPARAMS = all_hparams()


def owner_of(name: str) -> dict[str, str]:
    """The config overrides that bring in a component declaring ``name`` (the first declared)."""
    for key, registry in (("client_method", CLIENT_METHODS), ("server_rule", SERVER_RULES),
                          ("server_optimizer", SERVER_OPTIMIZERS)):
        for spec in registry.specs():
            if any(h.name == name for h in spec.hparams):
                return {key: spec.name}
    raise AssertionError(f"no component declares {name}")


def range_text(h: HParam) -> str:
    parts = []
    if h.lo is not None:
        parts.append(f"{'>' if h.lo_open else '>='} {h.lo:g}")
    if h.hi is not None:
        parts.append(f"{'<' if h.hi_open else '<='} {h.hi:g}")
    return " and ".join(parts)


def bad_values(h: HParam) -> list[tuple[Any, str]]:
    """Values ``h`` refuses, from its declaration, each with what its error must say is allowed."""
    if h.kind == "choice":
        allowed = "allowed: " + ", ".join(map(str, h.choices))
        return [("-".join(map(str, h.choices)), allowed), (1.5, allowed), (None, allowed)]
    if h.kind == "bool":
        return [("maybe", "expected true or false"), (1, "expected true or false"), ("true", "expected true or false")]
    number = {"float": "a number", "int": "an integer",
              "float_or_choice": "a number or one of " + ", ".join(map(str, h.choices))}[h.kind]
    out: list[tuple[Any, str]] = [("not-a-number", f"expected {number}"), (True, f"expected {number}"),
                                  ([1], f"expected {number}")]
    if h.kind == "int":
        out.append((h.default + 0.5, "expected an integer"))
    if h.lo is not None:
        out.append((h.lo if h.lo_open else h.lo - 1, f"out of range; allowed: {range_text(h)}"))
    if h.hi is not None:
        out.append((h.hi if h.hi_open else h.hi + 1, f"out of range; allowed: {range_text(h)}"))
    if h.kind != "int":
        out += [(float("nan"), "not a finite number"), (float("inf"), "not a finite number")]
    return out


def good_values(h: HParam) -> list[Any]:
    """Values ``h`` takes: its default, its choices, its closed bounds."""
    out = [h.default, *h.choices]
    if h.kind == "bool":
        out += [True, False]
    if h.lo is not None and not h.lo_open:
        out.append(h.lo)
    if h.hi is not None and not h.hi_open:
        out.append(h.hi)
    return out


@pytest.mark.parametrize("name", list(HPARAMS))
def test_a_bad_hyperparameter_value_is_one_line_naming_the_field_and_the_allowed_values(name):
    owners, h = HPARAMS[name]
    base = {"algorithm": "fedavg", **owner_of(name)}
    for value in good_values(h):
        cfg = FederatedRunConfig.from_dict({**base, name: value})
        assert cfg.params[name] == value and h.of(cfg) == value, (name, value)
    cases = bad_values(h)
    assert len(cases) >= 2
    for value, allowed in cases:
        with pytest.raises(ConfigError) as err:
            FederatedRunConfig.from_dict({**base, name: value})
        text = one_line(err)
        assert text.startswith(f"field '{name}' ({owners}): "), (value, text)
        assert allowed in text, (value, text)


@pytest.mark.parametrize("name", list(HPARAMS))
def test_a_hyperparameter_of_a_component_the_run_does_not_use_is_one_line(name):
    _, h = HPARAMS[name]
    unused = next(p for p in PRESETS if name not in Resolved(p, PRESETS[p].client_method,
                                                              PRESETS[p].server_rule).hparam_specs())
    with pytest.raises(ConfigError) as err:
        FederatedRunConfig.from_dict({"algorithm": unused, name: h.default})
    text = one_line(err)
    assert text.startswith(f"field '{name}' is a hyperparameter of ") and "does not use" in text, text


# ================================================================== the README's table
README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| algorithm | client method | server rule | settings | hyperparameters (default) |"


def table_rows() -> dict[str, list[str]]:
    lines = README.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        name = cells[0].strip("`")
        assert name not in rows, f"README lists {name} twice"
        rows[name] = cells
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_readme_table_lists_every_preset_with_its_parts_and_settings():
    rows = table_rows()
    assert sorted(rows) == sorted(PRESETS)  # every preset, and nothing else
    for name, (algo, client, rule, settings, _) in rows.items():
        p = PRESETS[name]
        want_client = [p.client_method] + ([p.unsupervised_client_method] if p.unsupervised_client_method else [])
        assert ticked(client) == want_client, name
        assert ticked(rule) == [p.server_rule], name
        want_settings = list(p.settings) + (["ufdg"] if p.unsupervised_client_method else [])
        assert [s.strip() for s in settings.split(",")] == want_settings, name


def test_each_readme_row_names_the_presets_own_hyperparameters_with_their_defaults():
    specs = {name: spec for name, (_, spec) in HPARAMS.items()}
    rows = table_rows()
    for name, cells in rows.items():
        text = cells[4]
        if text.startswith("as `"):  # "as `gfm` without `sam_rho`", "as `fedsr` and `fedomg`"
            parts = [t for t in ticked(text) if t in PRESETS]
            assert parts and all(t in rows for t in parts), (name, text)
            continue
        named = [t for t in ticked(text) if t in specs]
        p = PRESETS[name]  # the supervised pair's own hyperparameters (fedgala's ufdg SimCLR knobs: its row's note)
        own = {h.name for part in (CLIENT_METHODS.spec(p.client_method), SERVER_RULES.spec(p.server_rule))
               for h in part.hparams}
        assert own <= set(named), (name, own, named)
        for hp in named:
            default = dict(p.defaults).get(hp, specs[hp].default)  # a preset's own default comes first
            shown = re.search(rf"`{re.escape(hp)}` \(([^)]*)\)", text)
            assert shown is not None, (name, hp)
            first = shown.group(1).split(",")[0].split(" ")[0].strip("`")
            if specs[hp].kind in ("float", "int", "float_or_choice") and not isinstance(default, str):
                assert float(first) == float(default), (name, hp, first, default)
            else:
                assert first == str(default).lower() or first == str(default), (name, hp, first, default)
