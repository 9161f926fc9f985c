"""Every component, declared once: its hyperparameters, its flags, where its code lives.

This is fedtune's ``hparams_registry`` (DomainBed keeps each algorithm's defaults and search
distributions in one registry): each client method and server rule is one ``*Spec`` below (the
server optimisers, a third kind, are declared alike in
:mod:`fedtune.algorithms.optimizer_declarations`), with its :class:`~fedtune.algorithms.base.HParam` s (default, allowed values,
meaning, search distribution), its cross-field check and the ``"module:Class"`` of its code. The
module imports neither torch nor NumPy: a config is validated, a search space derived and
``fedtune algorithms`` listed from here alone, and a component's code is imported only by the
process that runs it (client methods: the client workers; server rules: the coordinator).

Adding a method: write its class in a module of its own and add its spec (and its
hyperparameters) here, in the tuple of its kind at the end of the module; a named algorithm
is one :class:`~fedtune.algorithms.Preset` in :data:`fedtune.algorithms.presets.PRESETS`. The registries, the config's
checks, the search spaces (:mod:`fedtune.spaces.derive`), the CLI and the contract tests
(tests/contracts/test_contracts.py) follow from the declaration.

A hyperparameter's ``search`` is how a search space samples it unless a search-space file says
otherwise (the file's ``params`` entry format, :mod:`fedtune.spaces.lookup`); without one it is
fixed at its default (variants are choices between a paper and its authors' code, never knobs).

>>> CLIENT_METHOD_SPECS[3].name, [h.name for h in CLIENT_METHOD_SPECS[3].hparams]
('prox', ['prox_mu'])
>>> {s.name: s.default_global_lr for s in SERVER_RULE_SPECS}["fedomg"]
0.05
"""

from __future__ import annotations

from typing import Any, NoReturn

from fedtune.algorithms.base import (ClientMethodSpec, HParam, RunConfig, ServerRuleSpec, search_categorical, search_int,
                                    search_loguniform, search_uniform, variant)
from fedtune.algorithms.fedadg_declarations import FEDADG_SPEC
from fedtune.errors import ConfigError
from fedtune.old_names import old_name_error


# ================================================================== choices named by the code
WEIGHTINGS = ("examples", "uniform")  # fedtune.algorithms.server.aggregate.mean_weights
SOLVERS = ("exact", "sgd")  # fedtune.algorithms.server.fedomg_solvers
FEDGA_DECAYS = ("linear", "authors", "none")
FEDGA_METRICS = ("loss", "acc")
FEDGA_INITS = ("uniform", "size")


# ================================================================== client methods' hyperparameters
PROX_MU = HParam("prox_mu", 0.01, "FedProx proximal weight mu: local loss + mu/2 ||theta - theta_global||^2 "
                 "(the paper's grid {0.001, 0.01, 0.1, 1}, searched as its log range)", lo=0.0,
                 search={**search_loguniform(0.001, 1.0, 0.01), "help": "proximal weight mu"})
SAM_RHO = HParam("sam_rho", 0.02, "SAM neighbourhood radius rho: eps = rho grad/||grad|| (GFM paper: 0.02)",
                 lo=0.0, lo_open=True, search={**search_loguniform(0.005, 0.1, 0.02), "help": "SAM neighbourhood radius"})
GFM_INTERVAL = HParam("gfm_interval", 10, "GFM/GCA: update the augmenter every this many local steps (paper: 10)",
                      kind="int", lo=1, search={**search_int(1, 20, 10), "help": "augmenter update every c steps"})
GFM_AUG_LR = HParam("gfm_aug_lr", 1e-3, "GFM/GCA: Adam learning rate of the augmenter (TeachAugment: 1e-3)",
                    lo=0.0, lo_open=True, search=search_loguniform(1e-4, 1e-2, 1e-3))
GFM_COLOR_SCALE = HParam("gfm_color_scale", 0.2, "GFM/GCA: colour scale range, alpha in [1 - s/2, 1 + s/2] "
                         "(paper: 0.2; TerraInc 0.1)", lo=0.0, hi=2.0, search=search_uniform(0.05, 0.4, 0.2))
GFM_GEOMETRY_SCALE = HParam("gfm_geometry_scale", 0.125, "GFM/GCA: residual affine range, A - I in [-s/2, s/2] "
                            "(paper: 0.125; TerraInc 0.0625)", lo=0.0, hi=2.0, search=search_uniform(0.03125, 0.25, 0.125))
GALA_GATE = variant("gala_gate", "FedGaLA local gate sign: descent = a tensor steps only if cos(-grad, last global "
                    "move) > gala_tau (the stated intent); literal = only if cos(+grad, last global move) >= gala_tau "
                    "(the paper's formula and the authors' code, needed to reproduce their numbers)",
                    ("descent", "literal"))
GALA_TAU = HParam("gala_tau", 0.0, "FedGaLA local gate: a tensor steps only if cos(-grad, last global move) > tau; "
                  "-1 = (almost) never gate, 1 = never step; paper: 0", lo=-1.0, hi=1.0,
                  search={**search_uniform(-0.5, 0.5, 0.0), "help": "local gating threshold"})
SIMCLR_TEMPERATURE = HParam("simclr_temperature", 0.5, "SimCLR: temperature of the NT-Xent loss (> 0)",
                            "float", lo=1e-3)
SIMCLR_PROJ_DIM = HParam("simclr_proj_dim", 128, "SimCLR: output width of the projector MLP "
                         "(encoder features -> features -> simclr_proj_dim)", "int", lo=1)
FEDSR_Z_DIM = HParam("fedsr_z_dim", 512, "FedSR representation width z_dim (the head outputs 2*z_dim: mean and "
                     "scale); the authors use the backbone's feature width (512 for resnet18)", kind="int", lo=1,
                     hi=65536)
FEDSR_L2R = HParam("fedsr_l2r", 0.01, "FedSR weight of the L2 regulariser on the representation z", lo=0.0,
                   search={**search_loguniform(1e-4, 0.1, 0.01), "help": "weight of the L2 regulariser on z"})
FEDSR_CMI = HParam("fedsr_cmi", 5e-4, "FedSR weight of the conditional-mutual-information bound "
                   "KL(p(z|x) || r(z|y))", lo=0.0, search={**search_loguniform(1e-5, 1e-2, 5e-4), "help": "weight of KL(p(z|x) || r(z|y))"})
FEDSR_L2R_FORM = variant("fedsr_l2r_form", "FedSR L2R term: squared = mean ||z||^2 (the paper), norm = mean ||z|| "
                         "(the authors' code)", ("squared", "norm"))
FEDSR_PRIOR = variant("fedsr_prior", "FedSR prior r_mu, r_sigma, C: federated = averaged by the server with the "
                      "model, local = kept per client across rounds (the authors' code)", ("federated", "local"))
FEDSR_EVAL_SAMPLES = HParam("fedsr_eval_samples", 0, "FedSR evaluation: 0 = classifier on the mean mu "
                            "(deterministic); S > 0 = log of the mean softmax over S samples of z (the authors: 20)",
                            kind="int", lo=0, hi=1024, variant=True)
FEDDYN_ALPHA = HParam("feddyn_alpha", 0.01,
                      "FedDyn regulariser weight alpha: local loss - <grad L_k(theta_k^(t-1)), theta> + alpha/2 "
                      "||theta - theta_global||^2; server theta = mean - h/alpha (paper: {0.1, 0.01, 0.001}, "
                      "authors' code 0.01); 0 = the server rule's round (FedAvg)", lo=0.0,
                      search={**search_loguniform(0.001, 0.1, 0.01), "help": "dynamic regulariser weight alpha"})
FEDDYN_MEAN = variant("feddyn_mean", "FedDyn's server mean before the -h/alpha correction: rule = the server rule's "
                      "result (FedAvg: example-weighted, composes with any rule); uniform = the paper's and the "
                      "authors' unweighted mean of the participants' models (server_rule fedavg only)",
                      ("rule", "uniform"))
MOON_MU = HParam("moon_mu", 1.0, "MOON weight mu of the model-contrastive loss: CE + mu * l_con (authors' default 1; "
                 "their README tunes {0.001, 0.01, 0.1, 1, 5, 10})", lo=0.0,
                 search={**search_loguniform(0.001, 10.0, 1.0), "help": "weight of the model-contrastive loss"})
MOON_TEMPERATURE = HParam("moon_temperature", 0.5, "MOON temperature tau of l_con (the paper and the authors' "
                          "default: 0.5)", lo=0.0, lo_open=True)
FEDIIR_PENALTY = HParam("fediir_penalty", 1e-3, "FedIIR penalty weight gamma on ||grad_w CE - g_bar||^2 over the "
                        "classifier's parameters (the authors' default 1e-3; 1e-2..1e-4 by dataset)", lo=0.0,
                        search={**search_loguniform(1e-4, 1e-2, 1e-3), "help": "weight of the classifier-gradient penalty"})
FEDIIR_EMA = HParam("fediir_ema", 0.95, "FedIIR moving-average factor of the server's mean classifier gradient: "
                    "g_bar <- ema * g_bar + (1 - ema) * (this round's mean batch gradient)", lo=0.0, hi=0.999,
                    search={**search_categorical([0.9, 0.95, 0.99], 0.95),
                            "help": "moving-average factor of the server's mean gradient"})
FISHR_PENALTY = HParam("fishr_penalty", 1000.0, "Fishr penalty weight lambda on the distance between the client's "
                       "gradient variance and the clients' mean (Fishr's default 1000, searched 10^U(1, 4))", lo=0.0,
                       search={**search_loguniform(10.0, 1e4, 1000.0), "help": "weight of the gradient-variance penalty"})
FISHR_ANNEAL_ITERS = HParam("fishr_anneal_iters", 1500, "Fishr warm-up: no penalty before this iteration ((round - 1) "
                            "* local steps per round + step, rounds from 1), then the local optimiser is reset",
                            kind="int", lo=0, search={**search_int(0, 5000, 1500), "help": "no penalty before this iteration"})
FISHR_EMA = HParam("fishr_ema", 0.95, "Fishr moving-average factor of each client's gradient variance (0: none, "
                   "FedOMG's Eq. 4)", lo=0.0, hi=0.999,
                   search={**search_uniform(0.9, 0.99, 0.95), "help": "moving-average factor of each client's variance"})
FISHR_DISTANCE = variant("fishr_distance", "Fishr distance between variances: mean = mean over the classifier's "
                         "parameters of the squared difference (Fishr's code), sum = squared norm (FedOMG Eq. 4, "
                         "Fishr's paper)", ("mean", "sum"))


def _pair_penalty_weight(name: str, label: str, penalty: str, of: str, short: str) -> HParam[float]:
    """The weight of a penalty over the batch's domain pairs (DeepCORAL, MMD: DomainBed's
    ``mmd_gamma``), declared once."""
    return HParam(name, 1.0, f"{label} weight of the {penalty} (mean over the batch's domain pairs of {of}; DomainBed's "
                  "mmd_gamma, default 1, searched 10^U(-1, 1)); 0 = plain SGD (what Bai et al.'s code trains: its "
                  "penalty is zeroed)", lo=0.0, search={**search_loguniform(0.1, 10.0, 1.0), "help": f"weight of the {short}"})


CORAL_WEIGHT = _pair_penalty_weight("coral_weight", "DeepCORAL", "CORAL penalty", "the squared differences of feature "
                                    "means and covariances", "CORAL penalty")


def _annealed_penalty(method: str, label: str, term: str, short: str, default: float) -> tuple[HParam, HParam]:
    """DomainBed's annealed penalty (IRM, V-REx), declared once: ``<method>_lambda``, the weight of
    ``term`` (``short``) from iteration ``<method>_anneal_iters`` on (1 before it), and that iteration."""
    weight = HParam(f"{method}_lambda", default, f"{label} weight of the {term} from iteration {method}_anneal_iters on "
                    f"(before it: 1; DomainBed's default {default:g}, searched 10^U(-1, 5)); 0 with {method}_anneal_iters "
                    "0 = the mean of the domain risks alone (what Bai et al.'s code trains)",
                    lo=0.0, search={**search_loguniform(0.1, 1e5, default), "help": f"weight of the {short}"})
    anneal = HParam(f"{method}_anneal_iters", 500, f"{label} warm-up: the {short.split()[-1]} "
                    "weighs 1 before this iteration ((round - 1) * local steps per round + step, rounds from 1), "
                    f"{method}_lambda from it on, when the local optimiser is reset (DomainBed's default 500, searched "
                    "int 10^U(0, 4))", kind="int", lo=0,
                    search={**search_int(1, 10000, 500), "log": True, "help": "iteration the weight switches at"})
    return weight, anneal


VREX_LAMBDA, VREX_ANNEAL_ITERS = _annealed_penalty("vrex", "V-REx", "variance of the per-domain risks",
                                                   "risks' variance", 10.0)
IRM_LAMBDA, IRM_ANNEAL_ITERS = _annealed_penalty("irm", "IRM", "IRMv1 penalty", "IRMv1 penalty", 100.0)
GROUPDRO_ETA = HParam("groupdro_eta", 0.01, "GroupDRO step size of the client's domain weights q <- q * "
                      "exp(eta * risk), normalised (DomainBed's default 1e-2, searched 10^U(-3, -1)); 0 = the mean "
                      "of the domain risks", lo=0.0, search={**search_loguniform(1e-3, 0.1, 0.01), "help": "step size of the domain weights"})
FISH_META_LR = HParam("fish_meta_lr", 0.5, "Fish meta step: theta <- theta + fish_meta_lr * (inner - theta) after "
                      "one inner step per domain of the batch, in (0, 1] (0 would train nothing; DomainBed's meta_lr, "
                      "default 0.5, searched in {0.05, 0.1, 0.5})", lo=0.0, hi=1.0, lo_open=True,
                      search={**search_categorical([0.05, 0.1, 0.5], 0.5), "help": "meta step size"})
FISH_INNER_OPTIMIZER = variant("fish_inner_optimizer", "Fish inner steps' optimiser: round = one optimiser for the "
                               "round, its state (momentum, Adam's moments) carried across meta steps (DomainBed's "
                               "Fish.update loads the last inner optimiser's state into each new one, as the authors' "
                               "reload_inner_optim; Bai et al.'s Fish.step steps the client's optimiser), fresh = a "
                               "new optimiser at every meta step, its state kept only across one batch's domains "
                               "(fedtune's default before issue 44; Algorithm 1 writes plain SGD inner steps, where "
                               "the two agree)", ("round", "fresh"),
                               trial_id="as_run")  # fresh until issue 44
MMD_WEIGHT = _pair_penalty_weight("mmd_weight", "MMD", "penalty", "the Gaussian-kernel MMD of the encoder features",
                                  "MMD penalty")

AFL_LAMBDA_LR = HParam("afl_lambda_lr", 0.01, "AFL step of the server's domain mixture weights: lambda <- "
                       "Proj_simplex(lambda + afl_lambda_lr * per-domain loss) each round (Bai et al.'s hparam1: 0.01; "
                       "0 keeps lambda uniform)", lo=0.0,
                       search={**search_loguniform(1e-3, 1.0, 0.01), "help": "step of the domain mixture weights"})
AFL_LAMBDA_AT = variant("afl_lambda_at", "AFL: where the domain losses that move lambda are taken: start = at the "
                        "round's starting model, in the clients' one call (the paper's Stochastic-AFL); aggregated = "
                        "at the aggregated model, the round's participants called again after aggregation (Bai et "
                        "al.'s code)", ("start", "aggregated"))
FEDDG_RATIO_LOW = HParam("feddg_ratio_low", 0.0, "FedDG: one end of the interpolation ratio r, drawn uniformly between "
                         "feddg_ratio_low and feddg_ratio_high (either order), of a client's own low-frequency "
                         "amplitudes against the source bank's (default 0 with high 0: the "
                         "source bank's swapped in outright, ELCFS's training code; low 0, high 1: the paper's "
                         "continuous interpolation; low 1: no mixing, what Bai et al.'s sweeps ran)", lo=0.0, hi=1.0,
                         trial_id="as_run")  # low 0, high 1 until issue 44
FEDDG_RATIO_HIGH = HParam("feddg_ratio_high", 0.0, "FedDG: the other end of the interpolation ratio r "
                          "(r = 0 takes the bank's amplitudes, ELCFS's code; r = 1 keeps the client's own)",
                          lo=0.0, hi=1.0, trial_id="as_run")
FEDDG_WINDOW = variant("feddg_window", "FedDG low-frequency square, half-width b = floor(min(H, W) * L): dc = L 0, "
                       "the DC term alone (ELCFS's training code: source_to_target_freq(..., L=0)); centred = L ~ "
                       "U(0, 1) per batch (Bai et al.'s FourierMixup), the square clipped to the spectrum (fedtune's "
                       "default before issue 44); bai = L ~ U(0, 1) sliced as Bai et al.'s code (for L above about "
                       "1/2 the start goes negative and counts from the end, an off-centre block)",
                       ("dc", "centred", "bai"), trial_id="as_run")  # centred until issue 44
# ================================================================== server rules' hyperparameters
CLIENT_WEIGHTING = variant("client_weighting", "FedAvg's mean of the participants' models and batch-norm buffers: "
                           "examples = weights n_u / sum n (McMahan et al.); uniform = 1/U each (FedSR's and FedIIR's "
                           "authors, the default of the presets fedsr and fediir)", WEIGHTINGS,
                           trial_id="when_set")  # declared after studies ran the example-weighted mean
OMG_KAPPA = HParam("omg_kappa", 0.5, "FedOMG searching radius κ: d = g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖ (0 = FedAvg; "
                   "paper: 0.5)", "float", lo=0.0, search={**search_uniform(0.0, 1.0, 0.5), "help": "weight of the matching term"})
OMG_SOLVER = variant("omg_solver", "FedOMG step-2 solver: exact (certified convex solve on the simplex) or sgd (the "
                     "authors' 20 softmax-SGD steps, lr 25, momentum 0.5)", SOLVERS)
OMG_RESCALE = HParam("omg_rescale", False, "divide FedOMG's direction by 1 + κ² (the authors' code does; the "
                     "paper's Eq. 16 does not)", "bool", variant=True)
GP_BETA = HParam(
    "gp_beta", 0.5,
    "FedDA/FedGP: weight β of the source term against the target step, in [0, 1] (0 = target only), "
    "or 'auto' for the paper's per-source, per-round estimate σ̂²/(d̂²+σ̂²) (FedDA) or σ̂²/(τd̂²+σ̂²) (FedGP)",
    kind="float_or_choice", lo=0.0, hi=1.0, choices=("auto",),
    search={**search_uniform(0.0, 1.0, 0.5), "when": {"gp_beta_mode": "fixed"}, "otherwise": "auto"})
GP_ALIGN = HParam(
    "gp_align", True,
    "FedDA/FedGP: scale each source displacement by (lr_T/lr_S)·(steps_T/steps_S) so it is on the "
    "target step's scale before combining (the authors' magnitude alignment)",
    kind="bool", variant=True,
    search={**search_categorical([True, False], True), "help": "source/target magnitude alignment"})
GALA_ITERS = HParam("gala_iters", 3, "FedGaLA global-alignment iterations (reweight, re-aggregate); paper: 3",
                    kind="int", lo=1, search={**search_int(1, 5, 3), "help": "global alignment iterations"})
GALA_MIX = HParam("gala_mix", 1.0, "FedGaLA mix with FedAvg: theta + global_lr * (mix * aligned + (1 - mix) * fedavg); "
                  "1 = pure alignment (paper), 0 = FedAvg", lo=0.0, hi=1.0,
                  search={**search_uniform(0.0, 1.0, 1.0), "help": "1 = pure alignment, 0 = FedAvg"})
GALA_WEIGHTS = variant("gala_weights", "FedGaLA global alignment: one weight per client and parameter tensor "
                       "(per-tensor, the authors' code) or one per client over the whole parameter vector (whole)",
                       ("per-tensor", "whole"))
FEDGA_STEP = HParam("fedga_step", 0.2, "FedGA step size in units of the uniform weight 1/K: each round's "
                    "adjustment moves a weight by at most d = fedga_step / K (K clients adjusted; the authors' "
                    "--step_size, default 0.2, times their 1/3 for 3 source domains); 0 = fixed weights",
                    "float", lo=0.0, hi=1.0,
                    search={**search_uniform(0.0, 0.5, 0.2), "help": "weight step in units of 1/K (authors: 0.2)"})
FEDGA_DECAY = variant("fedga_decay", "FedGA step decay over the R rounds: linear d(1 - t/R) (the paper), authors "
                      "(their scripts' d(1 - (t-2)/(R-1)), R = their --comm + 1 rounds trained), none", FEDGA_DECAYS)
FEDGA_CENTER = HParam("fedga_center", True, "FedGA: subtract the mean gap before dividing by the largest |gap| "
                      "(the paper; the authors' code divides the raw gaps)", "bool", variant=True)
FEDGA_METRIC = variant("fedga_metric", "FedGA generalization gap measured on the validation loss (the paper) or "
                       "accuracy (the authors' scripts' default --fair acc)", FEDGA_METRICS)
FEDGA_INIT = HParam("fedga_init", "uniform", "FedGA initial aggregation weights: uniform (the paper and the "
                    "authors' code) or size (n_i / n, FedAvg's)", "choice", choices=FEDGA_INITS)

GMA_TAU = HParam("gma_tau", 0.4, "FedGMA sign-agreement threshold: a coordinate whose clients' agreement "
                 "|mean sign(delta_u)| is at least gma_tau keeps FedAvg's step (Bai et al. search 0.1, 0.4, 0.9; "
                 "0 with gma_mask soft = FedAvg)", lo=0.0, hi=1.0,
                 search={**search_uniform(0.1, 0.9, 0.4), "help": "sign-agreement threshold (Bai et al.: 0.1, 0.4, 0.9)"})
GMA_MASK = variant("gma_mask", "FedGMA mask: soft = 1 where the agreement passes gma_tau, the agreement elsewhere "
                   "(the AND-mask relaxed, Bai et al.'s line read with 1 - mask; the paper's own statement was not "
                   "checked, docs/methods-benchmark.md section 21.2); bai = gma_tau * (1 + agreement) where it passes, 0 "
                   "elsewhere (what Bai et al.'s code computes, with their step gma_tau folded in: run it with "
                   "global_lr 1)", ("soft", "bai"))

# ================================================================== cross-field checks
def _check_feddyn(cfg: RunConfig) -> None:
    rule = cfg.resolved.server_rule_name
    if FEDDYN_MEAN.of(cfg) == "uniform" and rule != "fedavg":
        raise ConfigError(f"field 'feddyn_mean': uniform (the paper's unweighted mean of the clients' models) "
                          f"replaces FedAvg's mean and needs server_rule fedavg, not {rule}; use feddyn_mean: rule")


def _check_fedga(cfg: RunConfig) -> None:
    client = cfg.resolved.client_spec
    if not client.supervised:
        raise ConfigError(f"field 'server_rule': fedga compares the cross-entropy of class logits, which client "
                          f"method {client.name} (unsupervised) does not produce; allowed: a supervised client method")
    if cfg.val_fraction <= 0:
        raise ConfigError("field 'val_fraction': fedga measures the generalization gaps on each client's "
                          "validation split; allowed: > 0")


def _check_target_source(cfg: RunConfig) -> None:
    """Auto-β needs at least 2 target steps a round (``local_steps >= 2`` when it is set)."""
    if GP_BETA.of(cfg) == "auto" and cfg.local_steps is not None and int(cfg.local_steps) < 2:
        raise ConfigError(
            f"field 'gp_beta': 'auto' estimates the target variance from the target client's per-step updates "
            f"and needs at least 2 local steps per round, but local_steps={cfg.local_steps}; allowed: "
            f"local_steps >= 2, or a fixed gp_beta in [0, 1]")


def _target_source_hooks(cfg: RunConfig) -> tuple[str, ...]:
    """Auto-β's per-batch step records (docs/methods-seeds.md §2), only with ``gp_beta: auto``."""
    return ("fedtune.algorithms.client.step_records:StepRecords",) if GP_BETA.of(cfg) == "auto" else ()


def _fedga_hooks(cfg: RunConfig) -> tuple[str, ...]:
    return ("fedtune.algorithms.client.fedga:GeneralizationGap",)


def _simclr_head(cfg: RunConfig) -> dict[str, Any]:
    return {"head": "projector", "proj_dim": SIMCLR_PROJ_DIM.of(cfg)}


def _fedsr_keeps_state(cfg: RunConfig) -> bool:
    """FedSR keeps a client's prior on its actor only with ``fedsr_prior: local``."""
    return FEDSR_PRIOR.of(cfg) == "local"


def _fedsr_head(cfg: RunConfig) -> dict[str, Any]:
    return {"head": "probabilistic", "z_dim": FEDSR_Z_DIM.of(cfg), "eval_samples": FEDSR_EVAL_SAMPLES.of(cfg)}


# ================================================================== the components
_SIMCLR_HPARAMS = (SIMCLR_TEMPERATURE, SIMCLR_PROJ_DIM)

CLIENT_METHOD_SPECS: tuple[ClientMethodSpec, ...] = (
    ClientMethodSpec("sgd", "fedtune.algorithms.client.method:SGD",
                     "plain local SGD (momentum, weight decay) on the cross-entropy loss"),
    ClientMethodSpec("simclr", "fedtune.algorithms.client.simclr:SimCLR",
                     "SimCLR (unsupervised): two augmented views, NT-Xent loss, projector MLP; linear-probe evaluation",
                     _SIMCLR_HPARAMS, supervised=False, model_head=_simclr_head),
    ClientMethodSpec("gala-simclr", "fedtune.algorithms.client.simclr:GalaSimCLR",
                     "FedGaLA local alignment on SimCLR (unsupervised): a tensor steps only if cos(−∇, last global "
                     "move) > gala_tau (gala_gate=descent) or cos(+∇, r) >= gala_tau (literal); NT-Xent loss, projector "
                     "MLP, linear-probe evaluation",
                     (*_SIMCLR_HPARAMS, GALA_TAU, GALA_GATE), supervised=False, model_head=_simclr_head,
                     server_side="fedtune.algorithms.server.gala_move:SimclrGlobalMove"),
    ClientMethodSpec("prox", "fedtune.algorithms.client.prox:Prox",
                     "FedProx: local SGD on loss + prox_mu/2 ||theta - theta_global||^2", (PROX_MU,)),
    ClientMethodSpec("sam", "fedtune.algorithms.client.sam:SAM",
                     "SAM local steps (FedSAM): gradient at theta + sam_rho grad/||grad||, step from theta", (SAM_RHO,),
                     scales_fp16_gradients=False),  # two gradients per step through torch.autograd.grad
    ClientMethodSpec("gfm", "fedtune.algorithms.client.gfm:GFM",
                     "GFM: SAM steps on augmented images; augmenter maximises local - global loss (Alg. 1)",
                     (SAM_RHO, GFM_INTERVAL, GFM_AUG_LR, GFM_COLOR_SCALE, GFM_GEOMETRY_SCALE),
                     scales_fp16_gradients=False, keeps_client_state=True),  # the augmenter's ascent step takes its own gradient
    ClientMethodSpec("gca", "fedtune.algorithms.client.gfm:GCA",
                     "GCA: local SGD on images from an adversarial augmenter constrained by the global model (GFM "
                     "ablation)", (GFM_INTERVAL, GFM_AUG_LR, GFM_COLOR_SCALE, GFM_GEOMETRY_SCALE),
                     scales_fp16_gradients=False, keeps_client_state=True),
    ClientMethodSpec("gala", "fedtune.algorithms.client.gala:GalaClient",
                     "FedGaLA local alignment: local SGD where a tensor steps only if its batch gradient agrees with "
                     "the last global move (gala_gate: descent cos(−∇, r) > gala_tau, or literal cos(+∇, r) >= "
                     "gala_tau)", (GALA_TAU, GALA_GATE), server_side="fedtune.algorithms.server.gala_move:GlobalMove"),
    ClientMethodSpec("fedsr", "fedtune.algorithms.client.fedsr:FedSR",
                     "FedSR: probabilistic representation z ~ N(mu(x), sigma(x)^2), CE on z + fedsr_l2r E||z||^2 + "
                     "fedsr_cmi KL(p(z|x) || r(z|y)) with a learned class-conditional prior",
                     (FEDSR_Z_DIM, FEDSR_L2R, FEDSR_CMI, FEDSR_L2R_FORM, FEDSR_PRIOR, FEDSR_EVAL_SAMPLES),
                     model_head=_fedsr_head, keeps_client_state=_fedsr_keeps_state),
    ClientMethodSpec("scaffold", "fedtune.algorithms.client.scaffold:Scaffold",
                     "SCAFFOLD: local steps on g - c_i + c (control variates, option II update of c_i), server c += "
                     "|S|/N mean dc_i; FedAvg (global_lr = eta_g)",
                     server_side="fedtune.algorithms.server.scaffold:ScaffoldServer", keeps_client_state=True),
    ClientMethodSpec("feddyn", "fedtune.algorithms.client.feddyn:FedDyn",
                     "FedDyn: local loss - <grad L_k(theta_k^(t-1)), theta> + feddyn_alpha/2 ||theta - "
                     "theta_global||^2; server theta = mean - h/alpha (feddyn_mean rule|uniform)",
                     (FEDDYN_ALPHA, FEDDYN_MEAN), check=_check_feddyn,
                     server_side="fedtune.algorithms.server.feddyn:FedDynServer", keeps_client_state=True),
    ClientMethodSpec("moon", "fedtune.algorithms.client.moon:MOON",
                     "MOON: CE + moon_mu * model-contrastive loss pulling the encoder features towards the global "
                     "model's and away from the client's previous model's (temperature moon_temperature)",
                     (MOON_MU, MOON_TEMPERATURE), keeps_client_state=True, reads_features=True),
    ClientMethodSpec("fediir", "fedtune.algorithms.client.fediir:FedIIR",
                     "FedIIR: local SGD on CE + fediir_penalty ||grad_classifier CE - g_bar||^2, g_bar the server's "
                     "moving average (fediir_ema) of the clients' mean classifier gradient",
                     (FEDIIR_PENALTY, FEDIIR_EMA),
                     scales_fp16_gradients=False,  # the penalty's inner gradient goes through torch.autograd.grad
                     server_side="fedtune.algorithms.server.fediir:FedIIRServer", reads_features=True),
    ClientMethodSpec("fishr", "fedtune.algorithms.client.fishr:Fishr",
                     "Fishr (federated, FedOMG Eq. 4): local SGD on CE + fishr_penalty dist(Var_i[grad_classifier "
                     "CE_i], server's mean variance), variances smoothed by fishr_ema, warm-up fishr_anneal_iters",
                     (FISHR_PENALTY, FISHR_ANNEAL_ITERS, FISHR_EMA, FISHR_DISTANCE),
                     scales_fp16_gradients=False,  # the per-example gradients are taken without the loss scaler
                     server_side="fedtune.algorithms.server.fishr:FishrServer", keeps_client_state=True,
                     reads_features=True),
    ClientMethodSpec("coral", "fedtune.algorithms.client.coral:DeepCORAL",
                     "DeepCORAL: local SGD on CE + coral_weight * mean over the batch's domain pairs of the CORAL "
                     "distance of the encoder features (clients holding several domains: domain_homogeneity > 0)",
                     (CORAL_WEIGHT,), reads_features=True),
    ClientMethodSpec("mmd", "fedtune.algorithms.client.mmd:MMD",
                     "MMD: local SGD on CE + mmd_weight * mean over the batch's domain pairs of the Gaussian-kernel "
                     "MMD of the encoder features (clients holding several domains: domain_homogeneity > 0)",
                     (MMD_WEIGHT,), reads_features=True),
    ClientMethodSpec("vrex", "fedtune.algorithms.client.vrex:VREx",
                     "V-REx: local SGD on the mean of the batch's per-domain risks + vrex_lambda * their variance "
                     "(weight 1 before vrex_anneal_iters; clients holding several domains: domain_homogeneity > 0)",
                     (VREX_LAMBDA, VREX_ANNEAL_ITERS)),
    ClientMethodSpec("irm", "fedtune.algorithms.client.irm:IRM",
                     "IRM (IRMv1): local SGD on the mean of the batch's per-domain risks + irm_lambda * the mean "
                     "IRMv1 penalty (weight 1 before irm_anneal_iters; clients holding several domains)",
                     (IRM_LAMBDA, IRM_ANNEAL_ITERS),
                     scales_fp16_gradients=False),  # the penalty's inner gradients go through torch.autograd.grad
    ClientMethodSpec("groupdro", "fedtune.algorithms.client.groupdro:GroupDRO",
                     "GroupDRO: local SGD on sum_d q_d R_d, the client's domain weights q <- q exp(groupdro_eta R_d) "
                     "normalised at each step and kept across rounds (clients holding several domains)",
                     (GROUPDRO_ETA,), keeps_client_state=True),
    ClientMethodSpec("fish", "fedtune.algorithms.client.fish:Fish",
                     "Fish: each local step an inner step per domain of the batch, then theta moves fish_meta_lr of "
                     "the way to where they ended (fish_inner_optimizer round|fresh; clients holding several domains)",
                     (FISH_META_LR, FISH_INNER_OPTIMIZER)),
    ClientMethodSpec("feddg", "fedtune.algorithms.client.feddg:FedDG",
                     "FedDG (ELCFS's frequency-space interpolation): local SGD on the batch with its low-frequency "
                     "amplitude spectra interpolated (r ~ U(feddg_ratio_low, feddg_ratio_high); feddg_window dc: the "
                     "DC term, centred|bai: a window ~ U(0, 1)) towards those of random images of every source client "
                     "(images only)",
                     (FEDDG_RATIO_LOW, FEDDG_RATIO_HIGH, FEDDG_WINDOW),
                     needs_source_bank=True, needs_images=True),
    FEDADG_SPEC,
    ClientMethodSpec("afl", "fedtune.algorithms.client.afl:AFL",
                     "AFL: local SGD on sum_d lambda_d R_d over the batch's domains, lambda the server's mixture weights "
                     "over the training domains, moved by projected ascent on each domain's loss (afl_lambda_lr)",
                     (AFL_LAMBDA_LR, AFL_LAMBDA_AT), server_side="fedtune.algorithms.server.afl:AFLServer"),
)

_TARGET_SOURCE_HPARAMS = (GP_BETA, GP_ALIGN)
# gp_beta is a fixed value in [0, 1] (paper default 0.5) or 'auto' (Appendix A.2, the per-source, per-round
# estimate): this switch picks which, and GP_BETA's search samples a value only when it says fixed.
_GP_BETA_MODE = {"gp_beta_mode": {"choices": ["fixed", "auto"], "default": "fixed",
                                  "help": "a fixed beta, or the auto-weighted estimate"}}

SERVER_RULE_SPECS: tuple[ServerRuleSpec, ...] = (
    ServerRuleSpec("fedavg", "fedtune.algorithms.server.rule:FedAvg",
                   "FedAvg: θ ← θ + global_lr · Σ w_u Δ_u, w_u = p_u or 1/U (client_weighting)", (CLIENT_WEIGHTING,)),
    ServerRuleSpec("fedda", "fedtune.algorithms.server.fedgp:FedDA",
                   "FedDA (fda): θ ← θ + Σ α_i[(1−β_i)Δ_T + β_i Δ_i]; gp_beta fixed or 'auto'",
                   _TARGET_SOURCE_HPARAMS, check=_check_target_source, needs_target_client=True,
                   client_hooks=_target_source_hooks, search_switches=_GP_BETA_MODE),
    ServerRuleSpec("fedgp", "fedtune.algorithms.server.fedgp:FedGP",
                   "FedGP (fda): θ ← θ + Σ α_i[(1−β_i)Δ_T + β_i Proj₊(Δ_T|Δ_i)] per tensor; gp_beta fixed or 'auto'",
                   _TARGET_SOURCE_HPARAMS, check=_check_target_source, needs_target_client=True,
                   client_hooks=_target_source_hooks, search_switches=_GP_BETA_MODE),
    ServerRuleSpec("target_only", "fedtune.algorithms.server.fedgp:TargetOnly",
                   "target-only baseline (fda): θ ← θ + global_lr · Δ_T, sources ignored", needs_target_client=True),
    ServerRuleSpec("gala", "fedtune.algorithms.server.gala:Gala",
                   "FedGaLA global alignment: reweight clients by p_u (cos(Δ_u, a) + 1)/2 (per tensor or whole vector) "
                   "for gala_iters rounds; θ ← θ + global_lr·(gala_mix·a + (1−gala_mix)·FedAvg step)",
                   (GALA_ITERS, GALA_MIX, GALA_WEIGHTS)),
    # default_global_lr: fedtune's default server step, *not* the paper's η_g: the authors' step is
    # η·d/(U(1+κ²)) and their PACS script uses η = 0.5 (Table 4 says 0.05), while global_lr
    # multiplies d directly (docs/methods-seeds.md §1). Compare FedOMG with other rules only with
    # global_lr tuned for each.
    ServerRuleSpec("fedomg", "fedtune.algorithms.server.fedomg:FedOMG",
                   "FedOMG: θ ← θ + global_lr · (g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖), Γ* matching the clients' updates",
                   (OMG_KAPPA, OMG_SOLVER, OMG_RESCALE), default_global_lr=0.05),
    ServerRuleSpec("fedga", "fedtune.algorithms.server.fedga:FedGA",
                   "FedGA: θ ← θ + global_lr · Σ a_u Δ_u, a_u moved towards clients with larger generalization gaps",
                   (FEDGA_STEP, FEDGA_DECAY, FEDGA_CENTER, FEDGA_METRIC, FEDGA_INIT), check=_check_fedga,
                   needs_supervised_client=True, client_hooks=_fedga_hooks),
    ServerRuleSpec("fedgma", "fedtune.algorithms.server.fedgma:FedGMA",
                   "FedGMA: θ ← θ + global_lr · m ⊙ Σ w_u Δ_u, m = 1 where the clients' sign agreement passes "
                   "gma_tau, else the agreement (gma_mask soft|bai)", (GMA_TAU, GMA_MASK, CLIENT_WEIGHTING)),
)

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]


def __getattr__(name: str) -> NoReturn:
    """A name that left this module (``PRESETS``, for :mod:`fedtune.algorithms.presets`) raises one
    line naming its new home."""
    raise old_name_error(__name__, name)
