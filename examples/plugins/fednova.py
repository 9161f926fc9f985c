"""FedNova as a fedtune plugin: a server rule from outside fedtune, in one file.

Wang, Liu, Liang, Joshi, Poor, *Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization*, NeurIPS 2020 (arXiv:2007.07481); authors' code github.com/JYWa/FedNova
(``distoptim/FedNova.py``). FedAvg weighs client ``i``'s displacement ``Δ_i = θ_i − θ`` by ``p_i``, so a
client that took more local steps pulls the model towards its own objective. FedNova normalises each
displacement by the client's *normalising factor* ``a_i`` (the ℓ1 norm of its local solver's step
weights) and rescales the mean by an effective step count ``τ_eff``::

    d = τ_eff · Σ_i p_i Δ_i / a_i,        θ ← θ + global_lr · d

``p_i`` are the round's FedAvg weights (training examples, the authors' ``ratio``). ``a_i`` is counted
as the authors' optimiser counts its ``local_normalizing_vec``, step by step over the ``τ_i`` local
steps client ``i`` took this round (``RoundInfo.steps``), from the run's ``local_momentum`` ``ρ`` and,
when the client method is fedtune's ``prox`` (FedProx), ``η μ`` (its learning rate times ``prox_mu``)::

    c ← ρ c + 1;  a ← a + c          (ρ > 0: momentum SGD, a = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ))
    a ← (1 − η μ) a + 1               (η μ > 0: proximal SGD, a = [1 − (1 − η μ)^τ] / (η μ))
    a ← a + 1                         (neither: plain SGD, a = τ)

``τ_eff = Σ_i p_i a_i``, or ``Σ_i p_i τ_i`` under a proximal solver (the authors' ``average``). With
``fednova_normalizer: steps`` every ``a_i = τ_i`` (the paper's vanilla-SGD form, whatever the solver).

Run it::

    fedtune run --plugin examples/plugins/fednova.py --algorithm fednova --set local_epochs=2
    fedtune run --plugin examples/plugins/fednova.py --algorithm fedprox --set server_rule=fednova
    fedtune run --plugin examples/plugins/fednova.py --algorithm fednova --set server_optimizer=adam

Registering the rule registers an algorithm of its name too (plain local SGD under FedNova). The rule
returns ``d`` as its ``direction``, so the server optimisers (``avgm``, ``adam``, ...) step along it;
the authors' ``gmf`` (server momentum) is ``server_optimizer: avgm``. With equal ``τ_i`` and no
momentum or proximal term, ``d`` is FedAvg's ``Σ p_i Δ_i`` (up to rounding). ``diag.fednova_tau_eff``
is the round's ``τ_eff``.

Departures: the floating buffers (batch-norm statistics) are the ``p``-weighted mean, as every fedtune
rule (the authors' optimiser averages parameters only, so each worker keeps its own statistics);
fedtune's ``prox`` adds ``μ(θ − θ_global)`` to the gradient before momentum where the authors' optimiser
adds it after, so with momentum and FedProx together the local solver itself differs (``a_i`` is
counted as the authors count it). Client methods other than ``prox`` are normalised as (momentum) SGD,
whatever extra terms their step has. Refused in one line: a local optimiser other than sgd (no
``a_i``), and FedEx tuning a knob ``a_i`` depends on per client.
"""

from __future__ import annotations

import numpy as np

import fedtune
from fedtune import AggregateResult, HParam, ServerRuleSpec

NORMALIZERS = ("solver", "steps")
PROXIMAL = {"prox": "prox_mu"}
"""fedtune client methods that run proximal SGD, and the hyperparameter holding their ``μ``."""

NORMALIZER = HParam("fednova_normalizer", "solver", "FedNova a_i: solver = the local solver's normalising factor "
                    "as the authors' optimiser counts it (local_momentum, FedProx's prox_mu); steps = the local "
                    "step count tau_i", kind="choice", choices=NORMALIZERS)


def normalizing_factor(steps: int, momentum: float = 0.0, eta_mu: float = 0.0) -> float:
    """``a_i`` of ``steps`` local steps: the authors' ``local_normalizing_vec`` after ``steps`` calls of
    ``FedNova.step`` with momentum ``ρ = momentum`` and ``η μ = eta_mu`` (both 0: ``a_i = steps``).

    >>> normalizing_factor(3), normalizing_factor(3, 0.5), normalizing_factor(3, eta_mu=0.5)
    (3.0, 4.25, 1.75)
    """
    vec = counter = 0.0
    for _ in range(int(steps)):
        if momentum != 0.0:
            counter = counter * momentum + 1.0
            vec += counter
        if eta_mu != 0.0:
            vec = vec * (1.0 - eta_mu) + 1.0
        if momentum == 0.0 and eta_mu == 0.0:
            vec += 1.0
    return vec


def _proximal_mu(cfg) -> float:
    """The client method's ``μ`` when it runs proximal SGD (its value in the run, else its default); 0 otherwise."""
    name = cfg.resolved.client_method_name
    return float(cfg.resolved.hyperparameters(cfg)[PROXIMAL[name]]) if name in PROXIMAL else 0.0


def check(cfg) -> None:
    """FedNova's a_i exists for local SGD only, and from one momentum and learning rate per run."""
    if getattr(cfg, "local_optimizer", "sgd") != "sgd":
        raise fedtune.ConfigError(f"field 'local_optimizer': {cfg.local_optimizer} has no FedNova normalising factor "
                                  f"(server rule fednova); allowed: sgd")
    tuned = set(cfg.fedex_knobs or ()) if getattr(cfg, "fedex_configs", 0) else set()
    depends = {"local_momentum"} | ({"local_lr", PROXIMAL[cfg.resolved.client_method_name]}
                                    if cfg.resolved.client_method_name in PROXIMAL else set())
    if NORMALIZER.of(cfg) == "solver" and tuned & depends:
        raise fedtune.ConfigError(f"field 'fedex_knobs': FedEx tunes {', '.join(sorted(tuned & depends))} per client, "
                                  "which FedNova's normalising factor reads from the run (server rule fednova); "
                                  f"allowed: knobs other than {', '.join(sorted(depends))}, "
                                  "or fednova_normalizer: steps")


class FedNova(fedtune.ServerRule):
    """Normalised averaging: ``d = τ_eff Σ_i p_i Δ_i / a_i`` (module docstring), ``θ + global_lr · d``."""

    spec = ServerRuleSpec(name="fednova", hparams=(NORMALIZER,), check=check,
                          description="FedNova (Wang et al., NeurIPS 2020): normalised averaging, each update divided "
                                      "by its local solver's normalising factor (plugin example)")

    def __init__(self, cfg, layout):
        super().__init__(cfg, layout)
        self.normalizer = NORMALIZER.of(cfg)
        self.momentum = float(cfg.local_momentum)
        self.mu = _proximal_mu(cfg)

    def factors(self, info: fedtune.RoundInfo) -> np.ndarray:
        """Each row's ``a_i`` (float64)."""
        if self.normalizer == "steps":
            return np.asarray(info.steps, dtype=np.float64)
        out = []
        for steps, role in zip(info.steps, info.roles):
            lr = self.cfg.target_lr if role == "target" else float(self.cfg.local_lr)
            out.append(normalizing_factor(steps, self.momentum, lr * self.mu))
        return np.asarray(out, dtype=np.float64)

    def aggregate(self, params, updates, weights, *, extras, round, info):
        p = np.asarray(weights, dtype=np.float64)
        a = self.factors(info)
        steps = np.asarray(info.steps, dtype=np.float64)
        proximal = self.normalizer == "solver" and self.mu != 0.0
        tau_eff = float(np.sum(p * (steps if proximal else a)))
        # a client that took no step has Δ_i = 0: it adds nothing (never 0/0)
        scale = np.divide(p * tau_eff, a, out=np.zeros_like(p), where=a > 0)
        d = fedtune.weighted_sum(updates, scale, threads=self.threads)
        return AggregateResult(fedtune.server_step(params, d, self.global_lr), {"fednova_tau_eff": tau_eff}, d)


fedtune.register(FedNova)
