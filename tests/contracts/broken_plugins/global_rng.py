"""Broken on purpose (tests/contracts/test_check_cli.py): a client method that scales its loss by a draw from
NumPy's global generator, which fedtune does not seed, so two runs of one config differ.
`fedtune check` fails its *determinism* check."""

import numpy as np
from torch.nn import functional as F

import fedtune


class GlobalRng(fedtune.ClientMethod):
    spec = fedtune.ClientMethodSpec(name="global-rng", description="draws from NumPy's global RNG")

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        scale = float(np.random.uniform(0.5, 1.5))
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, scale * F.cross_entropy(model(x), y),
                                                                 ctx.record_step))


fedtune.register(GlobalRng)
