"""FedDecorr as a fedtune plugin: a client method from outside fedtune, in one file.

Shi, Liang, Zhang, Tan, Bai, *Towards Understanding and Mitigating Dimensional Collapse in
Heterogeneous Federated Learning*, ICLR 2023 (arXiv:2210.00226); authors' code
github.com/bytedance/FedDecorr. Each local step minimises::

    CE(model(x), y) + feddecorr_beta · L_FedDecorr(z)

where ``z`` [N, d] are the batch's representations: the input of the model's classifier (its last
``nn.Linear``), as the authors' ``net(x, return_features=True)`` returns the globally pooled features
that enter ``classifier`` (``networks/resnetcifar.py``, ``networks/mobilenetv2.py``); one forward pass
gives both (a forward pre-hook on the classifier).

``L_FedDecorr`` is the authors' ``FedDecorrLoss`` (``loss.py``) by default
(``feddecorr_form: code``)::

    ẑ   = (z − mean_batch(z)) / sqrt(1e-8 + var_batch(z))      # var with N − 1 (torch's default)
    C   = ẑᵀ ẑ                                                 # [d, d], not divided by N
    L   = mean over the d(d − 1) off-diagonal entries of C² / N  # the diagonal is left out

and 0 for a batch of one example. The paper writes ``(1/d²) ‖K‖²_F`` with ``K = ẑᵀẑ / N``, the
diagonal included (``feddecorr_form: paper``); its off-diagonal part is the code's loss times
``(d − 1) / (N d)``, so the same ``β`` weighs the two forms about ``N`` times apart (64 at the
authors' batch size): the code's form is the default, as every number of the paper was made with it.

Run it (``--plugin`` imports this file in every process of the run, Ray's workers included)::

    fedtune run --plugin examples/plugins/feddecorr.py --algorithm feddecorr --rounds 3
    fedtune run --plugin examples/plugins/feddecorr.py --algorithm feddecorr --set server_rule=fedomg
    fedtune sweep --plugin examples/plugins/feddecorr.py --algorithm feddecorr --num-samples 8

Registering the method registers an algorithm of its name too (the method under FedAvg's weighted
mean). ``feddecorr_beta = 0`` is ``sgd`` bit for bit. The reported training loss is the
cross-entropy alone (comparable across methods); ``diag.feddecorr`` is the round's mean
``L_FedDecorr`` over its steps (unweighted by β).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import fedtune
from fedtune import ClientMethodSpec, HParam

EPS = 1e-8
"""``FedDecorrLoss.eps``: added to each dimension's batch variance before the square root."""

FORMS = ("code", "paper")

BETA = HParam("feddecorr_beta", 0.1, "FedDecorr: weight beta of the decorrelation loss (authors' scripts: 0.1 on "
              "CIFAR-10 and TinyImageNet, 0.05 on CIFAR-100)", lo=0.0,
              search={"distribution": "loguniform", "low": 0.01, "high": 1.0, "default": 0.1,
                      "help": "FedDecorr weight beta"})
FORM = HParam("feddecorr_form", "code", "FedDecorr loss: code = the authors' FedDecorrLoss (mean of the squared "
              "off-diagonal entries of z^T z, / N); paper = ||z^T z / N||_F^2 / d^2", kind="choice", choices=FORMS,
              variant=True)


def feddecorr_loss(z: torch.Tensor, form: str = "code") -> torch.Tensor:
    """``L_FedDecorr`` of the representations ``z`` ([N, d], or [N, ...] flattened): the authors'
    ``FedDecorrLoss`` (``form="code"``) or the paper's ``‖ẑᵀẑ/N‖²_F / d²`` (``"paper"``); 0 for N = 1.

    >>> z = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])   # perfectly correlated dimensions
    >>> round(float(feddecorr_loss(z)), 4), round(float(feddecorr_loss(z, "paper")), 4)
    (1.3333, 0.4444)
    """
    z = z.reshape(z.shape[0], -1)
    n, d = z.shape
    if n == 1:
        return z.new_zeros(())
    if d < 2:
        raise RuntimeError(f"FedDecorr needs representations of at least 2 dimensions; the classifier's input has {d}")
    z = z - z.mean(dim=0, keepdim=True)
    z = z / torch.sqrt(EPS + z.var(dim=0, keepdim=True))
    corr = z.t() @ z
    if form == "paper":
        return (corr / n).pow(2).sum() / d ** 2
    off_diagonal = corr.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()  # the authors' _off_diagonal
    return off_diagonal.pow(2).mean() / n


def classifier(model: nn.Module) -> nn.Linear:
    """The model's classifier: its last ``nn.Linear`` in module order (whose input is
    ``fedtune.models.encode``'s features for every model fedtune builds)."""
    last = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            last = module
    if last is None:
        raise TypeError(f"FedDecorr needs a model ending in a linear classifier; a {type(model).__name__} has none")
    return last


class FedDecorr(fedtune.ClientMethod):
    """Local SGD on cross-entropy plus ``feddecorr_beta`` times :func:`feddecorr_loss` of the batch's
    representations."""

    spec = ClientMethodSpec(name="feddecorr", hparams=(BETA, FORM),
                            description="FedDecorr (Shi et al., ICLR 2023): local SGD on CE + beta * the decorrelation "
                                        "loss of the classifier's input features (plugin example)")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.beta, self.form = float(BETA.of(cfg)), FORM.of(cfg)

    def train(self, ctx: fedtune.ClientContext) -> fedtune.ClientOutcome:
        model, opt = ctx.model, self.start_round(ctx)
        if self.beta == 0.0:  # plain CE: exactly sgd
            def plain(x: torch.Tensor, y: torch.Tensor) -> float:
                return fedtune.descend(opt, F.cross_entropy(model(x), y), ctx.record_step)

            return self.local_loop(ctx, plain, lambda steps: {"feddecorr": 0.0})
        seen: list[torch.Tensor] = []
        hook = classifier(model).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        total = [0.0]

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            seen.clear()
            logits = model(x)
            ce = F.cross_entropy(logits, y)
            z = seen[-1]
            with torch.autocast(device_type=x.device.type, enabled=False):  # the statistics in float32 at least
                decorr = feddecorr_loss(z.float() if z.dtype in (torch.float16, torch.bfloat16) else z, self.form)
            total[0] += float(decorr.detach())
            value = fedtune.descend(opt, ce + self.beta * decorr, ctx.record_step)
            return float(ce.detach()) if math.isfinite(value) else value

        try:
            return self.local_loop(ctx, step, lambda steps: {"feddecorr": total[0] / max(steps, 1)})
        finally:
            hook.remove()


fedtune.register(FedDecorr)
