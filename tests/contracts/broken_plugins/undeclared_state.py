"""Broken on purpose (tests/contracts/test_check_cli.py): a client method that keeps a count in ``ctx.state``
between rounds but declares ``keeps_client_state=False``, so a roaming client would lose it.
`fedtune check` fails its *keeps_client_state* check."""

from torch.nn import functional as F

import fedtune


class UndeclaredState(fedtune.ClientMethod):
    spec = fedtune.ClientMethodSpec(name="undeclared-state", description="keeps ctx.state undeclared")

    def train(self, ctx):
        ctx.state["rounds_seen"] = ctx.state.get("rounds_seen", 0) + 1
        model, opt = ctx.model, self.start_round(ctx)
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, F.cross_entropy(model(x), y), ctx.record_step))


fedtune.register(UndeclaredState)
