"""Where each tensor of a model lives in the flat float32 weight vector (NumPy only).

Kept apart from :mod:`fedtune.models` so that processes which only aggregate (the coordinator)
can receive a layout without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    offset: int
    size: int
    is_param: bool


@dataclass(frozen=True)
class FlatLayout:
    """Where each floating tensor of a model lives in the flat vector.

    Parameters occupy ``[0, num_params)`` and floating buffers ``[num_params, size)``, so
    server rules work on ``vec[:num_params]`` and batch-norm statistics are averaged apart.
    """

    slots: tuple[TensorSlot, ...]
    num_params: int
    size: int

    @classmethod
    def of(cls, model: Any) -> "FlatLayout":
        param_names = {n for n, _ in model.named_parameters()}
        state = model.state_dict()
        params = [(n, t) for n, t in state.items() if n in param_names]
        buffers = [(n, t) for n, t in state.items() if n not in param_names and t.is_floating_point()]
        slots, offset = [], 0
        for group, is_param in ((params, True), (buffers, False)):
            for n, t in group:
                slots.append(TensorSlot(n, tuple(t.shape), offset, t.numel(), is_param))
                offset += t.numel()
        num_params = sum(s.size for s in slots if s.is_param)
        return cls(tuple(slots), num_params, offset)

    def param_slices(self) -> list[tuple[str, slice]]:
        """(name, slice) of each parameter tensor: per-tensor server rules use these."""
        return [(s.name, slice(s.offset, s.offset + s.size)) for s in self.slots if s.is_param]
