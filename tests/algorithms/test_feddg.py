"""FedDG (client method ``feddg``, docs/methods-benchmark.md §23): the amplitude interpolation against a float64
NumPy replay of Bai et al.'s ``_amp_spectrum_swap`` (both windows) and of ELCFS's ``low_freq_mutate_np``
at its training's L = 0 (the default ``feddg_window: dc``), r = 1 is the identity, the source bank is
every source client's training examples on every worker, local steps under ``dc`` and ``centred`` against a
float64 reference that draws the same random numbers, new trial ids, and bad input in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.feddg import FedDG, amplitude_mix
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reference_mix(x: np.ndarray, bank: np.ndarray, window: float, ratio: float, wrap: bool) -> np.ndarray:
    """Bai et al.'s FourierMixup in float64: amp/pha of x, the bank's amp, their window arithmetic."""
    fx = np.fft.fft2(x)
    amp, pha = np.abs(fx), np.angle(fx)
    a = np.fft.fftshift(amp, axes=(-2, -1)).copy()
    t = np.fft.fftshift(np.abs(np.fft.fft2(bank)), axes=(-2, -1))
    h, w = a.shape[-2:]
    b = int(min(h, w) * window)
    ch, cw = int(h / 2), int(w / 2)
    h1, w1 = ch - b, cw - b
    if not wrap:
        h1, w1 = max(h1, 0), max(w1, 0)
    a[..., h1:ch + b + 1, w1:cw + b + 1] = a[..., h1:ch + b + 1, w1:cw + b + 1] * ratio \
        + t[..., h1:ch + b + 1, w1:cw + b + 1] * (1 - ratio)
    return np.real(np.fft.ifft2(np.fft.ifftshift(a, axes=(-2, -1)) * np.exp(1j * pha)))


def _elcfs_mutate(x: np.ndarray, bank: np.ndarray, L: float, ratio: float | None) -> np.ndarray:
    """ELCFS's source_to_target_freq / low_freq_mutate_np (github:liuquande/FedDG-ELCFS,
    dataloaders/fundus_dataloader.py) in float64, image by image: ``ratio=None`` is its training's
    swap ``a_src[:, h1:h2, w1:w2] = a_trg[...]``, a number its commented-out interpolation
    ``a_src * ratio + a_trg * (1 - ratio)``. Its clip to [0, 255] is for uint8 images, left out."""
    out = np.empty_like(x)
    for i, (img, other) in enumerate(zip(x, bank)):
        fft_src = np.fft.fft2(img, axes=(-2, -1))
        amp_src, pha_src = np.abs(fft_src), np.angle(fft_src)
        amp_trg = np.abs(np.fft.fft2(other, axes=(-2, -1)))  # the stored amplitude of a target image
        a_src = np.fft.fftshift(amp_src, axes=(-2, -1))
        a_trg = np.fft.fftshift(amp_trg, axes=(-2, -1))
        _, h, w = a_src.shape
        b = (np.floor(np.amin((h, w)) * L)).astype(int)
        c_h, c_w = np.floor(h / 2.0).astype(int), np.floor(w / 2.0).astype(int)
        h1, h2, w1, w2 = c_h - b, c_h + b + 1, c_w - b, c_w + b + 1
        if ratio is None:
            a_src[:, h1:h2, w1:w2] = a_trg[:, h1:h2, w1:w2]
        else:
            a_src[:, h1:h2, w1:w2] = a_src[:, h1:h2, w1:w2] * ratio + a_trg[:, h1:h2, w1:w2] * (1 - ratio)
        a_src = np.fft.ifftshift(a_src, axes=(-2, -1))
        out[i] = np.real(np.fft.ifft2(a_src * np.exp(1j * pha_src), axes=(-2, -1)))
    return out


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (1, 1, 7, 9), (2, 3, 9, 6)])
def test_window_zero_is_elcfs_dc_swap_and_moves_only_the_channel_means(shape):
    rng = np.random.default_rng(1)
    x, bank = rng.normal(size=shape), rng.normal(size=shape) + 2.0
    tx, tb = torch.from_numpy(x).float(), torch.from_numpy(bank).float()
    swapped = amplitude_mix(tx, tb, 0.0, 0.0)
    np.testing.assert_allclose(swapped.numpy(), _elcfs_mutate(x, bank, 0.0, None), atol=2e-5)
    np.testing.assert_allclose(amplitude_mix(tx, tb, 0.0, 0.3).numpy(), _elcfs_mutate(x, bank, 0.0, 0.3), atol=2e-5)
    # the DC term alone: the images keep their deviations from their channel means; each mean's size is
    # the bank image's, its sign the image's own (the phase)
    centred = x - x.mean(axis=(-2, -1), keepdims=True)
    np.testing.assert_allclose(swapped.numpy() - swapped.numpy().mean(axis=(-2, -1), keepdims=True), centred,
                               atol=2e-5)
    np.testing.assert_allclose(swapped.numpy().mean(axis=(-2, -1)),
                               np.sign(x.mean(axis=(-2, -1))) * np.abs(bank.mean(axis=(-2, -1))), atol=2e-5)


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (1, 1, 7, 9)])
@pytest.mark.parametrize("window, ratio", [(0.0, 0.3), (0.2, 0.5), (0.45, 0.0), (0.8, 0.6), (1.0, 0.25)])
@pytest.mark.parametrize("wrap", [False, True])
def test_the_mix_matches_a_float64_replay_of_the_authors_swap(shape, window, ratio, wrap):
    rng = np.random.default_rng(0)
    x, bank = rng.normal(size=shape), rng.normal(size=shape)
    got = amplitude_mix(torch.from_numpy(x).float(), torch.from_numpy(bank).float(), window, ratio, wrap)
    assert got.dtype == torch.float32 and got.shape == x.shape
    np.testing.assert_allclose(got.numpy(), _reference_mix(x, bank, window, ratio, wrap), atol=2e-5)


def test_ratio_one_is_the_identity_and_the_windows_differ_only_past_a_half():
    x, bank = torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16)
    np.testing.assert_allclose(amplitude_mix(x, bank, 0.9, 1.0).numpy(), x.numpy(), atol=2e-5)
    assert torch.equal(amplitude_mix(x, bank, 0.4, 0.3), amplitude_mix(x, bank, 0.4, 0.3, wrap=True))
    assert not torch.allclose(amplitude_mix(x, bank, 0.8, 0.3), amplitude_mix(x, bank, 0.8, 0.3, wrap=True))
    cl = x.contiguous(memory_format=torch.channels_last)
    assert amplitude_mix(cl, bank, 0.3, 0.5).is_contiguous(memory_format=torch.channels_last)


def test_every_worker_holds_the_whole_source_bank():
    from fedtune.runtime.driver import build_plan
    from fedtune.runtime.worker import ClientWorker

    cfg = FederatedRunConfig.from_dict({"algorithm": "feddg", "num_clients": 4, "rounds": 1, "backend": "local"})
    plan = build_plan(cfg)
    pieces = plan.source_train_pieces()
    sources = [c for c in plan.clients if c.role == "source"]
    assert sum(len(v) for v in pieces.values()) == sum(c.num_train for c in sources)
    assert set(pieces) == set(plan.source_domains)
    a = ClientWorker(cfg.to_dict(), [plan.clients[0]], 0, [], manage_threads=False, source_bank=pieces)
    b = ClientWorker(cfg.to_dict(), list(plan.clients[1:]), 1, [], manage_threads=False, source_bank=pieces)
    rows = torch.arange(len(a.source_bank))
    assert len(a.source_bank) == len(b.source_bank) == sum(c.num_train for c in sources)
    assert torch.equal(a.source_bank.batch(rows)[0], b.source_bank.batch(rows)[0])
    other = ClientWorker(FederatedRunConfig.from_dict({"algorithm": "fedavg", "rounds": 1, "backend": "local"})
                         .to_dict(), [plan.clients[0]], 0, [], manage_threads=False)
    assert other.source_bank is None  # only a method that declares it builds one
    with pytest.raises(ValueError, match="^client method feddg samples the source bank: pass source_bank="):
        ClientWorker(cfg.to_dict(), [plan.clients[0]], 0, [], manage_threads=False)


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "feddg", "local_steps": 3, "batch_size": 4,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def _ctx(model, data, bank, cfg, seed=5):
    return ClientContext(model=model, data=data, cfg=cfg, round=1, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"), source_bank=bank)


@pytest.mark.parametrize("window", ["dc", "centred"])
def test_local_steps_follow_a_float64_reference_drawing_the_same_numbers(window):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.ReLU(), nn.Linear(5, 3))
    ref = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 3, (10,))
    bank_x = torch.randn(7, 3, 4, 4)
    data, bank = TensorExamples(x, y), TensorExamples(bank_x, torch.zeros(7, dtype=torch.int64))
    cfg = _cfg(feddg_ratio_low=0.2, feddg_ratio_high=0.7, **({} if window == "dc" else {"feddg_window": window}))
    FedDG(cfg).train(_ctx(model, data, bank, cfg))

    gen = torch.Generator().manual_seed(5)  # the reference draws in the method's order from the same stream
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for idx in batches(10, 4, 3, gen):
        L = float(torch.rand((), generator=gen)) if window == "centred" else None  # Bai: L ~ U(0, 1)
        ratio = 0.2 + 0.5 * float(torch.rand((), generator=gen))
        rows = torch.randint(7, (len(idx),), generator=gen)
        xs, bs = x[idx].double().numpy(), bank_x[rows].double().numpy()
        mixed = _elcfs_mutate(xs, bs, 0.0, ratio) if L is None else _reference_mix(xs, bs, L, ratio, False)
        loss = nn.functional.cross_entropy(ref(torch.from_numpy(mixed)), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_a_run_is_reproducible_and_mixing_changes_it(tmp_path):
    from fedtune.runtime.driver import run

    def rows(name, **kw):
        cfg = FederatedRunConfig.from_dict({"algorithm": "feddg", "num_clients": 3, "rounds": 2, "local_steps": 3,
                                            "backend": "local", "output": str(tmp_path / name), **kw})
        res = run(cfg, progress=False)
        assert res.status == "completed"
        return [(r["train_loss"], r["val_acc"]) for r in res.rows]

    mixed = rows("a")
    assert rows("b") == mixed
    assert rows("c", feddg_ratio_low=1.0, feddg_ratio_high=1.0) != mixed  # nothing mixed
    # r is drawn between the two ends in either order: (0.8, 0.2) is the same draw as (0.2, 0.8) mirrored
    assert rows("d", feddg_ratio_low=0.8, feddg_ratio_high=0.2) != mixed


def test_bad_input_is_one_line():
    model, cfg = nn.Linear(4, 3), _cfg()
    vectors = TensorExamples(torch.randn(6, 4), torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ConfigError, match=r"^client method feddg: needs images \(C, H, W\), the dataset's examples "
                                          r"have shape \(4,\); use an image dataset$"):
        FedDG(cfg).train(_ctx(model, vectors, vectors, cfg))
    from fedtune.runtime.driver import build_plan

    with pytest.raises(ConfigError, match=r"^field 'client_method': feddg needs images \(C, H, W\) but dataset 'rect4' "
                                          r"gives vectors of shape \(2,\); use an image dataset$"):
        build_plan(FederatedRunConfig.from_dict({"algorithm": "feddg", "dataset": "rect4"}))
    with pytest.raises(ConfigError, match="^client method feddg: the run has no source bank"):
        FedDG(cfg).train(_ctx(model, vectors, None, cfg))
    with pytest.raises(ConfigError, match=r"^field 'feddg_window' \(client method feddg\): 'corner' is not allowed"):
        _cfg(feddg_window="corner")
    with pytest.raises(ConfigError, match=r"^field 'feddg_window' \(client method feddg\): 'uniform' is not "
                                          r"allowed.*dc, centred, bai"):
        _cfg(feddg_window="uniform")


def test_runs_at_the_new_defaults_get_new_trial_ids_and_runs_that_set_them_keep_theirs(monkeypatch):
    import fedtune.trial_ids as trial_ids

    old_range = {"feddg_ratio_low": 0.0, "feddg_ratio_high": 1.0}  # the default range until issue 44

    def ids():
        out = {w: FederatedRunConfig.from_dict({"algorithm": "feddg", **({} if w is None else {"feddg_window": w})})
               .trial_id() for w in (None, "dc", "centred", "bai")}
        out.update({f"{w}+range": FederatedRunConfig.from_dict({"algorithm": "feddg", "feddg_window": w, **old_range})
                    .trial_id() for w in ("centred", "bai")})
        return out

    now = ids()
    assert now[None] == now["dc"] and len(set(now.values())) == 5
    monkeypatch.setattr(trial_ids, "params_roles",  # the hash of the set params only (before)
                        lambda roles=trial_ids.params_roles(): (roles[0], ()))
    before = ids()
    assert before[None] != now[None]  # unset ran centred at r ~ U(0, 1) before: another id now
    assert before["centred"] != now["centred"]  # the window set, the ratio's default changed: another id
    assert (before["centred+range"], before["bai+range"]) == (now["centred+range"], now["bai+range"])
