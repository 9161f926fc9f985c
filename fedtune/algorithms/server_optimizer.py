"""Server optimisers: FedAvgM, FedAdam, FedYogi, FedAdagrad on the step of *any* server rule.

Flower's FedOpt strategies (docs/methods.md §14; Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2; Hsu et al. 2019 for FedAvgM) put an optimiser on the server: the round's
aggregate ``Δ`` (the FedAvg displacement, a "pseudo-gradient" pointing downhill) feeds a
momentum or adaptive step. fedtune applies it to the step that the run's server rule proposes,
whatever the rule is (FedAvg, FedOMG's matching direction, FedGaLA's aligned mean, FedDA/FedGP's
combination), so ``server_optimizer`` composes with every rule:

* ``Δ = (θ_rule − θ) / η`` with ``θ_rule`` the rule's new parameters and ``η`` the run's
  ``global_lr`` (each rule takes its step as ``θ + η · d``, so ``Δ`` is the rule's direction
  ``d``; for FedAvg the weighted mean of the client displacements, Flower's ``delta_t``);
* ``sgd`` (default): ``θ ← θ_rule`` unchanged, bit for bit today's rule;
* ``avgm``: ``v ← μ v + Δ``, ``θ ← θ + η v`` (Flower's FedAvgM with ``server_momentum`` μ;
  ``v`` starts at 0, so round 1 is ``θ + η Δ``);
* ``adam``: ``m ← β₁ m + (1 − β₁) Δ``, ``v ← β₂ v + (1 − β₂) Δ²``, ``θ ← θ + η m / (√v + τ)``;
* ``yogi``: as adam with ``v ← v − (1 − β₂) Δ² sign(v − Δ²)``;
* ``adagrad``: ``v ← v + Δ²``, ``θ ← θ + η Δ / (√v + τ)`` (Reddi et al.'s FedAdagrad has no
  momentum; Flower's passes β₁ = 0, the same);

elementwise, over the parameters only (batch-norm buffers follow the rule's
``aggregate_buffers``). ``m`` starts at 0 and ``v`` at ``τ²`` (Reddi et al.'s Algorithm 2:
``v₋₁ ≥ τ²``; Flower starts ``v`` at 0, which differs by ``τ²``, below float64's resolution next
to any ``Δ²`` at the default τ). State and arithmetic are float64; the new parameters are cast
to float32. Reddi et al.'s Algorithm 2 has no bias correction; Flower's FedAdam (not its
FedYogi or FedAdagrad) scales η by ``√(1 − β₂^(t+1)) / (1 − β₁^(t+1))`` at round t, which
changes the early rounds: ``server_adam_bias_correction: true`` runs Flower's form.

Written here rather than reusing Flower's strategies because fedtune's server rules are not
Flower strategies and the coordinator must stay NumPy only (Flower would bring its whole
runtime); the equations are Flower's and Reddi et al.'s, checked against a hand computation in
tests/test_server_optimizer.py.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> cfg = SimpleNamespace(params={})
>>> opt = FedAdam(cfg, global_lr=0.1)
>>> theta = np.zeros(2, np.float32)
>>> opt.step(theta, np.array([0.1, -0.2], np.float32), round=1)   # Δ = (1, −2): m = (.1, −.2), v ≈ (.01, .04)
array([ 0.1, -0.1], dtype=float32)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.base import HParam

SERVER_MOMENTUM = HParam("server_momentum", 0.9, "server_optimizer avgm: server momentum mu (v <- mu v + delta)",
                         lo=0.0, hi=1.0)
SERVER_BETA1 = HParam("server_beta1", 0.9, "server_optimizer adam/yogi: first-moment decay beta1", lo=0.0, hi=1.0)
SERVER_BETA2 = HParam("server_beta2", 0.99, "server_optimizer adam/yogi: second-moment decay beta2", lo=0.0, hi=1.0)
SERVER_TAU = HParam("server_tau", 1e-9, "server_optimizer adam/yogi/adagrad: adaptivity tau in m / (sqrt(v) + tau) "
                    "(Flower's default 1e-9; Reddi et al. tune it over 1e-10..1)", lo=0.0, lo_open=True)
SERVER_ADAM_BIAS_CORRECTION = HParam(
    "server_adam_bias_correction", False, "server_optimizer adam: false = Reddi et al.'s Algorithm 2 (no bias "
    "correction), true = Flower's FedAdam (eta * sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1)) at round t)",
    kind="bool", variant=True)


class ServerOptimizer:
    """``sgd``: the server rule's step as it is (the base class of the others).

    ``step(theta, proposed, round)`` gets the round's starting parameters and the rule's new
    ones (float32 ``[num_params]``) and returns the parameters the round ends with."""

    name: ClassVar[str] = "sgd"
    description: ClassVar[str] = "the server rule's own step: theta + global_lr * d (today's rule)"
    hparams: ClassVar[tuple[HParam, ...]] = ()

    def __init__(self, cfg: Any, global_lr: float):
        self.cfg = cfg
        self.lr = float(global_lr)

    def step(self, theta: np.ndarray, proposed: np.ndarray, round: int) -> np.ndarray:
        return proposed

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _Stateful(ServerOptimizer):
    """The optimisers that keep moments: ``Δ`` from the rule's step, float64 state, float32 out."""

    def __init__(self, cfg: Any, global_lr: float):
        super().__init__(cfg, global_lr)
        self.moments: dict[str, np.ndarray] = {}

    def step(self, theta: np.ndarray, proposed: np.ndarray, round: int) -> np.ndarray:
        base = np.asarray(theta, dtype=np.float64)
        delta = (np.asarray(proposed, dtype=np.float64) - base) / self.lr
        return (base + self.lr * self.direction(delta, round)).astype(np.float32)

    def direction(self, delta: np.ndarray, round: int) -> np.ndarray:
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
    description = "FedAvgM (Hsu et al. 2019): v <- server_momentum v + delta, theta <- theta + global_lr v"
    hparams = (SERVER_MOMENTUM,)

    def __init__(self, cfg: Any, global_lr: float):
        super().__init__(cfg, global_lr)
        self.momentum = float(SERVER_MOMENTUM.of(cfg))

    def direction(self, delta, round):
        v = self._moment("v", delta)
        v *= self.momentum
        v += delta
        return v


class FedAdam(_Stateful):
    name = "adam"
    description = "FedAdam (Reddi et al. 2021): m, v moments of delta, theta <- theta + global_lr m / (sqrt(v) + tau)"
    hparams = (SERVER_BETA1, SERVER_BETA2, SERVER_TAU, SERVER_ADAM_BIAS_CORRECTION)

    def __init__(self, cfg: Any, global_lr: float):
        super().__init__(cfg, global_lr)
        self.beta1 = float(SERVER_BETA1.of(cfg))
        self.beta2 = float(SERVER_BETA2.of(cfg))
        self.tau = float(SERVER_TAU.of(cfg))
        self.bias_correction = bool(SERVER_ADAM_BIAS_CORRECTION.of(cfg))

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> None:
        v *= self.beta2
        v += (1.0 - self.beta2) * squared

    def direction(self, delta, round):
        m = self._moment("m", delta)
        v = self._moment("v", delta, self.tau ** 2)
        m *= self.beta1
        m += (1.0 - self.beta1) * delta
        self.second_moment(v, delta * delta)
        scale = 1.0
        if self.bias_correction:
            scale = np.sqrt(1.0 - self.beta2 ** (round + 1.0)) / (1.0 - self.beta1 ** (round + 1.0))
        return scale * m / (np.sqrt(v) + self.tau)


class FedYogi(FedAdam):
    name = "yogi"
    description = "FedYogi (Reddi et al. 2021): as FedAdam with v <- v - (1 - beta2) delta^2 sign(v - delta^2)"
    hparams = (SERVER_BETA1, SERVER_BETA2, SERVER_TAU)

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> None:
        v -= (1.0 - self.beta2) * squared * np.sign(v - squared)


class FedAdagrad(_Stateful):
    name = "adagrad"
    description = "FedAdagrad (Reddi et al. 2021): v <- v + delta^2, theta <- theta + global_lr delta / (sqrt(v) + tau)"
    hparams = (SERVER_TAU,)

    def __init__(self, cfg: Any, global_lr: float):
        super().__init__(cfg, global_lr)
        self.tau = float(SERVER_TAU.of(cfg))

    def direction(self, delta, round):
        v = self._moment("v", delta, self.tau ** 2)
        v += delta * delta
        return delta / (np.sqrt(v) + self.tau)


__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi", "SERVER_ADAM_BIAS_CORRECTION", "SERVER_BETA1",
           "SERVER_BETA2", "SERVER_MOMENTUM", "SERVER_TAU", "ServerOptimizer"]
