"""Auto-β (FedDA/FedGP, docs/methods-seeds.md §2) under local momentum: what the recorded samples do to
the estimates σ̂², d̂² and to β_DA, before and after the fix of issue 8.

A script, not a test: it prints one table. No Ray: it calls the ``sgd`` client method with the
worker's recorder (:class:`fedtune.algorithms.client.step_records.StepRecorder`) on a small synthetic task and
feeds :func:`fedtune.algorithms.server.fedgp_auto_beta.auto_beta_estimates` directly.

    python benchmarks/auto_beta_momentum.py                 # 40 replicates
    python benchmarks/auto_beta_momentum.py --replicates 100 --lr 0.05

Setting: a linear classifier (``mlp`` without hidden layers) on Gaussian class clusters
(``--dim`` features, ``--classes`` classes). The target client holds ``--n`` examples and runs
one epoch of ``--batch-size`` batches from the shared θ; the source client holds either an exact
copy of the target's data (``identical``: β_DA should be high) or the same inputs with permuted
labels (``shifted``: β_DA should be low); it trains on its own batch order. Each replicate draws
fresh data, θ and batch orders; the table gives means over replicates.

Samples compared:

* ``before``: what fedtune recorded until issue 8, the parameter change over each optimiser step
  (``t_b = θ_b − θ_(b−1)``) and the source's ``Δ_S / steps``;
* ``after``: the raw per-batch steps ``t_b = −lr ∇_b`` and the source's mean raw step (what plain
  SGD would have moved, whatever the optimiser).

Columns: σ̂², d̂², β_DA at momentum 0 and ``--momentum``, and the ratio σ̂²(m)/σ̂²(0), which should
be ≈ 1 (the target's batch noise does not depend on the optimiser).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms.client.method import SGD, ClientContext
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta_estimates
from fedtune.config import FederatedRunConfig
from fedtune.layout import FlatLayout
from fedtune.models import build_model
from fedtune.flat_weights import get_flat, set_flat
from fedtune.algorithms.client.step_records import StepRecorder


class ThetaDiffRecorder:
    """The pre-issue-8 samples: θ after each optimiser step minus θ before it. Called (like
    ``ctx.record_step``) before each step, so step b's difference is read at call b+1 and
    :meth:`finish` reads the last one."""

    def __init__(self, model, layout):
        self.model, self.layout, self.P = model, layout, layout.num_params
        self.snaps: list[np.ndarray] = []

    def __call__(self, params, grads) -> None:
        self.snaps.append(get_flat(self.model, self.layout)[:self.P].copy())

    def finish(self) -> np.ndarray:
        self.snaps.append(get_flat(self.model, self.layout)[:self.P].copy())
        return np.diff(np.stack(self.snaps), axis=0)


def make_data(rng: np.random.Generator, n: int, dim: int, classes: int,
              data_rng: np.random.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    means = rng.normal(size=(classes, dim)) * 1.5
    rng = rng if data_rng is None else data_rng
    y = rng.integers(0, classes, size=n)
    x = means[y] + rng.normal(size=(n, dim))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def train_client(cfg, model, theta, layout, x, y, seed, role, mode):
    """Train one client from ``theta``; return (samples or mean sample, Δ, steps)."""
    set_flat(model, layout, theta)
    ctx = ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role=role,
                        generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))
    rec = (StepRecorder(model, layout, cfg.local_lr, keep_rows=role == "target") if mode == "after"
           else ThetaDiffRecorder(model, layout))
    ctx.record_step = rec
    out = SGD(cfg).train(ctx)
    delta = get_flat(model, layout)[:layout.num_params] - theta[:layout.num_params]
    if mode == "after":
        return (rec.result() if role == "target" else rec.mean()), delta, out.steps
    rows = rec.finish()
    return (rows if role == "target" else delta / out.steps), delta, out.steps


def replicate(seed: int, momentum: float, mode: str, source: str, args, sample_seed: int | None = None):
    """(σ̂², d̂², β_DA, t̄) of one replicate: task (class means) and θ from ``seed``; the clients'
    data sample and batch orders from ``sample_seed`` (default: ``seed``)."""
    rng = np.random.default_rng(seed)
    order = seed if sample_seed is None else sample_seed
    x, y = make_data(rng, args.n, args.dim, args.classes,
                     None if sample_seed is None else np.random.default_rng(sample_seed))
    ys = y if source == "identical" else torch.tensor(rng.permutation(args.classes), dtype=torch.int64)[y]
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedda", "setting": "fda", "dataset": "rect4", "backend": "local",
                               "gp_beta": "auto", "local_lr": args.lr, "local_momentum": momentum,
                               "weight_decay": 0.0, "batch_size": args.batch_size, "local_epochs": args.epochs})
    torch.manual_seed(seed)
    model = build_model("mlp", input_shape=(args.dim,), num_classes=args.classes, mlp_hidden=[])
    layout = FlatLayout.of(model)
    theta = get_flat(model, layout)
    t, _, _ = train_client(cfg, model, theta, layout, x, y, 2 * order + 1, "target", mode)
    s, _, _ = train_client(cfg, model, theta, layout, x, ys, 2 * order + 2, "source", mode)
    est = auto_beta_estimates(t, s[None, :])
    return est.sigma2, float(est.d2[0]), float(est.beta_da[0]), t.mean(axis=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=40)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2, help="target local epochs per round")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {args.replicates} replicates, n={args.n}, batch={args.batch_size} "
          f"({args.epochs * args.n // args.batch_size} target steps), lr={args.lr}, "
          f"linear model d={args.dim} k={args.classes}")
    print(f"{'samples':8} {'source':10} {'σ̂²(m=0)':>10} {'σ̂²(m)':>10} {'ratio':>7} {'d̂²(m=0)':>10} "
          f"{'d̂²(m)':>10} {'β_DA(m=0)':>10} {'β_DA(m)':>9}")
    ok = True
    for mode in ("before", "after"):
        for source in ("identical", "shifted"):
            res = {m: np.array([replicate(r, m, mode, source, args)[:3] for r in range(args.replicates)])
                   for m in (0.0, args.momentum)}
            s0, s1 = res[0.0][:, 0].mean(), res[args.momentum][:, 0].mean()
            d0, d1 = res[0.0][:, 1].mean(), res[args.momentum][:, 1].mean()
            b0, b1 = res[0.0][:, 2].mean(), res[args.momentum][:, 2].mean()
            print(f"{mode:8} {source:10} {s0:10.3e} {s1:10.3e} {s1 / s0:7.3f} {d0:10.3e} {d1:10.3e} "
                  f"{b0:10.3f} {b1:9.3f}")
            if mode == "after" and source == "identical":
                ok &= 0.7 < s1 / s0 < 1.4 and b1 > 0.5
    print(f"# m = {args.momentum}; 'after' identical-domain check (0.7 < ratio < 1.4, β_DA(m) > 0.5): "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
