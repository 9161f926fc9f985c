"""AFL (client method ``afl`` with its server side, docs/methods-benchmark.md §22): the simplex projection
against a float64 bisection, the server's ascent step from the clients' extras, the clients' domain
losses and their λ-weighted steps against float64 references, λ in the checkpoint, a run, and bad
input in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.afl import AFL, domain_loss_sums
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.algorithms.server.afl import COUNT_KEY, LAMBDA_KEY, LOSS_KEY, AFLServer, project_to_simplex
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bisection_projection(v: np.ndarray) -> np.ndarray:
    """The simplex projection from its definition: max(v − θ, 0) with Σ = 1, θ found by bisection."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.maximum(v - mid, 0).sum() > 1.0:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - (lo + hi) / 2, 0)


def test_the_projection_matches_its_definition():
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 7):
        for scale in (0.1, 1.0, 10.0):
            v = rng.normal(size=k) * scale
            w = project_to_simplex(v)
            np.testing.assert_allclose(w, _bisection_projection(v), atol=1e-12)
            assert (w >= 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
    on = np.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(project_to_simplex(on), on, atol=1e-15)


def _side(lr=0.5, domains=("a", "b", "c", "d"), train=(0, 2, 3)):
    cfg = FederatedRunConfig.from_dict({"algorithm": "afl", "afl_lambda_lr": lr})
    side = AFLServer(cfg, None, 4)
    side.domains, side.train_domains = domains, train
    return side


def test_the_server_step_is_projected_ascent_on_the_pooled_domain_losses():
    side = _side()
    lam0 = side.payload(1)[LAMBDA_KEY]
    np.testing.assert_array_equal(lam0, [1 / 3, 0, 1 / 3, 1 / 3])  # uniform over the training domains
    extras = [{LOSS_KEY: np.array([2.0, 0, 3.0, 0]), COUNT_KEY: np.array([4.0, 0, 2.0, 0])},
              {LOSS_KEY: np.array([6.0, 0, 0, 1.0]), COUNT_KEY: np.array([4.0, 0, 0, 5.0])}]
    pooled = np.array([8.0 / 8, 3.0 / 2, 1.0 / 5])  # domains a, c, d
    new, diag = side.update(None, "params", None, None, extras=extras, round=1, info=RoundInfo.sources(2))
    assert new == "params"
    expect = _bisection_projection(np.full(3, 1 / 3) + 0.5 * pooled)
    np.testing.assert_allclose(side.weights, expect, atol=1e-12)
    assert diag["afl_lambda.c"] == pytest.approx(expect[1]) and diag["afl_lambda_max"] == pytest.approx(expect.max())
    assert "afl_lambda.b" not in diag
    np.testing.assert_allclose(side.payload(2)[LAMBDA_KEY], [expect[0], 0, expect[1], expect[2]], atol=1e-15)

    # λ survives a checkpoint; a run on other domains refuses it in one line
    fresh = _side()
    fresh.load_state_dict(side.state_dict())
    np.testing.assert_array_equal(fresh.payload(2)[LAMBDA_KEY], side.payload(2)[LAMBDA_KEY])
    with pytest.raises(ValueError, match="^AFL: the checkpoint holds 3 mixture weights, this run trains on 2 domains$"):
        _side(train=(0, 1)).load_state_dict(side.state_dict())


def test_a_zero_step_keeps_lambda_uniform():
    side = _side(lr=0.0)
    extras = [{LOSS_KEY: np.array([5.0, 0, 1.0, 2.0]), COUNT_KEY: np.array([1.0, 0, 1.0, 1.0])}]
    side.update(None, None, None, None, extras=extras, round=1, info=RoundInfo.sources(1))
    np.testing.assert_allclose(side.weights, np.full(3, 1 / 3), atol=1e-15)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def _ctx(model, x, y, domains, cfg, payload):
    return ClientContext(model=model, data=TensorExamples(x, y, domains=domains), cfg=cfg, round=1, client_id=0,
                         role="source", generator=torch.Generator().manual_seed(1), device=torch.device("cpu"),
                         payload=payload)


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "afl", "local_steps": 3, "batch_size": 6,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def test_the_client_reports_domain_losses_at_the_received_model_and_steps_on_weighted_risks():
    model = _model()
    ref = _model().double()
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()})
    x, y = torch.randn(15, 4), torch.randint(0, 3, (15,))
    domains = torch.tensor([0, 2, 2, 0, 0, 2, 2, 2, 0, 0, 2, 0, 2, 2, 0])
    lam = np.array([0.7, 0.0, 0.3, 0.0])
    cfg = _cfg()

    # the received model's per-domain losses: eval mode, every example once
    ref.eval()
    with torch.no_grad():
        ce = nn.functional.cross_entropy(ref(x.double()), y, reduction="none").numpy()
    want_loss = np.array([ce[domains.numpy() == d].sum() for d in range(4)])
    want_count = np.bincount(domains.numpy(), minlength=4).astype(float)

    out = AFL(cfg).train(_ctx(model, x, y, domains, cfg, {LAMBDA_KEY: lam}))
    np.testing.assert_allclose(out.extras[LOSS_KEY], want_loss, rtol=1e-5)
    np.testing.assert_array_equal(out.extras[COUNT_KEY], want_count)
    assert out.metrics["afl_lambda_own"] == pytest.approx(1.0)

    ref.train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for idx in batches(15, 6, 3, torch.Generator().manual_seed(1)):
        logits, d = ref(x[idx].double()), domains[idx]
        ce = nn.functional.cross_entropy(logits, y[idx], reduction="none")
        loss = sum(lam[k] * ce[d == k].mean() for k in torch.unique(d).tolist())
        opt.zero_grad()
        loss.backward()
        opt.step()
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        if a.is_floating_point():
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_domain_losses_draw_no_random_number_and_need_the_servers_weights():
    model, cfg = _model(), _cfg()
    x, y, domains = torch.randn(7, 4), torch.randint(0, 3, (7,)), torch.zeros(7, dtype=torch.int64)
    ctx = _ctx(model, x, y, domains, cfg, {})
    state = ctx.generator.get_state()
    domain_loss_sums(ctx, 2, 3)
    assert torch.equal(ctx.generator.get_state(), state)
    with pytest.raises(ValueError, match="^AFL: the broadcast carries no mixture weights"):
        AFL(cfg).train(ctx)
    with pytest.raises(ValueError, match="^AFL: client 0 holds domain id 0, the mixture weights cover 0 domains$"):
        AFL(cfg).train(_ctx(model, x, y, domains, cfg, {LAMBDA_KEY: np.zeros(0)}))


def test_a_run_moves_lambda_on_the_simplex(tmp_path):
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "afl", "afl_lambda_lr": 1.0, "dataset": "rect4", "setting": "fdg", "domain_homogeneity": 0.5,
        "num_clients": 3, "rounds": 2, "local_steps": 2, "batch_size": 16, "model": "mlp", "mlp_hidden": [8],
        "backend": "local", "output": str(tmp_path)})
    res = run(cfg, progress=False)
    assert res.status == "completed"
    for row in res.rows:
        lam = [v for k, v in row.items() if k.startswith("diag.afl_lambda.")]
        assert len(lam) == 3 and sum(lam) == pytest.approx(1.0) and max(lam) > 1 / 3


def test_bad_value_is_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'afl_lambda_lr' \(client method afl\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(afl_lambda_lr=-1)


# ---------------------------------------------------------------- afl_lambda_at: aggregated (Bai et al.'s order)
def _run_cfg(tmp_path, **kw):
    return FederatedRunConfig.from_dict({
        "algorithm": "afl", "afl_lambda_lr": 1.0, "afl_lambda_at": "aggregated", "dataset": "rect4",
        "setting": "fdg", "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 4, "local_steps": 2,
        "batch_size": 16, "model": "mlp", "mlp_hidden": [8], "backend": "local", "output": str(tmp_path), **kw})


def _metrics(rows):
    return [(r["train_loss"], r["val_acc"], sorted((k, v) for k, v in r.items() if k.startswith("diag.afl")))
            for r in rows]


def test_the_aggregated_order_steps_lambda_on_the_losses_of_the_new_global_model(tmp_path):
    from fedtune.flat_weights import set_flat
    from fedtune.runtime.driver import FederatedRun

    with FederatedRun(_run_cfg(tmp_path)) as fr:
        row = fr.step().metrics
        coord = fr.coordinator
        worker = coord.pool.worker
        # independently: every client's training examples at the aggregated model, in float64
        model = worker.model
        set_flat(model, worker.layout, coord.weights)
        ref = _double_copy(model)
        loss, count = np.zeros(4), np.zeros(4)
        for cid in range(3):
            data = worker.data[cid]["train"]
            x, y = data.batch(torch.arange(len(data)))
            with torch.no_grad():
                ce = nn.functional.cross_entropy(ref(x.double()), y, reduction="none").numpy()
            d = data.domains.numpy()
            np.add.at(loss, d, ce)
            np.add.at(count, d, 1.0)
    side = coord.side
    ids = list(side.train_domains)
    pooled = loss[ids] / count[ids]
    expect = _bisection_projection(np.full(len(ids), 1 / len(ids)) + 1.0 * pooled)
    got = np.array([row[f"diag.afl_lambda.{side.domains[k]}"] for k in ids])
    np.testing.assert_allclose(got, expect, rtol=1e-6)


def _double_copy(model):
    import copy

    ref = copy.deepcopy(model).double()
    ref.eval()
    return ref


def test_the_aggregated_order_resumes_exactly_from_a_checkpoint(tmp_path):
    from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
    from fedtune.runtime.driver import FederatedRun

    cfg = _run_cfg(tmp_path)
    with FederatedRun(cfg) as fr:
        straight = [fr.step().metrics for _ in range(4)]
    with FederatedRun(cfg) as fr:
        first = [fr.step().metrics for _ in range(2)]
        write_checkpoint(tmp_path / "ckpt", fr.get_state())
    with FederatedRun(cfg) as fr:
        fr.set_state(read_checkpoint(tmp_path / "ckpt"))
        resumed = [fr.step().metrics for _ in range(2)]
    assert _metrics(first + resumed) == _metrics(straight)
