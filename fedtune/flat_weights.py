"""A model's weights as one flat float32 vector: :func:`get_flat`, :func:`set_flat` and
:func:`bind_flat`, the copies in and out of a model that every worker makes per client per round.

The vector holds every floating-point entry of the model's ``state_dict`` (parameters first, then
floating buffers such as batch-norm running statistics) where :class:`~fedtune.layout.FlatLayout`
puts it. Integer buffers (``num_batches_tracked``) stay local: they do not change what the model
computes with the default batch-norm momentum.

>>> from fedtune.models import build_model
>>> model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
>>> layout = FlatLayout.of(model)
>>> layout.num_params, layout.size
(22, 22)
>>> vec = get_flat(model, layout); vec.dtype, vec.flags.c_contiguous
(dtype('float32'), True)
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch
from torch import nn

from fedtune.layout import FlatLayout

# model -> its bind_flat buffer and each slot's address (weak: a deep copy of a model, which
# gets storage of its own, is not bound; a model that is dropped drops its entry)
_BOUND: "weakref.WeakKeyDictionary[nn.Module, tuple[torch.Tensor, list[int], int]]" = \
    weakref.WeakKeyDictionary()


def bind_flat(model: nn.Module, layout: FlatLayout) -> torch.Tensor | None:
    """Make the model's floating state live in one contiguous float32 buffer laid out as
    ``layout`` (each parameter and floating buffer re-pointed in place, ``Tensor.set_``, so every
    reference to it stays valid): :func:`set_flat` and :func:`get_flat` are then one copy each
    instead of one per tensor plus a ``state_dict()`` (a worker does both once per client per
    round: 144 → 14 µs for a 51k-parameter mlp, 29 → 24 ms for resnet18 on this CPU). The values
    and the arithmetic are unchanged. Returns the buffer (the one already bound, if the model is),
    or None, changing nothing, where the state cannot be one buffer: tensors on several devices,
    not float32, not contiguous (channels_last convolutions), or sharing memory (tied weights)."""
    bound = _bound_flat(model, layout)
    if bound is not None:
        return bound
    state = model.state_dict(keep_vars=True)
    tensors = [state[s.name] for s in layout.slots]
    if not tensors or len({t.device for t in tensors}) != 1:
        return None
    if any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
        return None
    if len({t.untyped_storage().data_ptr() for t in tensors}) != len(tensors):
        return None  # tied weights or views of one another: keep them as they are
    flat = torch.empty(layout.size, dtype=torch.float32, device=tensors[0].device)
    with torch.no_grad():
        for s, t in zip(layout.slots, tensors):
            view = flat[s.offset:s.offset + s.size].view(s.shape)
            view.copy_(t)
            t.set_(view)  # t now lives in view's memory
    ptrs = [flat.data_ptr() + 4 * s.offset for s in layout.slots]
    _BOUND[model] = (flat, ptrs, layout.size)
    return flat


def _bound_flat(model: nn.Module, layout: FlatLayout) -> torch.Tensor | None:
    """The buffer of :func:`bind_flat` while every tensor of the model's state still lives in it
    (a method that replaced a parameter or a module, or moved the model, unbinds it: the
    per-tensor path takes over). The check reads the model's current state (``keep_vars``: no
    copy, ~1/25 of one weight copy for resnet18)."""
    bound = _BOUND.get(model)
    if bound is None:
        return None
    flat, ptrs, size = bound
    if size != layout.size:
        return None
    state = model.state_dict(keep_vars=True)
    for s, p in zip(layout.slots, ptrs):
        t = state.get(s.name)
        if t is None or t.data_ptr() != p:
            return None
    return flat


def get_flat(model: nn.Module, layout: FlatLayout, out: np.ndarray | None = None) -> np.ndarray:
    """Copy the model's floating state into a contiguous float32 vector."""
    vec = np.empty(layout.size, dtype=np.float32) if out is None else out
    view = torch.from_numpy(vec)
    flat = _bound_flat(model, layout)
    with torch.no_grad():
        if flat is not None:
            view.copy_(flat)
            return vec
        state = model.state_dict()
        for s in layout.slots:
            view[s.offset:s.offset + s.size].copy_(state[s.name].detach().reshape(-1))
    return vec


def set_flat(model: nn.Module, layout: FlatLayout, vec: np.ndarray) -> None:
    """Load a flat vector (possibly a read-only zero-copy view) into the model in place."""
    if vec.shape != (layout.size,):
        raise ValueError(f"flat weights have shape {vec.shape}, the model needs ({layout.size},)")
    with warnings.catch_warnings():  # zero-copy views from Ray's object store are read-only; we only read
        warnings.simplefilter("ignore", UserWarning)
        src = torch.from_numpy(vec)
    flat = _bound_flat(model, layout)
    with torch.no_grad():
        if flat is not None:
            flat.copy_(src)
            return
        state = model.state_dict()
        for s in layout.slots:
            state[s.name].copy_(src[s.offset:s.offset + s.size].view(s.shape))
