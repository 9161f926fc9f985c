"""Issue 47 (1, 2, 6): the local loop's input staged ahead in a background thread, and the finite-loss
guard read one step late, each giving the bits of the synchronous loop; the overlap timed with sleeps."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.client import deferred_loss, prefetch
from fedtune.algorithms.client.method import ClientContext, ClientMethod, SGD, batches, descend
from fedtune.algorithms.client.steps import local_steps
from fedtune.config import FederatedRunConfig
from fedtune.errors import DataError
from fedtune.runtime.augment import DomainBedAugment
from fedtune.runtime.examples import CachedImages, TensorExamples


class FakeMap:
    """An image map (``array``, ``read``) held in memory; ``delay`` seconds a read; ``bad``: rows
    whose read raises like a damaged cache."""

    def __init__(self, array: np.ndarray, delay: float = 0.0, bad: set[int] = frozenset()):
        self.array, self.delay, self.bad = array, delay, bad

    def read(self, rows, out=None):
        if self.delay:
            time.sleep(self.delay)
        if self.bad & set(np.asarray(rows).tolist()):
            raise DataError("the image cache is damaged")
        out = np.empty((len(rows), *self.array.shape[1:]), np.uint8) if out is None else out
        np.take(self.array, rows, axis=0, out=out)
        return out


def images(n=(7, 6), side=12, delay=0.0, bad=frozenset(), channels_last=False) -> CachedImages:
    rng = np.random.default_rng(0)
    maps = [FakeMap(rng.integers(0, 256, (k, side, side, 3), dtype=np.uint8), delay, bad) for k in n]
    rows = [np.arange(k)[::-1].copy() for k in n]  # not in file order
    labels = rng.integers(0, 3, sum(n))
    return CachedImages(maps, rows, labels, channels_last=channels_last)


def old_batches(n, batch_size, steps, generator):
    """The batch draw before issue 47, kept here as the reference (lazy, epoch by epoch)."""
    done = 0
    while done < steps and n > 0:
        perm = torch.randperm(n, generator=generator)
        starts = list(range(0, n, batch_size))
        if batch_size > 1 and len(starts) > 1 and n - starts[-1] == 1:
            starts.pop()
        for i, start in enumerate(starts):
            if done == steps:
                return
            yield perm[start:starts[i + 1] if i + 1 < len(starts) else n]
            done += 1


def cfg(**kw) -> FederatedRunConfig:
    base = {"dataset": "rect4", "backend": "local", "mlp_hidden": [], "local_momentum": 0.9, "batch_size": 4,
            "local_lr": 0.05}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fedtune-prefetch"]


@pytest.mark.parametrize("n,bs,steps", [(13, 4, 9), (13, 4, 3), (9, 4, 7), (5, 8, 4), (12, 4, 6), (0, 4, 3)])
def test_epochs_draw_the_same_rows_at_the_same_moments_as_before(n, bs, steps):
    g_old, g_new = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    old, new = [], []
    for rows in old_batches(n, bs, steps, g_old):
        old.append(rows)
        torch.rand(2, generator=g_old)  # a step's own draws between the batches (augmentation)
    for epoch in prefetch.epochs(n, bs, steps, g_new):
        for rows in epoch:
            new.append(rows)
            torch.rand(2, generator=g_new)
    assert [r.tolist() for r in old] == [r.tolist() for r in new]
    assert torch.equal(g_old.get_state(), g_new.get_state())
    assert [r.tolist() for r in batches(n, bs, steps, torch.Generator().manual_seed(3))] == \
        [r.tolist() for r in old_batches(n, bs, steps, torch.Generator().manual_seed(3))]


@pytest.mark.parametrize("augmented", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_stage_then_finish_gives_the_bits_and_draws_of_batch(augmented, channels_last):
    ex = images(channels_last=channels_last)
    aug = DomainBedAugment(12) if augmented else None
    rows = torch.tensor([0, 12, 3, 7, 1, 9, 10])  # both domain pieces
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x1, y1 = ex.batch(rows, aug, g1)
    x2, y2 = ex.finish(ex.stage(rows, augmented), aug, g2)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and x1.stride() == x2.stride()
    assert torch.equal(g1.get_state(), g2.get_state())
    with pytest.raises(ValueError, match="another augmentation setting"):
        ex.finish(ex.stage(rows, not augmented), aug, g2)
    t = TensorExamples(torch.randn(8, 3), torch.arange(8))
    r = torch.tensor([5, 1, 2])
    assert all(torch.equal(a, b) for a, b in zip(t.batch(r), t.finish(t.stage(r))))


class Reference(ClientMethod):
    """Plain SGD through the loop as it was before issue 47: rows from ``old_batches``, each batch
    fetched by ``ctx.batch`` when reached, the loss read before backward."""

    name = "reference"

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        n, total, done = ctx.num_examples, 0.0, 0
        for idx in old_batches(n, self.cfg.batch_size, local_steps(n, self.cfg), ctx.generator):
            ctx.rows = idx
            x, y = ctx.batch(idx)
            value = descend(opt, F.cross_entropy(model(x), y), ctx.record_step)
            if not math.isfinite(value):
                return value, done + 1
            total += value
            done += 1
        return total / max(done, 1), done


def conv_model(poison_at: int | None = None) -> nn.Module:
    torch.manual_seed(1)
    layers = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
              nn.Linear(4, 3)]
    if poison_at is not None:
        layers.append(Poison(poison_at))
    return nn.Sequential(*layers)


class Poison(nn.Module):
    """Multiplies its input by NaN (or ``value``) on its ``at``-th forward (1-based)."""

    def __init__(self, at: int, value: float = float("nan")):
        super().__init__()
        self.at, self.value, self.calls = at, value, 0

    def forward(self, x):
        self.calls += 1
        return x * self.value if self.calls == self.at else x


def state(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def train(method_cls, ex, c, model, augment=None, seed=0):
    ctx = ClientContext(model=model, data=ex, cfg=c, round=1, client_id=0, role="source",
                        generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"), augment=augment)
    out = method_cls(c).train(ctx)
    return (out.loss, out.steps) if not isinstance(out, tuple) else out, ctx.generator


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_the_prefetched_loop_trains_the_bits_of_the_synchronous_one(monkeypatch, depth):
    monkeypatch.setattr(prefetch, "PREFETCH_DEPTH", depth)
    c = cfg(local_steps=11)  # 13 examples, batches of 4: 3 a epoch, four epochs drawn
    aug = DomainBedAugment(12)
    (ref_loss, ref_steps), g_ref = train(Reference, images(), c, ref := conv_model(), aug)
    (loss, steps), g = train(SGD, images(), c, new := conv_model(), aug)
    assert (loss, steps) == (ref_loss, ref_steps) and steps == 11
    assert all(torch.equal(a, b) for a, b in zip(state(ref), state(new)))
    assert torch.equal(g_ref.get_state(), g.get_state())
    assert prefetch_threads() == []


@pytest.mark.parametrize("at", [1, 2, 3, 4, 7, 11])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_deferred_loss_check_ends_the_round_as_the_immediate_one(monkeypatch, at, value):
    """A non-finite loss at step ``at`` (first of an epoch, mid-epoch, last of the round): checked
    one step late (the CUDA path, forced onto the CPU here) the round ends with the same steps, the
    same loss and the same weights (parameters before that step, BatchNorm's statistics after its
    forward) as today's immediate check."""
    c = cfg(local_steps=11)
    results = []
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(deferred_loss, "DEFERRED_DEVICES", devices)
        model = conv_model(at)
        model[-1].value = value
        (loss, steps), g = train(SGD, images(), c, model)
        results.append((loss, steps, state(model), g.get_state()))
    (l1, s1, w1, g1), (l2, s2, w2, g2) = results
    assert s1 == s2 == at and not math.isfinite(l1)
    assert (math.isnan(l1) and math.isnan(l2)) or l1 == l2
    assert all(torch.equal(a, b) for a, b in zip(w1, w2)) and torch.equal(g1, g2)
    assert all(torch.isfinite(t.float()).all() for t in w2)


def test_a_recorded_step_is_checked_at_once(monkeypatch):
    """With ``record_step`` recording (auto-beta's raw steps) the loss is read before backward as
    today, so a non-finite step records nothing: the same records either way."""
    monkeypatch.setattr(deferred_loss, "DEFERRED_DEVICES", ("cuda", "cpu"))
    recorded = []
    ctx = ClientContext(model=conv_model(3), data=images(), cfg=cfg(local_steps=6), round=1, client_id=0,
                        role="source", generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                        record_step=lambda params, grads: recorded.append([g.clone() for g in grads]))
    out = SGD(cfg(local_steps=6)).train(ctx)
    assert out.steps == 3 and len(recorded) == 2
    assert all(torch.isfinite(g).all() for row in recorded for g in row)


def test_the_deferred_loss_check_gives_the_same_round_without_a_non_finite_loss(monkeypatch):
    c = cfg(local_steps=7)
    out = []
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(deferred_loss, "DEFERRED_DEVICES", devices)
        model = conv_model()
        out.append((train(SGD, images(), c, model)[0], state(model)))
    assert out[0][0] == out[1][0]
    assert all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))


def test_on_the_cpu_the_loss_is_read_at_once_with_no_saved_copy():
    ctx = ClientContext(model=conv_model(), data=images(), cfg=cfg(), round=1, client_id=0, role="source",
                        generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    opt = SGD(cfg()).start_round(ctx)
    assert ctx.loss_guard is None and opt.guard is None
    x, y = ctx.batch(torch.arange(4))
    assert isinstance(descend(opt, F.cross_entropy(ctx.model(x), y), ctx.record_step, defer=True), float)


class Raising(ClientMethod):
    name = "raising"

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        calls = [0]

        def step(x, y):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("a step failed")
            return descend(opt, F.cross_entropy(model(x), y), ctx.record_step)
        return self.local_loop(ctx, step)


def test_no_prefetch_thread_outlives_a_round_an_early_end_or_an_exception():
    c = cfg(local_steps=6)
    train(SGD, images(delay=0.01), c, conv_model())
    assert prefetch_threads() == []
    (_, steps), _ = train(SGD, images(delay=0.01), c, conv_model(poison_at=2))
    assert steps == 2 and prefetch_threads() == []
    with pytest.raises(RuntimeError, match="a step failed"):
        train(Raising, images(delay=0.01), c, conv_model())
    assert prefetch_threads() == []


def test_a_staging_error_is_raised_when_the_loop_reaches_that_batch():
    """A damaged image in the epoch's third batch: the two batches before it are trained, then the
    error comes out of the loop (as the synchronous fetch raised it), and no thread is left."""
    ex = images()
    g = torch.Generator().manual_seed(0)
    third = list(old_batches(len(ex), 4, 3, g))[2]
    bad_piece_rows = {int(ex.row[r]) for r in third.tolist() if ex.piece[r] == 0}
    assert bad_piece_rows
    ex.maps[0].bad = bad_piece_rows
    seen = []

    class Counting(ClientMethod):
        name = "counting"

        def train(self, ctx):
            model, opt = ctx.model, self.start_round(ctx)
            return self.local_loop(ctx, lambda x, y: seen.append(1) or descend(
                opt, F.cross_entropy(model(x), y), ctx.record_step))

    with pytest.raises(DataError, match="damaged"):
        train(Counting, ex, cfg(local_steps=3), conv_model())
    assert len(seen) == 2 and prefetch_threads() == []


class Sleeping(ClientMethod):
    """A step that only waits ``step_s`` (a device step the host does not spend CPU on)."""

    name = "sleeping"
    step_s = 0.05

    def train(self, ctx):
        return self.local_loop(ctx, lambda x, y: time.sleep(self.step_s) or 1.0)


@pytest.mark.parametrize("depth", [2, 0])
def test_fetching_overlaps_the_step(monkeypatch, depth):
    """Fetch 50 ms and step 50 ms, sleeps both (CPU load does not matter): 12 steps of one epoch
    take < 1.5 x 12 x 50 ms with the prefetch (overlapped: about 13 x 50 ms); serial, the same loop
    takes 24 x 50 ms, which this test would reject (checked with ``depth`` 0)."""
    monkeypatch.setattr(prefetch, "PREFETCH_DEPTH", depth)
    n, steps, unit = 48, 12, 0.05
    ex = images(n=(n,), delay=unit)
    c = cfg(local_steps=steps, batch_size=4)
    t0 = time.perf_counter()
    (loss, done), _ = train(Sleeping, ex, c, conv_model())
    elapsed = time.perf_counter() - t0
    assert done == steps and loss == 1.0
    if depth:
        assert elapsed < 1.5 * steps * unit, elapsed
    else:
        assert elapsed >= 2 * steps * unit * 0.95, elapsed
