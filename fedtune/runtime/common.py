"""Small helpers shared by the client worker and the coordinator (threads, devices, seeds, eval)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def torch_threads(cpus: float) -> int:
    """Torch intra-op threads for a process holding ``cpus`` CPUs: ``max(1, floor(cpus))``."""
    return max(1, int(math.floor(cpus + 1e-9)))


def set_torch_threads(n: int) -> None:
    import torch  # lazy: keeps torch out of this module's import

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:  # only possible before the first parallel region of the process
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def pick_device(want_gpu: bool) -> "torch.device":  # noqa: F821
    """CUDA only when a GPU was assigned to this process and CUDA works; else CPU."""
    import torch  # lazy: keeps torch out of this module's import

    if want_gpu and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def assigned_gpu_ids() -> list:
    """GPU ids Ray assigned to the current actor ([] outside Ray or without GPUs)."""
    try:
        import ray  # lazy: keeps ray out of this module's import

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
    # int64 (3, classes): per class, how many examples are of it, predicted as it, and both; None
    # where nothing counted them (the probe's counts)
    per_class: np.ndarray | None = None

    def add(self, other: "EvalCounts") -> None:
        self.correct += other.correct
        self.count += other.count
        self.loss_sum += other.loss_sum
        if other.per_class is not None:
            self.per_class = other.per_class.copy() if self.per_class is None else self.per_class + other.per_class

    @property
    def macro_f1(self) -> float:
        """WILDS' macro-F1: the mean over the classes present among the true labels of
        ``2 TP / (true + predicted)`` (sklearn's ``f1_score(average="macro", labels=unique(y_true))``).

        >>> EvalCounts(3, 4, 0.0, np.array([[2, 2], [1, 3], [1, 2]])).macro_f1  # F1 2/3 and 4/5
        0.7333333333333334
        """
        if self.per_class is None or not self.per_class[0].any():
            return float("nan")
        true, pred, tp = self.per_class.astype(np.float64)
        present = true > 0
        return float(np.mean(2 * tp[present] / (true[present] + pred[present])))

    @property
    def acc(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")


def evaluate(model, examples, batch_size: int, precision: str = "fp32", max_mib: float | None = None) -> EvalCounts:
    """Accuracy counts, per-class counts (macro-F1) and summed cross-entropy of ``model`` (eval mode) on ``examples``
    (:class:`fedtune.runtime.examples.Examples`), streamed in batches of ``batch_size`` (fewer
    where a batch's inputs would pass ``max_mib`` MiB), never augmented, forward passes under
    ``precision`` (the loss summed in float32). One batch is alive at a time: each is freed before
    the next is fetched."""
    # lazy: keeps torch out of this module's import
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
            pred = logits.argmax(1)
            k = logits.shape[1]
            counts = torch.stack([torch.bincount(yb, minlength=k), torch.bincount(pred, minlength=k),
                                  torch.bincount(yb[pred == yb], minlength=k)]).cpu().numpy().astype(np.int64)
            out.add(EvalCounts(int(counts[2].sum()), len(yb), 0.0, counts))
            del logits, yb, pred
    return out
