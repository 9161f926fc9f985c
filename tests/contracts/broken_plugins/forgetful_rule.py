"""Broken on purpose (tests/contracts/test_check_cli.py): a server rule with a momentum buffer it leaves out of
``state_dict``, so a run resumed from a checkpoint starts it from zero. `fedtune check` fails its
*checkpoint and resume* check."""

import numpy as np

import fedtune


class Forgetful(fedtune.ServerRule):
    spec = fedtune.ServerRuleSpec(name="forgetful", description="momentum left out of its checkpoint")

    def __init__(self, cfg, layout):
        super().__init__(cfg, layout)
        self.buffer = None

    def aggregate(self, params, updates, weights, *, extras, round, info):
        d = fedtune.weighted_sum(updates, np.asarray(weights, dtype=np.float64))
        self.buffer = d if self.buffer is None else 0.9 * self.buffer + d
        return fedtune.AggregateResult(fedtune.server_step(params, self.buffer, self.global_lr), {}, self.buffer)


fedtune.register(Forgetful)
