"""The server optimisers declared once: their hyperparameters and specs (as
:mod:`fedtune.algorithms.declarations` declares the client methods and server rules).

A server optimiser turns a server rule's direction into the step (FedAvgM, FedAdam, FedYogi,
FedAdagrad: Reddi et al. 2021; ``sgd``: the rule's own step). An adaptive one declares its own
learning rate, what ``global_lr`` is when unset (``default_lr``: :data:`ADAPTIVE_LR`, 1e-3, for all
three; docs/methods-server.md §14.2); sgd and avgm step at the rule's (FedAvg 1.0, as Hsu et al.'s
FedAvgM). Torch-free and NumPy-free like the
other declarations; the registry :data:`fedtune.algorithms.SERVER_OPTIMIZERS` is built from
:data:`SERVER_OPTIMIZER_SPECS`, the code lives in :mod:`fedtune.algorithms.server.optimizer`.
"""

from __future__ import annotations

from fedtune.algorithms.base import HParam, ServerOptimizerSpec, search_categorical, search_loguniform

SERVER_MOMENTUM = HParam("server_momentum", 0.9, "server_optimizer avgm: server momentum mu (v <- mu v + delta)",
                         lo=0.0, hi=1.0,
                         search={**search_categorical([0.9, 0.97, 0.99], 0.9), "help": "FedAvgM momentum (Hsu et al. 2019)"})
SERVER_BETA1 = HParam("server_beta1", 0.9, "server_optimizer adam/yogi: first-moment decay beta1 in [0, 1) (1: m "
                      "stays 0, the model never moves)", lo=0.0, hi=1.0, hi_open=True,
                      search={"distribution": "fixed", "value": 0.9, "help": "fixed as in Reddi et al. 2021"})
SERVER_BETA2 = HParam("server_beta2", 0.99, "server_optimizer adam/yogi: second-moment decay beta2 in [0, 1) (1: v "
                      "stays at its start, the step m / (2 tau) explodes)", lo=0.0, hi=1.0, hi_open=True,
                      search={"distribution": "fixed", "value": 0.99, "help": "fixed as in Reddi et al. 2021"})
SERVER_TAU = HParam("server_tau", 1e-9, "server_optimizer adam/yogi/adagrad: adaptivity tau in m / (sqrt(v) + tau) "
                    "(older Flower FedAdam's default 1e-9, current Flower's 1e-3; Reddi et al. tune it over "
                    "1e-10..1)", lo=0.0, lo_open=True,
                    search={**search_loguniform(1e-9, 0.1, 1e-3), "help": "adaptivity tau (Reddi et al. 2021: powers of ten)"})
SERVER_ADAM_BIAS_CORRECTION = HParam(
    "server_adam_bias_correction", False, "server_optimizer adam: false = Reddi et al.'s Algorithm 2 (no bias "
    "correction), true = Flower's FedAdam (eta * sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1)) at round t)",
    kind="bool", variant=True,
    search={**search_categorical([False, True], False), "help": "false: Reddi et al.'s Algorithm 2; true: Flower's FedAdam"})
SERVER_V_START = HParam(
    "server_v_start", "tau_squared", "server_optimizer adam/yogi/adagrad: the second moment's start, tau_squared = "
    "Reddi et al.'s Algorithm 2 (v_-1 = tau^2), zero = Flower's FedAdam/FedYogi/FedAdagrad (v starts at 0)",
    kind="choice", choices=("tau_squared", "zero"), variant=True, trial_id="when_set",  # declared after studies ran
    search={"distribution": "fixed", "value": "tau_squared", "help": "v starts at tau^2 as in Reddi et al.'s "
            "Algorithm 2 (a variant, not a knob: zero is Flower's start)"})

_ADAPTIVE = (SERVER_BETA1, SERVER_BETA2, SERVER_TAU, SERVER_V_START)

# global_lr when unset under adam, yogi and adagrad (docs/methods-server.md §14.2). At the default tau (1e-9)
# their first steps m / (sqrt(v) + tau) are about +-1 per coordinate whatever the rule's scale, so eta
# is the step of every weight: Adam's own step size alpha = 1e-3 (Kingma and Ba 2015; torch's and
# Keras's Adam default, Keras's Adagrad default). Flower's eta (FedAdam 0.1, FedYogi 0.01, FedAdagrad
# 0.1) and Reddi et al.'s best server rates (10^-2.5 .. 10^0 for Adam and Yogi) go with their larger
# tau (Flower's current strategies 1e-3; Reddi et al. recommend 1e-3 and tune 1e-5 .. 1e-1): at tau
# 1e-9 the default run diverges at 0.1 and at 0.01 kills the network (training loss 8.6 in round 2,
# ln 10, chance, from round 4 on), where 1e-3 trains every round (measured, §14.2).
ADAPTIVE_LR = 1e-3

SERVER_OPTIMIZER_SPECS: tuple[ServerOptimizerSpec, ...] = (
    ServerOptimizerSpec("sgd", "fedtune.algorithms.server.optimizer:ServerOptimizer",
                        "the server rule's own step: theta + global_lr * d (today's rule)"),
    ServerOptimizerSpec("avgm", "fedtune.algorithms.server.optimizer:FedAvgM",
                        "FedAvgM (Hsu et al. 2019): v <- server_momentum v + delta, theta <- theta + global_lr v (unset: "
                        "the rule's, FedAvg 1.0 as Hsu et al.)",
                        (SERVER_MOMENTUM,)),
    ServerOptimizerSpec("adam", "fedtune.algorithms.server.optimizer:FedAdam",
                        "FedAdam (Reddi et al. 2021): m, v moments of delta, theta <- theta + global_lr m / (sqrt(v) + tau); "
                        "global_lr unset: 1e-3 (Adam's alpha; at tau 1e-9 Flower's eta 0.1 diverges)",
                        (*_ADAPTIVE[:3], SERVER_V_START, SERVER_ADAM_BIAS_CORRECTION), default_lr=ADAPTIVE_LR),
    ServerOptimizerSpec("yogi", "fedtune.algorithms.server.optimizer:FedYogi",
                        "FedYogi (Reddi et al. 2021): as FedAdam with v <- v - (1 - beta2) delta^2 sign(v - delta^2); "
                        "global_lr unset: 1e-3 (as adam; at tau 1e-9 Flower's eta 0.01 stalls at chance)", _ADAPTIVE,
                        default_lr=ADAPTIVE_LR),
    ServerOptimizerSpec("adagrad", "fedtune.algorithms.server.optimizer:FedAdagrad",
                        "FedAdagrad (Reddi et al. 2021): v <- v + delta^2, theta <- theta + global_lr delta / "
                        "(sqrt(v) + tau); global_lr unset: 1e-3 (as adam; at tau 1e-9 Flower's eta 0.1 diverges)",
                        (SERVER_TAU, SERVER_V_START), default_lr=ADAPTIVE_LR),
)

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
