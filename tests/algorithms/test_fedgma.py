"""FedGMA (server rule ``fedgma``, docs/methods-benchmark.md §21): the agreement and both masks against float64
NumPy written from the equations, Bai et al.'s arithmetic replayed with their ParamDict's operator
semantics, the soft mask at gma_tau = 0 is FedAvg bit for bit (rule and whole run), and a bad value
in one line."""

from __future__ import annotations

import operator

import numpy as np
import pytest

from fedtune.algorithms.server.fedgma import FedGMA, agreement, fedgma_direction, gma_mask
from fedtune.algorithms.server.rule import FedAvg, RoundInfo
from fedtune.config import FederatedRunConfig


def _updates(rng, u=5, m=37):
    x = rng.normal(size=(u, m)).astype(np.float32)
    x[:, 3] = 0.0  # no client moved this coordinate: sign 0, agreement 0
    x[1:, 5] = 0.0  # one client moved it
    x[:, 7] = np.abs(x[:, 7])  # all agree
    return x


def test_agreement_is_the_mean_sign_in_float64_for_any_block():
    x = _updates(np.random.default_rng(0))
    ref = np.abs(np.sign(x.astype(np.float64)).mean(axis=0))
    for block in (1, 4, 37, 1 << 16):
        np.testing.assert_array_equal(agreement(x, block=block), ref)
    assert agreement(x)[3] == 0.0 and agreement(x)[5] == 1 / 5 and agreement(x)[7] == 1.0


def test_both_masks_and_the_step_match_float64_numpy():
    rng = np.random.default_rng(1)
    x, p = _updates(rng), rng.dirichlet(np.ones(5))
    params = rng.normal(size=37).astype(np.float32)
    a = np.abs(np.sign(x.astype(np.float64)).mean(axis=0))
    g = (p[:, None] * x.astype(np.float64)).sum(axis=0)
    for tau in (0.2, 0.6, 1.0):
        soft = np.where(a >= tau, 1.0, a)
        bai = np.where(a >= tau, tau * (1.0 + a), 0.0)
        np.testing.assert_array_equal(gma_mask(a, tau, "soft"), soft)
        np.testing.assert_array_equal(gma_mask(a, tau, "bai"), bai)
        for mask, m in (("soft", soft), ("bai", bai)):
            d, got_m, got_a = fedgma_direction(x, p, tau, mask)
            np.testing.assert_array_equal(got_m, m)
            np.testing.assert_array_equal(got_a, a)
            np.testing.assert_allclose(d, m * g, rtol=1e-12, atol=1e-15)
            cfg = FederatedRunConfig.from_dict({"server_rule": "fedgma", "gma_tau": tau, "gma_mask": mask,
                                                "global_lr": 0.5})
            out = FedGMA(cfg, None).aggregate(params, x, p, extras=[{}] * 5, round=1, info=RoundInfo.sources(5))
            np.testing.assert_allclose(out.params, (params + 0.5 * m * g).astype(np.float32), rtol=1e-6, atol=1e-7)
            assert out.diagnostics["gma_kept"] == pytest.approx(np.mean(a >= tau))
            assert out.diagnostics["gma_mean_agreement"] == pytest.approx(a.mean())


class _ParamDict(dict):
    """The operator semantics of Bai et al.'s ``src/utils.py`` ``ParamDict`` (their arithmetic on
    state dicts), on float64 NumPy arrays: ``__sub__``/``__rsub__`` are both ``self + (−other)``,
    ``__mul__``/``__rmul__`` elementwise with a number or another dict."""

    def _op(self, other, op):
        if isinstance(other, dict):
            return _ParamDict({k: op(v, other[k]) for k, v in self.items()})
        return _ParamDict({k: op(v, other) for k, v in self.items()})

    def __add__(self, other):
        return self._op(other, operator.add)

    def __mul__(self, other):
        return self._op(other, operator.mul)

    __rmul__ = __mul__

    def __neg__(self):
        return _ParamDict({k: -v for k, v in self.items()})

    def __rsub__(self, other):
        return self.__add__(other.__neg__())

    __sub__ = __rsub__


def test_the_bai_mask_replays_their_aggregate_line_by_line():
    """Bai et al.'s FedGMA.aggregate: delta_u = p_u (θ_u − θ); sign_delta = mean sign(delta_u);
    mask = |sign_delta| ≥ h; final_mask = mask + (0 − mask)·|sign_delta|; θ + h·final_mask·Σ delta_u."""
    rng = np.random.default_rng(2)
    x, p = _updates(rng), rng.dirichlet(np.ones(5))
    theta = rng.normal(size=37)
    h = 0.4
    last = _ParamDict({"w": theta})
    deltas = [_ParamDict({"w": p[u] * x[u].astype(np.float64)}) for u in range(5)]
    sum_delta = deltas[0]
    sign_delta = _ParamDict({"w": np.sign(deltas[0]["w"])})
    for d in deltas[1:]:
        sum_delta = sum_delta + d
        sign_delta = sign_delta + _ParamDict({"w": np.sign(d["w"])})
    sign_delta = _ParamDict({"w": sign_delta["w"] / 5})
    abs_sign = _ParamDict({"w": np.abs(sign_delta["w"])})
    mask = _ParamDict({"w": (abs_sign["w"] >= h).astype(np.float64)})
    final_mask = mask + (0 - mask) * abs_sign  # their line: 0 - mask evaluates to mask
    theirs = (last + h * final_mask * sum_delta)["w"]

    d, m, _ = fedgma_direction(x, p, h, "bai")
    np.testing.assert_allclose(theta + d, theirs, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(m, final_mask["w"] * h)
    assert (m[abs_sign["w"] < h] == 0).all() and (m[abs_sign["w"] >= h] >= h).all()


def test_soft_mask_at_tau_zero_is_fedavg_bit_for_bit():
    rng = np.random.default_rng(3)
    x, p = _updates(rng), rng.dirichlet(np.ones(5))
    params = rng.normal(size=37).astype(np.float32)
    kw = {"extras": [{}] * 5, "round": 1, "info": RoundInfo.sources(5)}
    gma = FedGMA(FederatedRunConfig.from_dict({"server_rule": "fedgma", "gma_tau": 0.0, "global_lr": 0.7}), None)
    avg = FedAvg(FederatedRunConfig.from_dict({"server_rule": "fedavg", "global_lr": 0.7}), None)
    a, b = gma.aggregate(params, x, p, **kw), avg.aggregate(params, x, p, **kw)
    assert a.params.tobytes() == b.params.tobytes() and a.direction.tobytes() == b.direction.tobytes()


def test_a_run_at_tau_zero_stores_fedavgs_rows_and_a_masked_run_differs(tmp_path):
    from fedtune.runtime.driver import run

    base = {"dataset": "rect4", "setting": "fdg", "num_clients": 3, "rounds": 2, "local_steps": 2,
            "batch_size": 16, "model": "mlp", "mlp_hidden": [8], "backend": "local"}
    cols = ("train_loss", "val_acc", "target_acc")

    def rows(**kw):
        res = run(FederatedRunConfig.from_dict({**base, **kw, "output": str(tmp_path / str(len(kw)) / str(kw))}),
                  progress=False)
        assert res.status == "completed"
        return res.rows

    avg = rows(algorithm="fedavg")
    zero = rows(algorithm="fedgma", gma_tau=0.0)
    masked = rows(algorithm="fedgma", gma_tau=0.9)
    assert [[r[c] for c in cols] for r in zero] == [[r[c] for c in cols] for r in avg]
    assert all(r["diag.gma_kept"] == 1.0 for r in zero)
    assert [r["train_loss"] for r in masked][1:] != [r["train_loss"] for r in avg][1:]
    assert all(0.0 <= r["diag.gma_kept"] < 1.0 for r in masked)


def test_bad_values_are_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'gma_tau' \(server rule fedgma\): 1.5 is out of range; allowed: >= 0 and <= 1$"):
        FederatedRunConfig.from_dict({"algorithm": "fedgma", "gma_tau": 1.5})
    with pytest.raises(ConfigError, match=r"^field 'gma_mask' \(server rule fedgma\): 'hard' is not allowed; allowed: soft, bai$"):
        FederatedRunConfig.from_dict({"algorithm": "fedgma", "gma_mask": "hard"})
