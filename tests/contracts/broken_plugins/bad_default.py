"""Broken on purpose (tests/contracts/test_check_cli.py): a client method whose hyperparameter's default lies
outside its own bounds. `fedtune check` fails its *hyperparameters* check."""

from torch.nn import functional as F

import fedtune

CLIP = fedtune.HParam("bad_default_clip", 5.0, "a weight in [0, 1] whose default is 5", lo=0.0, hi=1.0)


class BadDefault(fedtune.ClientMethod):
    spec = fedtune.ClientMethodSpec(name="bad-default", hparams=(CLIP,), description="default outside its bounds")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clip = float(CLIP.of(cfg))

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, F.cross_entropy(model(x), y), ctx.record_step))


fedtune.register(BadDefault)
