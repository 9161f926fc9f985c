"""FedEx (Khodak et al. 2021; issue 31 item 3): the server's exponentiated-gradient step against a
float64 transcription of the authors' ``FedEx.step`` (mkhodak/FedEx, hyper.py), the configurations
as the authors perturb them, a client trains with the configuration drawn for it, ``fedex_eps: 0``
is the run without FedEx bit for bit, a checkpoint continues FedEx exactly, both backends agree,
it composes with every server rule, the trial row records the final distribution, bad input is one
line."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy.special import logsumexp

from fedtune.algorithms import CLIENT_METHODS, SERVER_RULES, resolve_names
from fedtune.algorithms.server.fedex import KnobRange, configurations, exponentiated_gradient_step, fedex_server
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results.store import load
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.driver import FederatedRun, build_plan, run

TINY = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "local_steps": 2,
        "batch_size": 8, "model": "mlp", "mlp_hidden": [8], "backend": "local", "rounds": 4}


# ------------------------------------------------------------------ the authors' step, transcribed
class AuthorsFedEx:
    """hyper.py's ``FedEx.__init__``/``step`` for a list of configurations (one grid dimension),
    fed the round's draws and scores instead of a server; float64, loops as written there."""

    def __init__(self, k, sched, baseline, diff, cutoff=0.0):
        self.eta0 = np.sqrt(2.0 * np.log(k))
        self.sched, self.baseline, self.diff, self.cutoff = sched, baseline, diff, cutoff
        self.z = np.full(k, -np.log(k))
        self.theta = np.exp(self.z)
        self.store = 0.0
        self.trace = {"global": [], "refine": []}
        self.stopped = False

    @staticmethod
    def discounted_mean(trace, factor):
        weight = factor ** np.flip(np.arange(len(trace)), axis=0)
        return np.inner(trace, weight) / weight.sum()

    def step(self, index, before, after, weight):
        before, after = np.array(before), np.array(after)
        weight = np.array(weight, dtype=np.float64) / sum(weight)
        if self.trace["refine"]:
            trace = np.array(self.trace["refine"])
            if self.diff:
                trace = trace - np.array(self.trace["global"])
            baseline = self.discounted_mean(trace, self.baseline)
        else:
            baseline = 0.0
        self.trace["global"].append(np.inner(before, weight))
        self.trace["refine"].append(np.inner(after, weight))
        grad = np.zeros(len(self.z))
        for idx, s, w in zip(index, after - before if self.diff else after, weight):
            grad[idx] += w * (s - baseline) / self.theta[idx]
        if self.sched == "adaptive":
            self.store += np.linalg.norm(grad, float("inf")) ** 2
            denom = np.sqrt(self.store)
        elif self.sched == "aggressive":
            denom = 1.0 if np.all(grad == 0.0) else np.linalg.norm(grad, float("inf"))
        elif self.sched == "auto":
            self.store += 1.0
            denom = np.sqrt(self.store)
        elif self.sched == "constant":
            denom = 1.0
        else:  # scale
            denom = 1.0 / np.sqrt(2.0 * np.log(len(grad)))
        self.z = self.z - self.eta0 / denom * grad
        self.z = self.z - logsumexp(self.z)
        self.theta = np.exp(self.z)
        p = self.theta[self.theta > 0]
        if -(p * np.log(p)).sum() < self.cutoff:
            self.stopped = True


@pytest.mark.parametrize("sched", ["aggressive", "adaptive", "auto", "constant", "scale"])
@pytest.mark.parametrize("baseline, diff", [(0.0, False), (0.5, False), (1.0, True)])
def test_the_server_step_is_the_authors_fedex_step(sched, baseline, diff):
    cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 5, "fedex_eps": 0.5, "fedex_schedule": sched,
                                        "fedex_baseline": baseline, "fedex_diff": diff})
    ours, ref = fedex_server(cfg), AuthorsFedEx(5, sched, baseline, diff)
    rng = np.random.default_rng(3)
    for rnd in range(1, 9):
        n = int(rng.integers(1, 6))
        index = rng.choice(5, size=n, p=ref.theta / ref.theta.sum()).tolist()  # drawn from θ, as FedEx draws
        before, after, weight = rng.uniform(0.2, 0.9, n), rng.uniform(0.1, 0.8, n), rng.integers(1, 40, n)
        for i in range(n):
            extras = {"fedex.index": np.array([index[i]]), "fedex.after": np.array([after[i]]),
                      "fedex.before": np.array([before[i] if diff else math.nan]),
                      "fedex.weight": np.array([float(weight[i])]), "rule.thing": np.ones(2)}
            ours.take(extras)
            assert set(extras) == {"rule.thing"}  # FedEx's extras never reach the server rule
        ours.end_round()
        ref.step(index, before if diff else np.zeros(n), after, weight)
        assert np.isfinite(ref.theta).all()
        np.testing.assert_allclose(ours.theta, ref.theta, rtol=1e-12, atol=1e-15)
    assert not np.allclose(ours.theta, 0.2)  # it moved


def test_the_step_moves_probability_to_the_configurations_that_score_lower():
    z = np.log(np.full(3, 1 / 3))
    z, _, eta, grad = exponentiated_gradient_step(z, [0, 1, 2], [0.2, 0.5, 0.8], [1, 1, 1], 0.5, "constant", 1.0, 0.0)
    theta = np.exp(z)
    assert theta[0] > 1 / 3 > theta[2] and math.isclose(theta.sum(), 1.0)
    # g_j = w (s - baseline) / theta_j with w = 1/3, theta_j = 1/3
    np.testing.assert_allclose(grad, [-0.3, 0.0, 0.3])


def test_the_cutoff_stops_the_distribution_and_every_client_then_draws_the_most_likely():
    cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 3, "fedex_cutoff": 1.09})
    server = fedex_server(cfg)
    server.payload(1, [0, 1], 4)
    for idx, s in ((0, 0.1), (1, 0.9), (2, 0.9)):
        server.take({"fedex.index": np.array([idx]), "fedex.after": np.array([s]), "fedex.before": np.array([math.nan]),
                     "fedex.weight": np.array([10.0])})
    server.end_round()
    assert server.stopped
    frozen = server.theta.copy()
    assignment = server.payload(2, [0, 1, 2, 3], 4)["fedex.assignment"]
    assert assignment.tolist() == [int(np.argmax(frozen))] * 4
    server.take({"fedex.index": np.array([2]), "fedex.after": np.array([0.0]), "fedex.before": np.array([math.nan]),
                 "fedex.weight": np.array([10.0])})
    server.end_round()
    assert np.array_equal(server.theta, frozen)


# ------------------------------------------------------------------ the configurations
def test_configurations_perturb_each_knob_within_eps_of_its_range_as_the_authors_do():
    ranges = [KnobRange("local_lr", "float", 1e-4, 1.0, log=True), KnobRange("local_momentum", "float", 0.0, 1.0),
              KnobRange("local_epochs", "int", 1, 5), KnobRange("batch_size", "int", 8, 128, log=True),
              KnobRange("weight_decay", "categorical", choices=(0.0, 1e-4, 5e-4))]
    base = [0.01, 0.5, 3, 32, 1e-4]
    c = configurations(base, ranges, 200, 0.25, seed=7)
    assert c[0].tolist() == base
    lr = np.log10(c[1:, 0])
    assert np.all(np.abs(lr - (-2)) <= 0.25 * 4 + 1e-12) and lr.min() < -2.5 and lr.max() > -1.5  # ±4ε decades
    assert np.all(np.abs(c[1:, 1] - 0.5) <= 0.25 + 1e-12)
    assert set(c[1:, 2]) == {2.0, 3.0, 4.0}  # ± ceil(4ε) = 1 epoch
    assert set(c[1:, 3]) == {16.0, 32.0, 64.0}  # log2 ± ceil(4ε) = 1
    assert set(c[1:, 4]) == {0.0, 1e-4, 5e-4}  # ± ceil(2ε) = 1 position
    assert np.array_equal(c, configurations(base, ranges, 200, 0.25, seed=7))
    assert not np.array_equal(c, configurations(base, ranges, 200, 0.25, seed=8))
    assert np.all(configurations(base, ranges, 4, 0.0, seed=7) == np.array(base))
    wide = configurations(base, ranges, 300, 1.0, seed=1)  # clipped to the ranges
    assert wide[:, 0].min() >= 1e-4 and wide[:, 0].max() <= 1.0 and set(wide[:, 2]) == {1.0, 2.0, 3.0, 4.0, 5.0}


# ------------------------------------------------------------------ runs
def _metrics(rows, fedex=True):
    keys = lambda r: sorted(k for k in r if k in ("train_loss", "val_acc", "target_acc", "num_participants")
                            or (k.startswith("diag.") and not k.endswith("_s") and (fedex or "fedex" not in k))
                            or (fedex and k == "fedex_json"))
    return [[(k, None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keys(r)] for r in rows]


def _rounds(cfg, n):
    with FederatedRun(cfg) as fr:
        return [fr.step().metrics for _ in range(n)]


def test_eps_zero_is_the_run_without_fedex_bit_for_bit():
    plain = FederatedRunConfig.from_dict({**TINY, "algorithm": "fedprox"})
    fedex = plain.replace(fedex_configs=3, fedex_eps=0.0, fedex_knobs=["local_lr", "prox_mu"])
    got, want = _rounds(fedex, 3), _rounds(plain, 3)
    assert _metrics(got, fedex=False) == _metrics(want)
    assert all(math.isfinite(r["diag.fedex_entropy"]) for r in got)
    moved = _rounds(plain.replace(fedex_configs=3, fedex_eps=1.0, fedex_knobs=["local_lr", "prox_mu"]), 3)
    assert _metrics(moved, fedex=False) != _metrics(want)  # other configurations train otherwise


def test_a_client_trains_with_the_configuration_drawn_for_it():
    from fedtune.runtime.worker import ClientWorker

    cfg = FederatedRunConfig.from_dict({**TINY, "algorithm": "fedprox", "fedex_configs": 3, "fedex_eps": 1.0,
                                        "fedex_knobs": ["local_lr", "prox_mu", "local_epochs"], "local_steps": None,
                                        "fedex_objective": "loss"})
    plan = build_plan(cfg)
    configs = fedex_server(cfg).configs
    client = plan.clients[1]
    fedex_worker = ClientWorker(cfg.to_dict(), [client])
    weights, _, _ = fedex_worker.initial_state()
    for j in (1, 2):
        assignment = np.full(plan.num_clients, -1)
        assignment[client.client_id] = j
        reply = fedex_worker.fit(weights, {"fedex.configs": configs, "fedex.assignment": assignment}, 1,
                                 [client.client_id])
        lr, mu, epochs = configs[j]
        plain = FederatedRunConfig.from_dict({**_fedex_off(cfg.to_dict()), "local_lr": lr,
                                              "params": {"prox_mu": mu}, "local_epochs": int(epochs)})
        plain_worker = ClientWorker(plain.to_dict(), [client])
        want = plain_worker.fit(weights, {}, 1, [client.client_id])
        assert np.array_equal(reply.states, want.states) and reply.steps == want.steps
        extras = reply.extras[0]
        assert int(extras["fedex.index"][0]) == j and extras["fedex.weight"][0] == sum(map(len, client.val.values()))
        # its score: the trained model's validation loss (fedex_objective: loss)
        plain_worker._load(want.states[0])
        loss, _ = _val_loss(plain_worker, client.client_id)
        assert extras["fedex.after"][0] == pytest.approx(loss, rel=1e-6)
    assert not np.array_equal(configs[1], configs[2])


def _fedex_off(values):
    """``values`` with FedEx off: ``fedex_configs`` 0 and FedEx's other fields left out (at their
    defaults; set while FedEx is off they are refused)."""
    return {**{k: v for k, v in values.items() if not k.startswith("fedex_")}, "fedex_configs": 0}


def _val_loss(worker, cid):
    from fedtune.runtime.common import evaluate

    result = evaluate(worker.model, worker.data[cid]["val"], worker.cfg.eval_batch_size, worker.precision,
                      worker.cfg.eval_batch_mib)
    return result.loss, result.acc


def test_a_checkpoint_continues_fedex_exactly(tmp_path):
    cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 4, "fedex_baseline": 0.5,
                                        "fedex_knobs": ["local_lr", "local_momentum"]})
    straight = _rounds(cfg, 4)
    with FederatedRun(cfg) as fr:
        first = [fr.step().metrics for _ in range(2)]
        write_checkpoint(tmp_path / "ckpt", fr.get_state())
    state = read_checkpoint(tmp_path / "ckpt")
    with FederatedRun(cfg) as fr:
        fr.set_state(state)
        resumed = [fr.step().metrics for _ in range(2)]
    assert _metrics(first + resumed) == _metrics(straight)
    with FederatedRun(cfg) as fr:  # without the tuner's state the continuation differs
        fresh = fr.get_state()["tuner"]
        fr.set_state({**state, "tuner": fresh})
        assert _metrics([fr.step().metrics for _ in range(2)]) != _metrics(straight[2:])
    off = FederatedRunConfig.from_dict(_fedex_off(cfg.to_dict()))
    for other, words in ((off, "in-run tuner"), (cfg.replace(fedex_eps=0.1),
                                                                           "FedEx configurations")):
        with FederatedRun(other) as fr:
            fresh = fr.get_state()
            with pytest.raises(ValueError, match=words):
                fr.set_state(state)
            after = fr.get_state()  # refused before anything was loaded
            assert np.array_equal(after["weights"], fresh["weights"]) and after.get("tuner", {}).keys() == \
                fresh.get("tuner", {}).keys() and np.array_equal(after.get("tuner", {}).get("z", 0), fresh.get("tuner", {}).get("z", 0))


@pytest.mark.ray
def test_both_backends_and_any_actor_count_give_the_same_fedex_rounds(ray_session, tmp_path):
    cfg = FederatedRunConfig.from_dict({**TINY, "rounds": 3, "fedex_configs": 3, "fedex_knobs": ["local_lr"]})
    expected = _metrics(_rounds(cfg, 3))
    for actors in (1, 2):
        got = _rounds(cfg.replace(backend="ray", client_cpus=0.5, max_client_actors=actors), 3)
        assert _metrics(got) == expected, actors


def _rule_forms():
    """One supervised, fedex-able form per server rule: its own preset's client method where that
    has no server side, else sgd, in the first setting the pair runs in."""
    from fedtune.algorithms import Resolved
    from fedtune.algorithms.presets import PRESETS

    forms = []
    for rule in SERVER_RULES:
        for setting in ("fl", "fda", "fdg"):
            preset = next((p for p in PRESETS.values() if p.server_rule == rule), None)
            algorithm = preset.name if preset is not None else "fedavg"
            client, _ = resolve_names(algorithm, None, rule, setting)
            spec = CLIENT_METHODS.spec(client)
            if not spec.supervised or spec.server_side is not None or spec.needs_images:
                client = "sgd"
            if setting in Resolved(algorithm, client, rule).settings:
                forms.append((algorithm, client, rule, setting))
                break
    return forms


@pytest.mark.parametrize("algorithm, client, rule, setting", _rule_forms(), ids=lambda v: str(v))
def test_fedex_composes_with_every_server_rule(tmp_path, algorithm, client, rule, setting):
    cfg = FederatedRunConfig.from_dict({**TINY, "algorithm": algorithm, "client_method": client, "server_rule": rule,
                                        "setting": setting, "rounds": 2, "fedex_configs": 3, "fedex_eps": 1.0})
    rows = _rounds(cfg, 2)
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    record = json.loads(rows[-1]["fedex_json"])
    assert record["knobs"] == ["local_lr"] and len(record["theta"]) == 3
    assert math.isclose(sum(record["theta"]), 1.0) and record["theta"] != [1 / 3] * 3


def test_the_trial_row_records_the_final_distribution(tmp_path):
    cfg = FederatedRunConfig.from_dict({**TINY, "rounds": 3, "fedex_configs": 3, "output": str(tmp_path),
                                        "name": "fx"})
    result = run(cfg, progress=False)
    rounds = sorted((r for r in load(tmp_path / "fx").to_pylist() if r["trial_id"] == result.trial_id),
                    key=lambda r: r["round"])
    (trial,) = load(tmp_path / "fx", "trials").to_pylist()
    assert trial["fedex_json"] == rounds[-1]["fedex_json"]
    record = json.loads(trial["fedex_json"])
    assert record["mle"] == {"local_lr": record["configs"][int(np.argmax(record["theta"]))][0]}
    assert cfg.trial_id() != cfg.replace(fedex_configs=0).trial_id()
    # unset, the FedEx fields leave every earlier trial id as it was
    plain = {**TINY, "rounds": 3, "output": str(tmp_path), "name": "fx"}
    assert FederatedRunConfig.from_dict({**plain, "fedex_eps": 0.5}).trial_id() == cfg.replace(fedex_configs=0).trial_id()


@pytest.mark.parametrize("values, words", [
    ({"fedex_configs": 1}, "field 'fedex_configs': 1 configuration leaves FedEx nothing to choose; allowed: 0 (off) or"),
    ({"fedex_configs": 3, "fedex_knobs": ["global_lr"]}, "field 'fedex_knobs': 'global_lr' is not a client knob FedEx "
                                                         "can tune here; allowed: batch_size, local_epochs, local_lr"),
    ({"fedex_configs": 3, "fedex_knobs": ["local_lr", "local_lr"]}, "field 'fedex_knobs': .* names a knob twice"),
    ({"algorithm": "feddyn", "fedex_configs": 3, "fedex_knobs": ["feddyn_alpha"]}, "field 'fedex_knobs': 'feddyn_alpha'"),
    ({"fedex_configs": 3, "val_fraction": 0.0}, "field 'fedex_configs': FedEx scores the clients on their validation"),
    ({"fedex_configs": 3, "algorithm": "simclr", "setting": "ufdg"}, "field 'fedex_configs': .*unsupervised"),
    ({"fedex_schedule": "fast"}, "field 'fedex_schedule': 'fast' is not allowed; allowed: aggressive, adaptive"),
    ({"fedex_baseline": 1.5}, "field 'fedex_baseline'"),
])
def test_bad_fedex_fields_are_one_line(values, words):
    with pytest.raises(ConfigError) as err:
        FederatedRunConfig.from_dict(values)
    text = str(err.value)
    assert "\n" not in text
    assert (re.search(words, text) if ".*" in words else words in text), text


# ------------------------------------------------------------------ reliability round 4: bounds, off, PBT
def _refused(values, words):
    with pytest.raises(ConfigError) as err:
        FederatedRunConfig.from_dict(values)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


def test_the_number_of_configurations_is_bounded_and_the_bound_builds_at_once():
    import time

    from fedtune.algorithms.tuner_declarations import FEDEX_MAX_CONFIGS

    t0 = time.perf_counter()
    _refused({**TINY, "fedex_configs": 10**9}, ["field 'fedex_configs': 1000000000 is out of range",
                                                 f"<= {FEDEX_MAX_CONFIGS}"])
    _refused({**TINY, "fedex_configs": FEDEX_MAX_CONFIGS + 1}, ["field 'fedex_configs'", "out of range"])
    assert time.perf_counter() - t0 < 5  # refused before anything is built (it hung with memory growing)
    cfg = FederatedRunConfig.from_dict({**TINY, "fedex_configs": FEDEX_MAX_CONFIGS,
                                        "fedex_knobs": ["local_lr", "local_momentum"]})
    t0 = time.perf_counter()
    server = fedex_server(cfg)
    assert server.configs.shape == (FEDEX_MAX_CONFIGS, 2) and time.perf_counter() - t0 < 5
    assert server.configs[0].tolist() == [cfg.local_lr, cfg.local_momentum]
    assert len(np.unique(server.configs[:, 0])) > FEDEX_MAX_CONFIGS // 2  # distinct perturbations, not copies


@pytest.mark.parametrize("eps", [1e308, float("inf"), 1.0000001, -0.1])
def test_eps_is_bounded_by_a_knobs_whole_range(eps):
    _refused({**TINY, "fedex_configs": 3, "fedex_eps": eps}, ["field 'fedex_eps'"])


def test_eps_one_reaches_every_value_of_a_knobs_range_from_the_runs_own():
    # from the range's lower end, eps 1 moves as far as its upper end (the authors' lr: log10 lr +- 4 eps
    # on [-4, 0]), so no larger eps can add a value: hence the bound
    r = KnobRange("local_lr", "float", 1e-4, 1.0, log=True)
    moved = configurations([1e-4], [r], 4000, 1.0, seed=0)[1:, 0]
    assert moved.max() > 0.9 and moved.min() == pytest.approx(1e-4)
    e = KnobRange("local_epochs", "int", 1, 5)
    assert set(configurations([1], [e], 400, 1.0, seed=0)[1:, 0]) == {1.0, 2.0, 3.0, 4.0, 5.0}


def test_no_knob_to_tune_is_refused():
    _refused({**TINY, "fedex_configs": 3, "fedex_knobs": []},
             ["field 'fedex_knobs': [] names no knob", "allowed: one or more of", "local_lr"])


def _fedex_fields():
    """FedEx's fields that need it on: read from the config's declarations (``needs``)."""
    from dataclasses import fields

    return [f.name for f in fields(FederatedRunConfig) if (f.metadata.get("needs") or ("",))[0] == "fedex_configs"]


OTHER_THAN_DEFAULT = {"fedex_knobs": ["local_lr", "local_momentum"], "fedex_eps": 0.25, "fedex_schedule": "adaptive",
                      "fedex_baseline": 0.5, "fedex_diff": True, "fedex_cutoff": 0.1, "fedex_objective": "loss"}


def test_every_fedex_field_but_the_switch_declares_that_it_needs_fedex():
    assert sorted(_fedex_fields()) == sorted(OTHER_THAN_DEFAULT)
    assert sorted(_fedex_fields()) == sorted(f for f in FederatedRunConfig.field_names()
                                             if f.startswith("fedex_") and f != "fedex_configs")


@pytest.mark.parametrize("name", sorted(OTHER_THAN_DEFAULT))
def test_a_fedex_field_set_while_fedex_is_off_is_refused_and_at_its_default_keeps_the_id(name):
    value = OTHER_THAN_DEFAULT[name]
    text = _refused({**TINY, name: value}, [f"field '{name}'", "has no effect: FedEx is off (fedex_configs 0)",
                                            "allowed: fedex_configs >= 2"])
    assert len(text) < 300
    # with FedEx on it is accepted; at its default while off it changes nothing, the trial id included
    assert getattr(FederatedRunConfig.from_dict({**TINY, "fedex_configs": 3, name: value}), name) == value
    default = getattr(FederatedRunConfig(), name)
    off = FederatedRunConfig.from_dict({**TINY, name: default})
    assert off.trial_id() == FederatedRunConfig.from_dict(TINY).trial_id()
    assert off.trial_id() == FederatedRunConfig.from_dict({**TINY, "fedex_configs": 0}).trial_id()


def test_turning_fedex_off_with_its_fields_left_at_their_defaults_is_a_plain_run():
    on = FederatedRunConfig.from_dict({**TINY, "fedex_configs": 3, **OTHER_THAN_DEFAULT})
    with pytest.raises(ConfigError, match="has no effect: FedEx is off"):
        on.replace(fedex_configs=0)
    off = FederatedRunConfig.from_dict(_fedex_off(on.to_dict()))
    assert off.trial_id() == FederatedRunConfig.from_dict(TINY).trial_id()


@pytest.mark.parametrize("scheduler", ["pbt", "pb2"])
def test_population_training_that_explores_a_fedex_knob_is_refused_before_anything_starts(tmp_path, scheduler):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study

    def opts(**kw):
        return SweepOptions(**{"algorithms": ["fedprox"], "rounds": 4, "scheduler": scheduler, "sampler": "random",
                               "output": str(tmp_path), "name": "p", "overrides": {"fedex_configs": 3}, **kw})

    with pytest.raises(ConfigError) as err:
        plan_study(opts())  # fedprox's space samples local_lr, FedEx's default knob
    text = str(err.value)
    assert "\n" not in text and f"option '--scheduler': {scheduler} explores local_lr" in text, text
    assert "fedex_configs 3" in text and "allowed: local_lr fixed" in text
    with pytest.raises(ConfigError, match=f"{scheduler} explores prox_mu"):
        plan_study(opts(knobs="own", overrides={"fedex_configs": 3, "fedex_knobs": ["prox_mu"]}))
    assert list(tmp_path.iterdir()) == []  # no folder made
    # PBT over fedprox's own knob (prox_mu), FedEx over the shared local_lr that --knobs own fixes: planned
    assert plan_study(opts(knobs="own")).options.scheduler == scheduler
    for other in ("fifo", "asha"):  # FedEx inside the other schedulers, whatever they sample
        plan_study(opts(scheduler=other, sampler="tpe", name="q"))


def test_a_member_restored_from_a_donor_with_another_non_fedex_knob_continues_the_donors_fedex():
    """What PBT does at an exploit (FederatedRun.set_state of the donor's checkpoint under the
    member's explored configuration): an explored knob FedEx does not tune keeps the donor's FedEx
    state, one it tunes is refused (hence the sweep's refusal)."""
    donor = FederatedRunConfig.from_dict({**TINY, "algorithm": "fedprox", "prox_mu": 0.1, "fedex_configs": 3,
                                          "fedex_eps": 1.0})
    with FederatedRun(donor) as fr:
        [fr.step() for _ in range(2)]
        state = fr.get_state()
    explored = donor.replace(prox_mu=0.5)
    with FederatedRun(explored) as fr:
        fr.set_state(state)
        assert np.array_equal(fr.get_state()["tuner"]["z"], state["tuner"]["z"])
        assert math.isfinite(fr.step().metrics["diag.fedex_entropy"])
    with FederatedRun(donor.replace(local_lr=0.2)) as fr, pytest.raises(ValueError, match="FedEx configurations"):
        fr.set_state(state)
