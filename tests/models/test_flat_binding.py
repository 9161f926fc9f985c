"""bind_flat: a model's floating state in one buffer, so a worker loads and reads it in one copy
(issue 29 item 1). Same values, same arithmetic, and a safe fall-back when the binding breaks."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.layout import FlatLayout
from fedtune.models import build_model
from fedtune.flat_weights import _bound_flat, bind_flat, get_flat, set_flat


def per_tensor(model: nn.Module, layout: FlatLayout) -> np.ndarray:
    """The flat vector written out tensor by tensor (the reference, independent of the binding)."""
    state = model.state_dict()
    return np.concatenate([state[s.name].detach().reshape(-1).numpy() for s in layout.slots]).astype(np.float32)


def train_steps(model: nn.Module, shape: tuple[int, ...], steps: int = 3) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 28, 28)), ("resnet18", (3, 16, 16))])
def test_a_bound_model_loads_trains_and_reads_out_the_same_bits_as_an_unbound_one(name, shape):
    runs = {}
    for bound in (False, True):
        torch.manual_seed(0)
        model = build_model(name, input_shape=shape, num_classes=10, mlp_hidden=[16])
        layout = FlatLayout.of(model)
        start = per_tensor(model, layout)
        assert bind_flat(model, layout) is not None if bound else _bound_flat(model, layout) is None
        assert np.array_equal(get_flat(model, layout), start)  # binding changed no value
        weights = np.random.default_rng(2).standard_normal(layout.size).astype(np.float32)
        weights.setflags(write=False)  # as Ray's zero-copy views arrive
        set_flat(model, layout, weights)
        assert np.array_equal(per_tensor(model, layout), weights)
        train_steps(model, shape)  # batch norm's running statistics move too (resnet18)
        out = np.full(layout.size, np.nan, np.float32)
        get_flat(model, layout, out=out)
        assert np.array_equal(out, per_tensor(model, layout))
        runs[bound] = out
    assert not np.array_equal(runs[True], weights)  # it trained
    assert np.array_equal(runs[True], runs[False])


def test_the_state_lives_in_one_buffer_in_the_layouts_order():
    model = build_model("resnet18", input_shape=(3, 16, 16), num_classes=4, mlp_hidden=[])
    layout = FlatLayout.of(model)
    flat = bind_flat(model, layout)
    assert flat is not None and _bound_flat(model, layout) is flat
    state = model.state_dict(keep_vars=True)
    for s in layout.slots:  # every parameter and floating buffer is a view of its slot
        assert state[s.name].data_ptr() == flat.data_ptr() + 4 * s.offset
    flat.zero_()
    assert all(float(state[s.name].detach().abs().sum()) == 0.0 for s in layout.slots)
    assert state["bn1.num_batches_tracked"].dtype == torch.int64  # integer buffers are not in it
    assert bind_flat(model, layout) is flat  # binding a bound model again returns its buffer


def test_a_replaced_parameter_falls_back_to_the_per_tensor_copy():
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, mlp_hidden=[5])
    layout = FlatLayout.of(model)
    assert bind_flat(model, layout) is not None
    lin = next(m for m in model.modules() if isinstance(m, nn.Linear))
    lin.weight = nn.Parameter(torch.ones_like(lin.weight))  # a method that swaps a parameter
    assert _bound_flat(model, layout) is None
    assert np.array_equal(get_flat(model, layout), per_tensor(model, layout))
    weights = np.arange(layout.size, dtype=np.float32)
    set_flat(model, layout, weights)
    assert np.array_equal(per_tensor(model, layout), weights)


def test_a_deep_copy_is_not_bound_and_keeps_its_own_values():
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, mlp_hidden=[5])
    layout = FlatLayout.of(model)
    assert bind_flat(model, layout) is not None
    twin = copy.deepcopy(model)  # e.g. a method's frozen copy of the global model
    assert _bound_flat(twin, layout) is None
    set_flat(model, layout, np.zeros(layout.size, np.float32))
    assert np.abs(get_flat(twin, layout)).sum() > 0  # the copy does not share the buffer


def test_a_replaced_module_falls_back_too():
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, mlp_hidden=[5])
    layout = FlatLayout.of(model)
    assert bind_flat(model, layout) is not None
    model[3] = nn.Linear(5, 3)  # a new head, same shapes
    assert _bound_flat(model, layout) is None
    weights = np.arange(layout.size, dtype=np.float32)
    set_flat(model, layout, weights)
    assert np.array_equal(per_tensor(model, layout), weights)


def test_tied_weights_and_channels_last_stay_unbound():
    tied = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    layout = FlatLayout.of(tied)
    assert bind_flat(tied, layout) is None and _bound_flat(tied, layout) is None
    conv = nn.Sequential(nn.Conv2d(3, 4, 3)).to(memory_format=torch.channels_last)
    assert bind_flat(conv, FlatLayout.of(conv)) is None
    assert np.array_equal(get_flat(conv, FlatLayout.of(conv)), per_tensor(conv, FlatLayout.of(conv)))
