"""Broken on purpose (tests/contracts/test_check_cli.py): a client method whose loss is NaN from its first
step. `fedtune check` fails its *finite first step* check."""

from torch.nn import functional as F

import fedtune


class NanStep(fedtune.ClientMethod):
    spec = fedtune.ClientMethodSpec(name="nan-step", description="a NaN loss")

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, F.cross_entropy(model(x), y) * float("nan"),
                                                                 ctx.record_step))


fedtune.register(NanStep)
