"""Server optimisers: FedAvgM, FedAdam, FedYogi, FedAdagrad on the step of *any* server rule.

Flower's FedOpt strategies (docs/methods-server.md §14; Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2; Hsu et al. 2019 for FedAvgM) put an optimiser on the server: the round's
aggregate ``Δ`` (the FedAvg displacement, a "pseudo-gradient" pointing downhill) feeds a
momentum or adaptive step. fedtune applies it to the step that the run's server rule proposes,
whatever the rule is (FedAvg, FedOMG's matching direction, FedGaLA's aligned mean, FedDA/FedGP's
combination), so ``server_optimizer`` composes with every rule:

* ``Δ = d``, the rule's direction (each rule takes its step as ``θ_rule = θ + η · d`` with ``η``
  the run's ``global_lr``, and hands ``d`` over in float64 as ``AggregateResult.direction``; for
  FedAvg the weighted mean of the client displacements, Flower's ``delta_t``). Never recovered as
  ``(θ_rule − θ)/η`` from the float32 weights: a component with ``|η d| < ulp(θ)/2`` would be lost
  and the rest carry ``ulp/η`` of noise (θ = 0.3, η = 0.01, d = 1e-6: a 1.2e-8 move instead of
  Algorithm 2's 0.0099);
* ``sgd`` (default): ``θ ← θ_rule`` unchanged, bit for bit today's rule;
* ``avgm``: ``v ← μ v + Δ``, ``θ ← θ + η v`` (Flower's FedAvgM with ``server_momentum`` μ;
  ``v`` starts at 0, so round 1 is ``θ + η Δ``);
* ``adam``: ``m ← β₁ m + (1 − β₁) Δ``, ``v ← β₂ v + (1 − β₂) Δ²``, ``θ ← θ + η m / (√v + τ)``;
* ``yogi``: as adam with ``v ← v − (1 − β₂) Δ² sign(v − Δ²)``;
* ``adagrad``: ``v ← v + Δ²``, ``θ ← θ + η Δ / (√v + τ)`` (Reddi et al.'s FedAdagrad has no
  momentum; Flower's passes β₁ = 0, the same);

elementwise, over the parameters only (batch-norm buffers follow the rule's
``aggregate_buffers``). ``m`` starts at 0 and ``v`` at ``τ²`` (``server_v_start: tau_squared``,
Reddi et al.'s Algorithm 2: ``v₋₁ ≥ τ²``) or at 0 (``server_v_start: zero``, Flower's FedAdam,
FedYogi and FedAdagrad): not a rounding matter where ``Δ²`` is near ``τ²`` (τ = 1e-3, Δ = 1e-3:
FedAdam's first step is 0.050 η from ``τ²``, 0.091 η from 0). State and arithmetic are float64;
the new parameters are cast to float32. β₁, β₂ are in [0, 1) as in Algorithm 2 (β₁ = 1 never
moves, β₂ = 1 keeps ``v`` at its start). Reddi et al.'s Algorithm 2 has no bias correction;
Flower's FedAdam (not its FedYogi or FedAdagrad) scales η by ``√(1 − β₂^(t+1)) / (1 − β₁^(t+1))``
at round t, which changes the early rounds: ``server_adam_bias_correction: true`` runs Flower's
form.

Written here rather than reusing Flower's strategies because fedtune's server rules are not
Flower strategies and the coordinator must stay NumPy only (Flower would bring its whole
runtime); the equations are Flower's and Reddi et al.'s, checked against a hand computation in
tests/algorithms/test_server_optimizer.py.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> cfg = SimpleNamespace(params={})
>>> opt = FedAdam(cfg, global_lr=0.1)
>>> theta = np.zeros(2, np.float32)
>>> d = np.array([1.0, -2.0])                       # the rule's direction: θ_rule = θ + 0.1 d
>>> opt.step(theta, (theta + 0.1 * d).astype(np.float32), d, round=1)   # m = (.1, −.2), v ≈ (.01, .04)
array([ 0.1, -0.1], dtype=float32)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.base import HParam, RunConfig
from fedtune.algorithms.optimizer_declarations import SERVER_ADAM_BIAS_CORRECTION, SERVER_BETA1, SERVER_BETA2, SERVER_MOMENTUM, SERVER_TAU, SERVER_V_START



class ServerOptimizer:
    """``sgd``: the server rule's step as it is (the base class of the others).

    ``step(theta, proposed, direction, round)`` gets the round's starting parameters, the rule's
    new ones (float32 ``[num_params]``, ``θ + η d`` rounded) and its direction ``d`` (float64, or
    None from a rule that gives none) and returns the parameters the round ends with."""

    name: ClassVar[str] = "sgd"
    description: ClassVar[str] = "the server rule's own step: theta + global_lr * d (today's rule)"
    hparams: ClassVar[tuple[HParam, ...]] = ()

    def __init__(self, cfg: RunConfig, global_lr: float):
        self.cfg = cfg
        self.lr = float(global_lr)

    def step(self, theta: np.ndarray, proposed: np.ndarray, direction: np.ndarray | None, round: int) -> np.ndarray:
        return proposed

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _Stateful(ServerOptimizer):
    """The optimisers that keep moments: ``Δ = d``, the rule's float64 direction; float64 state,
    ``θ + η · adapted(Δ)`` in float64, float32 out. The rule's float32 proposal is not used."""

    def __init__(self, cfg: RunConfig, global_lr: float):
        super().__init__(cfg, global_lr)
        self.moments: dict[str, np.ndarray] = {}

    def step(self, theta: np.ndarray, proposed: np.ndarray, direction: np.ndarray | None, round: int) -> np.ndarray:
        if direction is None:
            raise ValueError(f"server_optimizer {self.name} needs the server rule's direction d "
                             "(AggregateResult.direction); this rule gives none: use server_optimizer sgd")
        delta = np.asarray(direction, dtype=np.float64)
        if delta.shape != np.shape(theta):
            raise ValueError(f"direction {delta.shape} and parameters {np.shape(theta)} disagree")
        return (np.asarray(theta, dtype=np.float64) + self.lr * self.adapted(delta, round)).astype(np.float32)

    def adapted(self, delta: np.ndarray, round: int) -> np.ndarray:
        """The direction the optimiser steps along, ``θ + η · adapted(Δ)``, its moments updated."""
        raise NotImplementedError

    def _moment(self, key: str, like: np.ndarray, start: float = 0.0) -> np.ndarray:
        if key not in self.moments or self.moments[key].shape != like.shape:
            self.moments[key] = np.full(like.shape, start, dtype=np.float64)
        return self.moments[key]

    def state_dict(self) -> dict[str, Any]:
        return {k: v.copy() for k, v in self.moments.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments = {k: np.array(v, dtype=np.float64) for k, v in state.items()}


class FedAvgM(_Stateful):
    name = "avgm"

    def __init__(self, cfg: RunConfig, global_lr: float):
        super().__init__(cfg, global_lr)
        self.momentum = float(SERVER_MOMENTUM.of(cfg))

    def adapted(self, delta, round):
        v = self._moment("v", delta)
        v *= self.momentum
        v += delta
        return v


class FedAdam(_Stateful):
    name = "adam"

    def __init__(self, cfg: RunConfig, global_lr: float):
        super().__init__(cfg, global_lr)
        self.beta1 = float(SERVER_BETA1.of(cfg))
        self.beta2 = float(SERVER_BETA2.of(cfg))
        self.tau = float(SERVER_TAU.of(cfg))
        self.v_start = self.tau ** 2 if SERVER_V_START.of(cfg) == "tau_squared" else 0.0
        self.bias_correction = bool(SERVER_ADAM_BIAS_CORRECTION.of(cfg))

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> None:
        v *= self.beta2
        v += (1.0 - self.beta2) * squared

    def adapted(self, delta, round):
        m = self._moment("m", delta)
        v = self._moment("v", delta, self.v_start)
        m *= self.beta1
        m += (1.0 - self.beta1) * delta
        self.second_moment(v, delta * delta)
        scale = 1.0
        if self.bias_correction:
            scale = np.sqrt(1.0 - self.beta2 ** (round + 1.0)) / (1.0 - self.beta1 ** (round + 1.0))
        return scale * m / (np.sqrt(v) + self.tau)


class FedYogi(FedAdam):
    name = "yogi"

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> None:
        v -= (1.0 - self.beta2) * squared * np.sign(v - squared)


class FedAdagrad(_Stateful):
    name = "adagrad"

    def __init__(self, cfg: RunConfig, global_lr: float):
        super().__init__(cfg, global_lr)
        self.tau = float(SERVER_TAU.of(cfg))
        self.v_start = self.tau ** 2 if SERVER_V_START.of(cfg) == "tau_squared" else 0.0

    def adapted(self, delta, round):
        v = self._moment("v", delta, self.v_start)
        v += delta * delta
        return delta / (np.sqrt(v) + self.tau)


__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi", "ServerOptimizer"]
