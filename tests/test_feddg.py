"""FedDG (client method ``feddg``, docs/methods.md §23): the amplitude interpolation against a float64
NumPy replay of Bai et al.'s ``_amp_spectrum_swap`` (both windows), r = 1 is the identity, the source
bank is every source client's training examples on every worker, local steps against a float64
reference that draws the same random numbers, and bad input in one line."""

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


def test_local_steps_follow_a_float64_reference_drawing_the_same_numbers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.ReLU(), nn.Linear(5, 3))
    ref = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 3, (10,))
    bank_x = torch.randn(7, 3, 4, 4)
    data, bank = TensorExamples(x, y), TensorExamples(bank_x, torch.zeros(7, dtype=torch.int64))
    cfg = _cfg(feddg_ratio_low=0.2, feddg_ratio_high=0.7)
    FedDG(cfg).train(_ctx(model, data, bank, cfg))

    gen = torch.Generator().manual_seed(5)  # the reference draws in the method's order from the same stream
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for idx in batches(10, 4, 3, gen):
        window = float(torch.rand((), generator=gen))
        ratio = 0.2 + 0.5 * float(torch.rand((), generator=gen))
        rows = torch.randint(7, (len(idx),), generator=gen)
        mixed = _reference_mix(x[idx].double().numpy(), bank_x[rows].double().numpy(), window, ratio, False)
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
    assert rows("c", feddg_ratio_low=1.0) != mixed


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
    with pytest.raises(ConfigError, match=r"^fields 'feddg_ratio_low'/'feddg_ratio_high': .* low 0.8 > high 0.2; "
                                          r"allowed: low <= high$"):
        _cfg(feddg_ratio_low=0.8, feddg_ratio_high=0.2)
    with pytest.raises(ConfigError, match=r"^field 'feddg_window' \(client method feddg\): 'corner' is not allowed"):
        _cfg(feddg_window="corner")
