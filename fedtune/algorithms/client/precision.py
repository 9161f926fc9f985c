"""Client numeric precision: ``precision: fp32 | bf16 | fp16`` through ``torch.autocast``.

Forward passes and losses of a local step (and evaluation) run under ``torch.autocast`` with the
chosen dtype; backward passes run outside it (:func:`autocast_off`, as PyTorch's AMP recipe
does); parameters, optimiser state and the weights sent to the server stay float32. ``fp16``
adds a ``torch.amp.GradScaler`` for the round (dynamic loss scaling; a step whose gradients are
not finite is skipped and the scale lowered). ``fp16`` needs CUDA; ``bf16`` runs on CPU
autocast and on CUDA devices that support it (:func:`check_device`). The names a config may give
(``precision``) are :data:`fedtune.algorithms.PRECISIONS`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from fedtune.errors import ConfigError


def autocast(device: Any, precision: str) -> contextlib.AbstractContextManager:
    """The context a forward pass runs in: ``torch.autocast`` for bf16/fp16, else nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Leave any autocast region of ``device_type`` (for backward passes)."""
    if not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def check_device(precision: str, device: Any) -> None:
    """Raise a ConfigError when ``device`` cannot run ``precision`` (naming what can)."""
    kind = torch.device(device).type
    if precision == "fp16" and kind != "cuda":
        raise ConfigError(f"field 'precision': fp16 needs a CUDA device, but this client runs on {kind}; "
                          "allowed here: fp32, bf16 (set client_gpus > 0 on a GPU cluster for fp16)")
    if precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("field 'precision': bf16 is not supported by this GPU; allowed here: fp32, fp16")


def grad_scaler(device: Any, precision: str):
    """A fresh ``torch.amp.GradScaler`` for an fp16 round, else None."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)
