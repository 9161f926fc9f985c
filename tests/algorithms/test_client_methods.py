import sys
import subprocess

import pytest
import torch

from fedtune.algorithms.client.optim import LocalSGD
from fedtune.models import build_model


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3)])
def test_local_sgd_matches_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    torch.manual_seed(0)
    a = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    b = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.SGD(a.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    ours = LocalSGD(b.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    for i in range(5):
        for model, opt in ((a, ref), (b, ours)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i * 8:i * 8 + 32]), y[i * 8:i * 8 + 32]).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), build_model(
        "cnn", input_shape=(1, 28, 28), num_classes=10).parameters()))


def test_local_sgd_does_not_import_dynamo():
    # torch.optim.Optimizer's first use imports torch._dynamo (~2 s per fresh actor process).
    code = ("import sys, torch\nfrom fedtune.algorithms.client.optim import LocalSGD\n"
            "m = torch.nn.Linear(3, 2); o = LocalSGD(m.parameters(), lr=0.1, momentum=0.9)\n"
            "m(torch.randn(4, 3)).sum().backward(); o.step()\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
