"""Broken on purpose (tests/contracts/test_check_cli.py): a server rule whose cross-field check divides by its
hyperparameter, which its declaration allows to be 0, so ``traceback_sharpness: 0`` is a
ZeroDivisionError instead of one ConfigError line. `fedtune check` fails its *hyperparameters* check."""

import fedtune

SHARPNESS = fedtune.HParam("traceback_sharpness", 1.0, "a sharpness >= 0", lo=0.0)


def check(cfg):
    if 1.0 / SHARPNESS.of(cfg) > 100:
        raise fedtune.ConfigError("field 'traceback_sharpness': below 0.01; allowed: >= 0.01")


class TracebackRule(fedtune.ServerRule):
    spec = fedtune.ServerRuleSpec(name="traceback-rule", hparams=(SHARPNESS,), check=check,
                                  description="a traceback on a value its declaration allows")

    def aggregate(self, params, updates, weights, *, extras, round, info):
        import numpy as np

        d = fedtune.weighted_sum(updates, np.asarray(weights, dtype=np.float64))
        return fedtune.AggregateResult(fedtune.server_step(params, d, self.global_lr), {}, d)


fedtune.register(TracebackRule)
