"""FedADG's declarations (docs/methods-benchmark.md §24): its seventeen hyperparameters, the readings
``fedadg_variant`` names (the authors' PACS code, their VLCS code, Bai et al.'s), and its
:class:`~fedtune.algorithms.base.ClientMethodSpec`, which :mod:`fedtune.algorithms.declarations`
lists with every other client method. Split from that module (over 500 lines) as one method's whole
declaration; torch-free and NumPy-free like it."""

from __future__ import annotations

from fedtune.algorithms.base import ClientMethodSpec, HParam, search_loguniform, search_uniform, variant

# FedADG (docs/methods-benchmark.md §24): defaults = the authors' PACS code; fedadg_variant's readings set the knobs they change.
FEDADG_ALPHA = HParam("fedadg_alpha", 0.85, "FedADG: weight alpha of the label-smoothed cross-entropy against the "
                      "feature alignment (1 - alpha) in the adversarial steps (the authors' code: 0.85; Bai et al.'s "
                      "hparam1: 0.15, 0.1)", lo=0.0, hi=1.0,
                      search={**search_uniform(0.05, 0.95, 0.85), "help": "cross-entropy weight"})
FEDADG_EPOCHS = HParam("fedadg_epochs", 1, "FedADG: passes of adversarial steps over the client's data after its "
                       "local_steps of cross-entropy (the authors': 7 after 3 on PACS, 10 after 5 on VLCS; Bai et al.'s "
                       "hparam2: 1 after 1; 0 = the local steps only)", kind="int", lo=0)
FEDADG_GEN_LR = HParam("fedadg_gen_lr", 1e-4, "FedADG generator's SGD learning rate (momentum 0.9, weight decay "
                       "1e-5; the authors' lr1 0.007 under a warm-up from 1e-7 restarted each round: 7e-5..4.2e-4 "
                       "applied on PACS; Bai et al.'s hparam3: 1e-4 to 1e-3)", lo=0.0,
                       search={**search_loguniform(1e-5, 1e-2, 1e-4), "help": "generator learning rate"})
FEDADG_DISC_LR = HParam("fedadg_disc_lr", 1e-4, "FedADG discriminator's SGD learning rate (as fedadg_gen_lr; Bai "
                        "et al.'s hparam4)", lo=0.0,
                        search={**search_loguniform(1e-5, 1e-2, 1e-4), "help": "discriminator learning rate"})
FEDADG_NOISE = HParam("fedadg_noise", 2048, "FedADG generator's noise inputs u ~ U(0, 1) (the authors' input_size: "
                      "2048; Bai et al.'s hparam5: 0 unless set, 1024 in their CelebA and Camelyon17 sweeps)",
                      kind="int", lo=0, hi=8192)
FEDADG_LATENT = HParam("fedadg_latent", 4096, "FedADG generator's hidden width (all codes: 4096)", kind="int", lo=1, hi=8192)
FEDADG_DISC_WIDTH = HParam("fedadg_disc_width", 1024, "FedADG discriminator's projection and hidden widths (all codes: "
                           "1024)", kind="int", lo=1, hi=8192)
FEDADG_SOFT_LABEL = HParam("fedadg_soft_label", 0.7, "FedADG: the value at the class of the label vector y_s that "
                           "G and D take, 0 elsewhere (the authors' PACS code: 0.7; their VLCS code and Bai et al.'s: "
                           "0.6)", lo=0.0, hi=1.0, lo_open=True)
FEDADG_LABEL_SMOOTHING = HParam("fedadg_label_smoothing", 0.01, "FedADG: label smoothing s of the cross-entropy (the "
                                "authors' PACS command: 0.01; VLCS and Bai et al.'s: 0.2)", lo=0.0, hi=1.0, hi_open=True)
FEDADG_SMOOTHING_FORM = variant("fedadg_smoothing_form", "FedADG: authors = their LabelSmoothingLoss (1 - s at the "
                                "class, s/(K - 1) elsewhere); torch = PyTorch's label_smoothing (s/K added to every "
                                "class; Bai et al.'s)", ("authors", "torch"))
FEDADG_PRETRAIN_LOSS = variant("fedadg_pretrain_loss", "FedADG: the loss of the local_steps before the adversarial "
                               "passes: smoothed = the label-smoothed cross-entropy (the authors') or plain (Bai et "
                               "al.'s)", ("smoothed", "plain"))
FEDADG_ORDER = variant("fedadg_order", "FedADG: each batch's steps: disc_first = D, then the model, then G (the "
                       "authors'); model_first = the model, then D, then G (Bai et al.'s)",
                       ("disc_first", "model_first"))
FEDADG_DISC_LOSS = variant("fedadg_disc_loss", "FedADG discriminator's loss: least_squares = mean((1 - D(G))^2 + "
                           "D(z)^2) (the authors' PACS code); negated = -mean(D(G)^2 + (1 - D(z))^2) (their VLCS "
                           "code, Bai et al.'s)", ("least_squares", "negated"))
FEDADG_GEN_LOSS = variant("fedadg_gen_loss", "FedADG generator's loss: squared = mean(D(G)^2), G trained (the "
                          "authors' PACS code); frozen = G never trains (their VLCS code and Bai et al.'s detach G "
                          "before the loss)", ("squared", "frozen"))
FEDADG_DISC_ARCH = variant("fedadg_disc_arch", "FedADG discriminator: pacs = [P z, y_s] -> Linear, Kaiming-uniform "
                           "weights (the authors' PACS Nets.py); vlcs = P [z, y_s], P divided by its norm (their VLCS "
                           "code, Bai et al.'s)", ("pacs", "vlcs"))
FEDADG_MODEL_MODE = variant("fedadg_model_mode", "FedADG: the model's adversarial steps in training mode, or "
                            "eval_after_disc: left in eval mode once D's step set it (Bai et al.'s)",
                            ("train", "eval_after_disc"))
_FEDADG_VLCS = (("fedadg_disc_loss", "negated"), ("fedadg_gen_loss", "frozen"), ("fedadg_disc_arch", "vlcs"),
                ("fedadg_soft_label", 0.6), ("fedadg_label_smoothing", 0.2))
_FEDADG_BAI = _FEDADG_VLCS + (("fedadg_order", "model_first"), ("fedadg_model_mode", "eval_after_disc"),
                              ("fedadg_pretrain_loss", "plain"), ("fedadg_smoothing_form", "torch"), ("fedadg_alpha", 0.15),
                              ("fedadg_noise", 0), ("fedadg_gen_lr", 7e-4), ("fedadg_disc_lr", 7e-4),
                              ("client_weighting", "examples"))
FEDADG_VARIANT = variant("fedadg_variant", "FedADG reading: authors = the authors' PACS code; authors_vlcs = their "
                         "VLCS code (G never trains); bai = Bai et al.'s code and PACS sweep. Each sets the fedadg_* "
                         "knobs it differs on (and bai client_weighting=examples) where they are unset",
                         ("authors", "authors_vlcs", "bai"),
                         implies=(("authors_vlcs", _FEDADG_VLCS), ("bai", _FEDADG_BAI)),
                         trial_id="as_run",  # fixed until issue 44
                         retired=(("fixed", "its generator loss mean((1 - D(G))^2) moved G to D's generated side, "
                                   "away from the features: "
                       "the opposite sign of the authors' mean(D(G)^2); use fedadg_variant=authors (their PACS code, "
                       "the default) or bai"),))
FEDADG_HPARAMS = (FEDADG_ALPHA, FEDADG_EPOCHS, FEDADG_GEN_LR, FEDADG_DISC_LR, FEDADG_NOISE, FEDADG_LATENT,
                  FEDADG_DISC_WIDTH, FEDADG_SOFT_LABEL, FEDADG_LABEL_SMOOTHING, FEDADG_SMOOTHING_FORM,
                  FEDADG_PRETRAIN_LOSS, FEDADG_ORDER, FEDADG_DISC_LOSS, FEDADG_GEN_LOSS, FEDADG_DISC_ARCH,
                  FEDADG_MODEL_MODE, FEDADG_VARIANT)


FEDADG_SPEC = ClientMethodSpec(
    "fedadg", "fedtune.algorithms.client.fedadg:FedADG",
    "FedADG: label-smoothed local SGD, then adversarial steps aligning the encoder features to a "
    "federated generator's class-conditional distribution through the client's own discriminator",
    FEDADG_HPARAMS,
    scales_fp16_gradients=False,  # the discriminator's and generator's steps bypass the scaler
    server_side="fedtune.algorithms.server.fedadg:FedADGServer", keeps_client_state=True, reads_features=True)

__all__ = ["FEDADG_ALPHA", "FEDADG_EPOCHS", "FEDADG_GEN_LR", "FEDADG_DISC_LR", "FEDADG_NOISE", "FEDADG_LATENT",
           "FEDADG_DISC_WIDTH", "FEDADG_SOFT_LABEL", "FEDADG_LABEL_SMOOTHING", "FEDADG_SMOOTHING_FORM", "FEDADG_PRETRAIN_LOSS",
           "FEDADG_ORDER", "FEDADG_DISC_LOSS", "FEDADG_GEN_LOSS", "FEDADG_DISC_ARCH", "FEDADG_MODEL_MODE", "FEDADG_VARIANT", "FEDADG_HPARAMS", "FEDADG_SPEC"]
