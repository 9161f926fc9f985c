"""Contract tests generated from the registry (issue 28): every preset, and every (client method x
server rule x server optimiser) combination the declarations allow, parametrised from
:mod:`fedtune.algorithms.declarations` alone. No list of methods is kept here: a component added
to the declarations is tested by every contract below without touching this file.

The checks themselves are :mod:`fedtune.contracts`, the same functions ``fedtune check`` runs on a
plugin's components and :func:`fedtune.assert_component_ok` in a user's own suite (issue 45); each
returns a :class:`~fedtune.contracts.result.CheckResult` and this file asserts it passed, so a check
that breaks fails here:

* a preset is registered parts, in the settings those parts run in;
* local backend: each preset form's first 4 rounds are ok and finite, a second run gives the same
  rows, 2 + 2 rounds through a checkpoint on disk equal 4 straight rounds, and where a run carries
  state beyond the weights (client state, a server side, the server rule's state), dropping that
  state changes the continuation;
* a checkpoint of another preset is refused in one line (here: not a component check);
* Ray backend: 1 and 2 client actors give the local backend's rounds bit for bit;
* every (client method, server rule) pair in every setting, and every triple with a server
  optimiser, either validates (then it runs in that setting) or is one ConfigError line naming a
  field;
* every client method trains under FedAvg, every server optimiser steps every server rule;
* a client method keeps client state exactly when it declares it;
* fp16 is refused exactly where a method bypasses the gradient scaler (here: a declaration's effect);
* every declared hyperparameter: values out of its bounds, of the wrong kind or not among its
  choices are one line naming the field and the allowed values; a hyperparameter of a component the
  run does not use is one line;
* docs/algorithms.md's table of algorithms is the registry (here).

The methods' equations are tested against independent references in their own files
(test_fedomg, test_fedsr, test_moon, test_fediir_fishr, test_scaffold_feddyn, test_fedga, ...).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fedtune.algorithms import CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, all_hparams
from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.contracts.compose import check_pair, check_trains, check_triple
from fedtune.contracts.declared import check_hparam, check_preset_parts, check_unused
from fedtune.contracts.result import CheckResult
from fedtune.contracts.runs import check_client_state, check_form_runs
from fedtune.contracts.tiny import Form, preferred_setting, preset_forms, preset_of, rounds
from fedtune.errors import ConfigError
from fedtune.runtime.driver import FederatedRun

FORMS = preset_forms()
FORM_IDS = [f.id for f in FORMS]


def ok(*results: CheckResult) -> None:
    """Every result passed (the failures' lines as the message)."""
    bad = [r.line() for r in results if not r.passed]
    assert not bad, "\n".join(bad)


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


# ================================================================== presets
def test_every_preset_has_at_least_one_form():
    assert {f.algorithm for f in FORMS} == set(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_is_registered_parts_declared_for_the_settings_they_run_in(name):
    ok(check_preset_parts(name))


@pytest.fixture(scope="module")
def checkpoints() -> dict[Form, dict[str, Any]]:
    """Each form's checkpoint after 2 rounds (written by the resume test, read back from disk)."""
    return {}


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_form_trains_deterministically_and_a_checkpoint_continues_exactly(tmp_path, form, checkpoints):
    results = check_form_runs(form, tmp_path, keep=checkpoints)
    assert [r.check for r in results] == ["finite first step", "determinism", "checkpoint and resume"]
    ok(*results)
    assert form in checkpoints


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


# ================================================================== every combination
PAIRS = [(c, r) for c in CLIENT_METHODS for r in SERVER_RULES]
TRIPLES = [(c, r, o) for c, r in PAIRS for o in SERVER_OPTIMIZERS]


@pytest.mark.parametrize("client,rule", PAIRS, ids=[f"{c}-{r}" for c, r in PAIRS])
def test_a_pair_runs_in_exactly_its_settings_or_is_one_line(client, rule):
    ok(check_pair(client, rule))


@pytest.mark.parametrize("client,rule,optimizer", TRIPLES, ids=[f"{c}-{r}-{o}" for c, r, o in TRIPLES])
def test_a_triple_validates_or_is_one_line(client, rule, optimizer):
    ok(check_triple(client, rule, optimizer))


@pytest.mark.parametrize("client", list(CLIENT_METHODS))
def test_every_client_method_trains_under_fedavg(tmp_path, client):
    assert preferred_setting("fedavg", client, "fedavg") is not None, f"client method {client} runs in no setting"
    ok(check_trains(client, "fedavg", "sgd", tmp_path))


STATE_CASES = [(c, {}) for c in CLIENT_METHODS] + [("fedsr", {"fedsr_prior": "local"})]


@pytest.mark.parametrize("client,params", STATE_CASES, ids=[c + "".join(f"-{v}" for v in p.values())
                                                            for c, p in STATE_CASES])
def test_a_client_method_keeps_client_state_exactly_when_it_declares_it(tmp_path, client, params):
    """The declaration decides whether a client may roam between actors (fedtune.runtime.placement):
    a method that keeps state undeclared would lose it on the next actor, one that declares it
    needlessly never roams. Four rounds of half the clients: every client trains."""
    ok(check_client_state(client, tmp_path, params))


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
    assert preferred_setting("fedavg", "sgd", rule) is not None, f"server rule {rule} runs in no setting"
    ok(check_trains("sgd", rule, optimizer, tmp_path))


# ================================================================== hyperparameters
HPARAMS = all_hparams()


@pytest.mark.parametrize("name", list(HPARAMS))
def test_a_bad_hyperparameter_value_is_one_line_naming_the_field_and_the_allowed_values(name):
    ok(check_hparam(name))


@pytest.mark.parametrize("name", list(HPARAMS))
def test_a_hyperparameter_of_a_component_the_run_does_not_use_is_one_line(name):
    ok(check_unused(name))


# ================================================================== docs/algorithms.md's table
ALGORITHMS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"  # the table the README held before issue 46
HEADER = "| algorithm | client method | server rule | settings | hyperparameters (default) |"


def table_rows() -> dict[str, list[str]]:
    lines = ALGORITHMS_PAGE.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        name = cells[0].strip("`")
        assert name not in rows, f"docs/algorithms.md lists {name} twice"
        rows[name] = cells
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_algorithms_table_lists_every_preset_with_its_parts_and_settings():
    rows = table_rows()
    assert sorted(rows) == sorted(PRESETS)  # every preset, and nothing else
    for name, (algo, client, rule, settings, _) in rows.items():
        p = PRESETS[name]
        want_client = [p.client_method] + ([p.unsupervised_client_method] if p.unsupervised_client_method else [])
        assert ticked(client) == want_client, name
        assert ticked(rule) == [p.server_rule], name
        want_settings = list(p.settings) + (["ufdg"] if p.unsupervised_client_method else [])
        assert [s.strip() for s in settings.split(",")] == want_settings, name


def test_each_algorithms_table_row_names_the_presets_own_hyperparameters_with_their_defaults():
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
