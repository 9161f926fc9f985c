"""Small helpers shared by the client worker and the coordinator (threads, devices, seeds, eval)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def torch_threads(cpus: float) -> int:
    """Torch intra-op threads for a process holding ``cpus`` CPUs: ``max(1, floor(cpus))``."""
    return max(1, int(math.floor(cpus + 1e-9)))


def set_torch_threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:  # only possible before the first parallel region of the process
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def pick_device(want_gpu: bool) -> "torch.device":  # noqa: F821
    """CUDA only when a GPU was assigned to this process and CUDA works; else CPU."""
    import torch

    if want_gpu and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def assigned_gpu_ids() -> list:
    """GPU ids Ray assigned to the current actor ([] outside Ray or without GPUs)."""
    try:
        import ray

        if ray.is_initialized():
            return list(ray.get_gpu_ids())
    except Exception:  # pragma: no cover - outside a Ray worker
        pass
    return []


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, client id, round, ...), identical in every process."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0] >> 1)


@dataclass
class EvalCounts:
    correct: int = 0
    count: int = 0
    loss_sum: float = 0.0

    def add(self, other: "EvalCounts") -> None:
        self.correct += other.correct
        self.count += other.count
        self.loss_sum += other.loss_sum

    @property
    def acc(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")


def evaluate(model, examples, batch_size: int, precision: str = "fp32", max_mib: float | None = None) -> EvalCounts:
    """Accuracy counts and summed cross-entropy of ``model`` (eval mode) on ``examples``
    (:class:`fedtune.runtime.examples.Examples`), streamed in batches of ``batch_size`` (fewer
    where a batch's inputs would pass ``max_mib`` MiB), never augmented, forward passes under
    ``precision`` (the loss summed in float32). One batch is alive at a time: each is freed before
    the next is fetched."""
    import torch

    from fedtune.algorithms.client.precision import autocast

    out = EvalCounts()
    if len(examples) == 0:
        return out
    model.eval()
    with torch.no_grad():
        for xb, yb in examples.batches(batch_size, max_mib):
            with autocast(xb.device, precision):
                logits = model(xb)
            del xb  # the batch's inputs go before the next batch is made
            logits = logits.float()
            out.loss_sum += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
            out.correct += int((logits.argmax(1) == yb).sum())
            out.count += len(yb)
            del logits, yb
    return out
