"""In-run tuners as a declared component kind (issue 46 item 2): FedEx is one entry of
``IN_RUN_TUNERS``, declared in ``fedtune/algorithms/tuner_declarations.py`` with ``HParam`` s that
the config turns into run fields; the config imports no component module; the registry and the
coordinator name no tuner (a tuner registered at run time is built, fed and checkpointed through
the same protocol); FedEx's earlier spellings and every earlier trial id are kept."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest

from fedtune.algorithms import IN_RUN_TUNERS, in_run_tuner_spec
from fedtune.algorithms.base import HParam, InRunTunerSpec
from fedtune.algorithms.server.tuner import InRunTuner
from fedtune.algorithms.tuner_declarations import FEDEX_CONFIGS, FEDEX_KNOBS, FEDEX_SPEC
from fedtune.config import FederatedRunConfig, parse_set_options
from fedtune.errors import ConfigError
from fedtune.runtime.driver import FederatedRun

ROOT = Path(__file__).resolve().parents[2]
TINY = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "local_steps": 2,
        "batch_size": 8, "model": "mlp", "mlp_hidden": [8], "backend": "local", "rounds": 4}

# Trial ids computed by fedtune before FedEx became a declared component (main at 6b75b70, where
# the FedEx fields were written by hand in config.py): a study written then resumes with them.
EARLIER_IDS = [
    ({}, "fedavg-fd8adb0965"),
    ({"fedex_configs": 0}, "fedavg-fd8adb0965"),
    ({"fedex_configs": 3}, "fedavg-48171f6e5e"),
    ({"fedex_configs": 4, "fedex_eps": 0.3}, "fedavg-16254d72b0"),
    ({"fedex_configs": 8, "fedex_knobs": ["local_lr", "local_momentum"], "fedex_schedule": "adaptive",
      "fedex_baseline": 0.5, "fedex_diff": True, "fedex_cutoff": 0.1, "fedex_objective": "loss"}, "fedavg-69240f3364"),
    ({"algorithm": "fedprox", "fedex_configs": 3, "fedex_eps": 1.0, "fedex_knobs": ["local_lr", "prox_mu"]},
     "fedprox-aef7971a03"),
    ({"algorithm": "fedprox", "fedex_configs": 5, "fedex_knobs": ["prox_mu", "local_epochs"], "local_steps": None},
     "fedprox-7c6327d48b"),
    ({"algorithm": "fedomg", "fedex_configs": 2, "fedex_eps": 0.0, "fedex_knobs": ["local_lr"]}, "fedomg-f0744cd0a6"),
    ({"fedex_configs": "6", "fedex_eps": 1, "fedex_diff": "true"}, "fedavg-d6340efbeb"),  # as --set writes them
]


@pytest.mark.parametrize("values, trial_id", EARLIER_IDS, ids=[t for _, t in EARLIER_IDS])
def test_fedex_on_and_off_runs_keep_their_earlier_trial_ids(values, trial_id):
    assert FederatedRunConfig.from_dict({**TINY, **values}).trial_id() == trial_id


def test_a_yaml_file_and_set_with_the_earlier_fedex_spellings_read_as_before(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: fedprox\ndataset: rect4\nsetting: fl\nrounds: 3\nfedex_configs: 4\nfedex_eps: 0.3\n"
                    "fedex_knobs: [local_lr, prox_mu]\nfedex_schedule: auto\nfedex_baseline: 0.25\n"
                    "fedex_diff: true\nfedex_cutoff: 0.5\nfedex_objective: loss\n")
    cfg = FederatedRunConfig.from_yaml(path)
    assert (cfg.fedex_configs, cfg.fedex_eps, cfg.fedex_knobs, cfg.fedex_diff) == (4, 0.3, ["local_lr", "prox_mu"], True)
    assert "fedex_eps" not in cfg.params and cfg.to_dict()["fedex_eps"] == 0.3  # a run field, as before
    assert cfg.trial_id() == "fedprox-262286e934"  # the id fedtune gave this file before (main at 6b75b70)
    changed = FederatedRunConfig.from_yaml(path, parse_set_options(
        ["fedex_configs=6", "fedex_eps=0.1", "fedex_knobs=[prox_mu]", "fedex_diff=false"]))
    assert (changed.fedex_configs, changed.fedex_knobs, changed.fedex_diff) == (6, ["prox_mu"], False)
    assert changed.trial_id() == "fedprox-d20880a66a"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_the_config_imports_no_component_module():
    imported = _imports(ROOT / "fedtune" / "config.py")
    rooms = sorted(m for m in imported if m.startswith(("fedtune.algorithms.server", "fedtune.algorithms.client")))
    assert not rooms, rooms
    assert "fedtune.algorithms.tuner_declarations" in imported  # the declarations it makes the run fields from


def test_no_tuner_is_named_by_the_registry_or_the_runtime():
    for path in [ROOT / "fedtune" / "algorithms" / "__init__.py", *sorted((ROOT / "fedtune" / "runtime").rglob("*.py"))]:
        code = [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        names = [n.id for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Name)]
        assert not [c for c in code if "fedex" in c.lower() and "\n" not in c], path  # docstrings aside
        assert not [n for n in names if "fedex" in n.lower()], path


def test_fedex_is_the_registrys_one_in_run_tuner_and_its_fields_are_its_declarations():
    assert list(IN_RUN_TUNERS) == ["fedex"] and IN_RUN_TUNERS.spec("fedex") is FEDEX_SPEC
    assert IN_RUN_TUNERS["fedex"].__module__ == "fedtune.algorithms.server.fedex"
    defaults = FederatedRunConfig()
    for h in FEDEX_SPEC.hparams:  # each a run field with the declared default and bounds
        field = FederatedRunConfig.__dataclass_fields__[h.name]
        assert getattr(defaults, h.name) == (list(h.default) if h.kind == "names" else h.default), h.name
        assert field.metadata["bounds"] == h.bounds and field.metadata["help"] == h.help
        assert field.metadata["needs"] == (None if h is FEDEX_CONFIGS else ("fedex_configs", FEDEX_SPEC.off, FEDEX_SPEC.on))


@pytest.mark.parametrize("values, message", [  # each as fedtune said it before (main at 6b75b70)
    ({"fedex_configs": -1}, "field 'fedex_configs': -1 is out of range; allowed: >= 0 and <= 1000 (0: off)"),
    ({"fedex_configs": 2, "fedex_knobs": "local_lr"}, "field 'fedex_knobs': expected a list such as [64, 64], got "
                                                      "'local_lr'"),
    ({"fedex_configs": 2, "fedex_diff": "maybe"}, "field 'fedex_diff': expected true or false, got 'maybe'"),
])
def test_a_bad_fedex_value_is_the_same_one_line_as_before(values, message):
    with pytest.raises(ConfigError) as err:
        FederatedRunConfig.from_dict(values)
    assert str(err.value) == message


def test_a_tuners_hyperparameter_reads_its_run_field():
    from fedtune.algorithms.tuner_declarations import FEDEX_EPS

    cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 3, "fedex_eps": 0.25, "fedex_knobs": ["batch_size"]})
    assert (FEDEX_EPS.of(cfg), FEDEX_KNOBS.of(cfg), FEDEX_CONFIGS.of(cfg)) == (0.25, ["batch_size"], 3)
    assert FEDEX_EPS.of(FederatedRunConfig.from_dict(TINY)) == 0.5


def test_a_names_hyperparameter_checks_a_list_of_names():
    assert FEDEX_KNOBS.check(("local_lr", "prox_mu"), "in-run tuner fedex") == ["local_lr", "prox_mu"]
    for bad in ("local_lr", [1], None):
        with pytest.raises(ConfigError, match=r"^field 'fedex_knobs' \(x\): expected a list of names") as err:
            FEDEX_KNOBS.check(bad, "x")
        assert "\n" not in str(err.value)


def test_two_in_run_tuners_switched_on_at_once_are_one_line():
    other = InRunTunerSpec("other", "m:C", "another tuner", (HParam("other_arms", 0, "arms", kind="int", lo=0),),
                           title="Other")
    IN_RUN_TUNERS["other"] = other
    try:
        assert in_run_tuner_spec(types.SimpleNamespace(fedex_configs=3, other_arms=0)) is FEDEX_SPEC
        assert in_run_tuner_spec(types.SimpleNamespace(fedex_configs=0, other_arms=2)) is other
        assert in_run_tuner_spec(types.SimpleNamespace(fedex_configs=0, other_arms=0)) is None
        with pytest.raises(ConfigError) as err:
            in_run_tuner_spec(types.SimpleNamespace(fedex_configs=3, other_arms=2))
        assert str(err.value) == ("field 'other_arms': a run tunes with one in-run tuner, and fedex_configs 3 already "
                                  "turns on FedEx; allowed: fedex_configs 0 or other_arms 0")
    finally:
        del IN_RUN_TUNERS["other"]


class Recorder(InRunTuner):
    """A tuner that tunes nothing: it records what the coordinator hands it."""

    name = "recorder"
    spec = InRunTunerSpec("recorder", "", "records the coordinator's calls", (FEDEX_CONFIGS,), title="Recorder")

    @classmethod
    def from_config(cls, cfg):
        return cls(int(cfg.fedex_configs))

    def __init__(self, arms):
        self.arms, self.rounds, self.taken, self.seen = arms, 0, 0, []

    def payload(self, round, participants, num_clients):  # noqa: A002
        self.seen.append((round, list(participants)))
        return {"recorder.round": np.array([round])}

    def take(self, extras):
        self.taken += 1

    def end_round(self):
        self.rounds += 1
        return {"recorder_rounds": float(self.rounds), "recorder_taken": float(self.taken), "recorder_arms": self.arms}

    def state_dict(self):
        return {"rounds": self.rounds, "taken": self.taken}

    def load_state_dict(self, state):
        self.rounds, self.taken = int(state["rounds"]), int(state["taken"])


def test_the_coordinator_runs_any_registered_tuner_through_the_protocol():
    """FedEx taken out of the registry and another tuner put under its switch: the config runs that
    tuner's check (none: fedex_configs 1 validates), the coordinator builds, feeds, records and
    checkpoints it, and no FedEx hook or column appears."""
    del IN_RUN_TUNERS["fedex"]
    IN_RUN_TUNERS["recorder"] = Recorder
    try:
        cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 1})  # FedEx's own check would refuse 1
        assert cfg.resolved.client_hooks(cfg) == ()
        with FederatedRun(cfg) as fr:
            rows = [fr.step().metrics for _ in range(2)]
            state = fr.get_state()
        per_round = [r["num_participants"] for r in rows]
        assert [r["diag.recorder_rounds"] for r in rows] == [1.0, 2.0]
        assert [r["diag.recorder_taken"] for r in rows] == [per_round[0], per_round[0] + per_round[1]]
        assert {r["diag.recorder_arms"] for r in rows} == {1}
        assert not [k for r in rows for k in r if "fedex" in k]
        assert state["tuner"] == {"rounds": 2, "taken": sum(per_round)}
        with FederatedRun(cfg) as fr:  # the checkpoint's tuner state is loaded back
            fr.set_state(state)
            assert fr.step().metrics["diag.recorder_rounds"] == 3.0
    finally:
        del IN_RUN_TUNERS["recorder"]
        IN_RUN_TUNERS["fedex"] = FEDEX_SPEC
    assert list(IN_RUN_TUNERS) == ["fedex"]
    with pytest.raises(ConfigError, match="field 'fedex_configs': 1 configuration leaves FedEx nothing to choose"):
        FederatedRunConfig.from_dict({**TINY, "fedex_configs": 1})
