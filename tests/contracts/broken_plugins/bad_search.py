"""Broken on purpose (tests/contracts/test_check_cli.py): a client method whose hyperparameter's search
distribution reaches outside its bounds, so a sweep would sample values its runs refuse.
`fedtune check` fails its *hyperparameters* check."""

from torch.nn import functional as F

import fedtune

WEIGHT = fedtune.HParam("bad_search_weight", 0.5, "a weight in [0, 1]", lo=0.0, hi=1.0,
                        search={"distribution": "uniform", "low": 0.0, "high": 2.0, "default": 0.5})


class BadSearch(fedtune.ClientMethod):
    spec = fedtune.ClientMethodSpec(name="bad-search", hparams=(WEIGHT,), description="search outside its bounds")

    def train(self, ctx):
        model, opt = ctx.model, self.start_round(ctx)
        return self.local_loop(ctx, lambda x, y: fedtune.descend(opt, F.cross_entropy(model(x), y), ctx.record_step))


fedtune.register(BadSearch)
