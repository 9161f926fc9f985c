"""search_spaces/ holds only files that override something; `fedtune spaces show` says for each
algorithm whether its space is derived or overridden (fedtune/spaces/show.py, issue 46 item 4)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.spaces.lookup import SPACES_DIR, load_space
from fedtune.spaces.model import strip_switches
from fedtune.spaces.show import overridden_names, space_kind
from fedtune.spaces.yaml_files import build_space
from fedtune.trial_ids import trial_id_of

FILES = sorted(SPACES_DIR.glob("*.yaml"))


def _space_part(space) -> tuple:
    """What a space samples and sets (everything but its description, source and origins)."""
    return (dict(space.constants), dict(space.switches), list(space.params.items()))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_file_of_search_spaces_changes_its_algorithms_derived_space(path):
    """A file that changes nothing (a description and comments over the derived space, as 19 of
    the 20 files were until issue 46) must not come back: the space is then the declarations'."""
    doc = yaml.safe_load(path.read_text())
    assert doc["algorithm"] == path.stem and doc["algorithm"] in PRESETS
    space = load_space(path.stem)
    derived = build_space({"algorithm": path.stem}, path.stem, None)
    assert _space_part(space) != _space_part(derived), f"{path.name} overrides nothing: delete it"
    assert overridden_names(space)
    assert space_kind(space).startswith(f"overridden by {path}")


def test_spaces_show_says_for_each_algorithm_derived_or_overridden_and_by_which_file(capsys):
    from fedtune.cli import main

    assert main(["spaces", "show"]) == 0
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in capsys.readouterr().out.splitlines() if line.count("│") == 3}
    assert set(rows) == set(PRESETS)
    files = {p.stem: p for p in FILES}
    for name, kind in rows.items():
        if name in files:
            assert kind.startswith(f"overridden by {files[name]} ("), (name, kind)
        else:
            assert kind == "derived (from the declarations; no file)", (name, kind)
    assert rows["fediir-omg"].endswith("fediir-omg.yaml (fediir_penalty)")
    assert main(["spaces", "show", "--yaml"]) == 2  # one line: --yaml prints one named space
    assert "option '--yaml' prints one space: name it" in capsys.readouterr().err


def test_a_file_that_changes_nothing_is_shown_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "fedprox.yaml").write_text("algorithm: fedprox\ndescription: mine\n")
    (tmp_path / "search_spaces" / "moon.yaml").write_text(
        "algorithm: moon\nserver_rule: fedomg\nparams:\n  moon_mu: {high: 5.0}\n")
    assert space_kind(load_space("fedprox")).endswith("fedprox.yaml (nothing but its description)")
    assert overridden_names(load_space("moon")) == ["server_rule", "moon_mu", "omg_kappa", "omg_solver",
                                                    "omg_rescale", "global_lr", "client_weighting"]


def _first_trials(tmp: Path, name: str, **options) -> dict[str, tuple[str, str]]:
    """Search key -> (trial id, config as JSON) of each search's first trial (its space's
    defaults) of the study ``options`` plan, on the study's own copies of its spaces."""
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study
    from fedtune.tune.study.study_start import snapshot_spaces

    opts = SweepOptions(output=str(tmp), name=name, report=False, **options)
    if not options:
        from fedtune.tune.study.default_study import apply_default_study

        opts = apply_default_study(opts)
    _, plan = snapshot_spaces(opts, plan_study(opts))
    out = {}
    for s in plan.searches:
        cfg = FederatedRunConfig.from_dict({**plan.fixed[s.key], **strip_switches(load_space(s.space).defaults())})
        out[s.key] = (trial_id_of(cfg), json.dumps({**cfg.to_dict(), "output": None}, sort_keys=True, default=str))
    return out


def test_deleting_a_file_that_changes_nothing_keeps_every_first_trials_config_and_id(tmp_path, monkeypatch):
    """The shipped studies' trial ids: the default sweep's first trials (and a --knobs all study of
    algorithms whose deleted files set nothing) get the same configurations and trial ids with a
    file that only describes the space (as the deleted ones did) as with the derived space alone."""
    monkeypatch.chdir(tmp_path)
    studies = {"default": {}, "all": {"algorithms": ["fediir", "fedsr", "fedgp"], "dataset": "rotated-digits",
                                      "overrides": {"model": "mlp", "local_steps": 2}}}
    after = {k: _first_trials(Path(tempfile.mkdtemp(dir=tmp_path)), k, **o) for k, o in studies.items()}
    (tmp_path / "search_spaces").mkdir()
    for name in ("fedavg", "fedprox", "fedomg", "fediir", "fedsr", "fedgp"):
        (tmp_path / "search_spaces" / f"{name}.yaml").write_text(f"algorithm: {name}\ndescription: the old file\n")
        assert space_kind(load_space(name)).endswith("(nothing but its description)")
    before = {k: _first_trials(Path(tempfile.mkdtemp(dir=tmp_path)), k, **o) for k, o in studies.items()}
    assert before == after
    assert len(after["default"]) == 9 and len(after["all"]) == 3
    assert dict(json.loads(after["all"]["fediir"][1])["params"])["client_weighting"] == "uniform"  # the preset's
