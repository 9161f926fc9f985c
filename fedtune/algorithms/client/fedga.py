"""FedGA's client hook: each participant's validation loss and accuracy of the global model it
received and of its trained model (docs/methods-baselines.md §13), returned as the extras
:data:`~fedtune.algorithms.server.fedga.GAP_KEYS` (float64 ``[1]``) that the rule forms its
generalization gaps from. The received model is evaluated before the client's round is seeded, so
an evaluation that draws random numbers (FedSR with ``fedsr_eval_samples > 0``) does not shift
the training's."""

from __future__ import annotations

import numpy as np

from fedtune.algorithms.client.method import ClientContext, ClientOutcome
from fedtune.algorithms.client.hooks import ClientHook, WorkerView
from fedtune.algorithms.server.fedga import ACC_GLOBAL, ACC_LOCAL, LOSS_GLOBAL, LOSS_LOCAL


class GeneralizationGap(ClientHook):
    """Evaluates the received model before training and the trained one after it, on the client's
    validation split (eval mode, un-augmented; NaN for an empty split)."""

    def __init__(self, view: WorkerView):
        super().__init__(view)
        self._received: dict[int, tuple[float, float]] = {}

    def before_seed(self, client_id: int) -> None:
        self._received[client_id] = self.view.evaluate(client_id, "val")

    def after_train(self, ctx: ClientContext, outcome: ClientOutcome) -> dict[str, np.ndarray]:
        received = self._received.pop(ctx.client_id)
        trained = self.view.evaluate(ctx.client_id, "val")
        return {key: np.array([value], np.float64) for key, value in (
            (LOSS_GLOBAL, received[0]), (LOSS_LOCAL, trained[0]), (ACC_GLOBAL, received[1]), (ACC_LOCAL, trained[1]))}


__all__ = ["GeneralizationGap"]
