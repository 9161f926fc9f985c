"""FedEx (Khodak et al., NeurIPS 2021, arXiv 2106.04502): the clients' hyperparameters tuned inside
one federated run. NumPy only: the coordinator's half (the client half is
:mod:`fedtune.algorithms.client.fedex`).

The server keeps a distribution ``θ`` over ``k`` local configurations (values of the knobs
``fedex_knobs``: ``local_lr``, ``prox_mu``, ...). Every round each participant trains with a
configuration drawn from ``θ``; after its local training it scores the trained model on its own
validation split (error, or loss); the server then takes one exponentiated-gradient step::

    g_j = Σ_i  w_i (s_i − λ) · 1[c_i = j] / θ_j          (w_i = |V_i| / Σ |V|)
    z  ← z − η g,   z ← z − logsumexp(z),   θ = exp(z)

with the baseline ``λ`` the discounted mean of the earlier rounds' weighted scores (factor
``fedex_baseline``: 0 = the last round's, 1 = their mean; 0 in the first round) and the step
``η = η0 / denom`` by ``fedex_schedule`` (η0 = sqrt(2 log k), the authors' ``'auto'``):
``aggressive`` ``‖g‖∞``, ``adaptive`` the root of the running sum of ``‖g‖∞²``, ``auto`` ``sqrt(t)``,
``constant`` 1, ``scale`` ``1/sqrt(2 log k)``. With ``fedex_diff`` the score is the change the
local training made (after − before) and the baseline that of the differences. Below the entropy
``fedex_cutoff`` the distribution stops changing and every client trains the most likely
configuration. This is the authors' ``FedEx.step`` (mkhodak/FedEx, ``hyper.py``), written again
for arrays: the departures are listed in docs/methods-server.md §25.

**The configurations** (:func:`configurations`). Configuration 0 is the run's own values of the
knobs (what the study's searcher sampled: FedEx wrapped in the sweep, as the authors wrap it in
random search or successive elimination); configurations 1..k−1 perturb each knob independently
by ``fedex_eps`` of its declared search range, as the authors' ``get_client`` does (their learning
rate: ``log10 lr ± U(−4ε, 4ε)`` clipped to the range ``[−4, 0]`` of width 4; their epochs:
``± ceil(4ε)`` on ``1..5``): a log-scale knob moves on the log scale, an integer knob by an
integer, a categorical knob (``local_momentum``'s choices) by ``ceil(ε (n − 1))`` positions. At
``fedex_eps = 0`` every configuration is the run's own, so the run computes what it computes
without FedEx (tested bit for bit).

Every draw is seeded from the run's seed (configurations) and (seed, round) (the round's
assignment), so a run restored from a checkpoint continues exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.server.tuner import InRunTuner
from fedtune.algorithms.tuner_declarations import (FEDEX_BASELINE, FEDEX_CONFIGS, FEDEX_CUTOFF, FEDEX_DIFF, FEDEX_EPS,
                                                   FEDEX_KNOBS, FEDEX_SCHEDULE, FEDEX_SCHEDULES, client_knob_hparams,
                                                   knob_searches)
from fedtune.old_names import old_name_error

__all__ = ["FedExServer", "KnobRange", "configurations", "discounted_mean", "entropy", "exponentiated_gradient_step",
           "fedex_server", "knob_ranges"]

# Seed streams (numpy SeedSequence entropy after the run's seed): the configurations, each round's draw.
_CONFIG_STREAM, _ROUND_STREAM = 0xFE0E0, 0xFE0E1


@dataclass(frozen=True)
class KnobRange:
    """Where FedEx perturbs one knob: ``kind`` float | int | categorical, ``low``/``high`` (floats
    and ints), ``log`` (perturb on the log scale: log10 for floats, log2 for ints, as the authors'
    learning rate and batch size), ``choices`` (categorical)."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[float, ...] = ()

    def perturb(self, value: float, eps: float, rng: np.random.Generator) -> float:
        """``value`` moved by at most ``eps`` of this range (the authors' perturbation), clipped to it."""
        if self.kind == "categorical":
            pos = int(np.argmin([abs(float(c) - float(value)) for c in self.choices]))
            reach = math.ceil(eps * (len(self.choices) - 1))
            lo, hi = max(pos - reach, 0), min(pos + reach, len(self.choices) - 1)
            return float(self.choices[int(rng.integers(lo, hi + 1))])
        if self.kind == "int":
            scale = math.log2 if self.log else float
            lo, hi, v = scale(self.low), scale(self.high), scale(value)
            reach = math.ceil(eps * (hi - lo))
            step = int(rng.integers(round(v) - reach, round(v) + reach + 1))
            step = min(max(step, round(lo)), round(hi))
            return float(2 ** step if self.log else step)
        if self.log:  # a knob at 0 (weight decay off) moves from the range's lower end
            lo, hi, v = math.log10(self.low), math.log10(self.high), math.log10(max(value, self.low))
        else:
            lo, hi, v = float(self.low), float(self.high), float(value)
        moved = min(max(v + rng.uniform(-eps * (hi - lo), eps * (hi - lo)), lo), hi)
        return float(10.0 ** moved) if self.log else float(moved)


def knob_ranges(knobs: Sequence[str], method_hparams: Mapping[str, Any]) -> list[KnobRange]:
    """The :class:`KnobRange` of each knob, from its declared range
    (:func:`~fedtune.algorithms.tuner_declarations.knob_searches`: the authors' for the knobs they
    tune, a client method's other hyperparameters (``method_hparams``: name ->
    :class:`~fedtune.algorithms.base.HParam`) their declared ``search``). Raises ConfigError naming
    the knob and the allowed ones."""
    out = []
    for name, entry in knob_searches(knobs, method_hparams):
        dist = entry["distribution"]
        if dist == "categorical":
            out.append(KnobRange(name, "categorical", choices=tuple(float(c) for c in entry["choices"])))
        elif dist == "int":
            out.append(KnobRange(name, "int", float(entry["low"]), float(entry["high"]), bool(entry.get("log", False))))
        else:
            out.append(KnobRange(name, "float", float(entry["low"]), float(entry["high"]), dist == "loguniform"))
    return out


def configurations(base: Sequence[float], ranges: Sequence[KnobRange], k: int, eps: float,
                   seed: int) -> np.ndarray:
    """``[k, len(ranges)]`` float64: row 0 the run's own values ``base``, rows 1.. each knob
    perturbed by ``eps`` of its range (:meth:`KnobRange.perturb`), drawn from the run's seed.

    >>> r = [KnobRange("local_lr", "float", 0.005, 0.2, log=True)]
    >>> c = configurations([0.05], r, 3, 0.0, seed=0); c[:, 0].tolist()
    [0.05, 0.05, 0.05]
    """
    rng = np.random.default_rng([int(seed), _CONFIG_STREAM])
    out = np.empty((k, len(ranges)), dtype=np.float64)
    out[0] = [float(v) for v in base]
    for j in range(1, k):
        out[j] = [float(b) if eps == 0 else r.perturb(float(b), eps, rng) for b, r in zip(base, ranges)]
    return out


def discounted_mean(trace: Sequence[float], factor: float) -> float:
    """The authors' ``discounted_mean``: weights ``factor**(age)``, the newest entry age 0
    (``factor`` 0: the newest alone; 1: the plain mean).

    >>> discounted_mean([1.0, 2.0, 4.0], 0.0), discounted_mean([1.0, 2.0, 4.0], 1.0)
    (4.0, 2.3333333333333335)
    """
    trace = np.asarray(trace, dtype=np.float64)
    weight = float(factor) ** np.flip(np.arange(len(trace)), axis=0)
    return float(np.inner(trace, weight) / weight.sum())


def entropy(theta: np.ndarray) -> float:
    """Shannon entropy (nats) of the distribution ``theta``."""
    p = theta[theta > 0.0]
    return float(-(p * np.log(p)).sum())


def exponentiated_gradient_step(z: np.ndarray, indices: Sequence[int], scores: Sequence[float],
                                weights: Sequence[float], baseline: float, schedule: str, eta0: float,
                                store: float) -> tuple[np.ndarray, float, float, np.ndarray]:
    """One FedEx step on the log-probabilities ``z`` (the authors' ``FedEx.step`` for one grid
    dimension): the stochastic gradient ``g`` of the weighted scores (weights normalised here),
    the step size by ``schedule``, ``z − η g`` renormalised. Returns ``(z, store, η, g)``;
    ``store`` is the schedule's running sum (adaptive: of ``‖g‖∞²``; auto: of the steps).

    >>> z = np.log(np.full(2, 0.5))
    >>> z2, _, eta, g = exponentiated_gradient_step(z, [0, 1], [0.2, 0.6], [1, 1], 0.0, "constant", 1.0, 0.0)
    >>> g.tolist(), np.round(np.exp(z2), 4).tolist()
    ([0.2, 0.6], [0.5987, 0.4013])
    """
    theta = np.exp(z)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    grad = np.zeros(len(z), dtype=np.float64)
    for idx, s, wi in zip(indices, scores, w):
        grad[int(idx)] += wi * (float(s) - baseline) / theta[int(idx)]
    if schedule == "adaptive":
        store += float(np.max(np.abs(grad))) ** 2
        denom = math.sqrt(store)
    elif schedule == "aggressive":
        denom = 1.0 if np.all(grad == 0.0) else float(np.max(np.abs(grad)))
    elif schedule == "auto":
        store += 1.0
        denom = math.sqrt(store)
    elif schedule == "constant":
        denom = 1.0
    elif schedule == "scale":
        denom = 1.0 / math.sqrt(2.0 * math.log(len(grad))) if len(grad) > 1 else math.inf
    else:
        raise ValueError(f"fedex_schedule {schedule!r}; allowed: {', '.join(FEDEX_SCHEDULES)}")
    eta = eta0 / denom if denom > 0 else 0.0
    z = z - eta * grad
    z = z - float(np.logaddexp.reduce(z))
    return z, store, eta, grad


class FedExServer(InRunTuner):
    """The coordinator's FedEx: the configurations, the distribution over them, each round's draw
    (:meth:`payload`), the clients' scores as they arrive (:meth:`take`) and the round's step
    (:meth:`end_round`); its state is part of the run's checkpoint."""

    name = "fedex"

    @classmethod
    def from_config(cls, cfg: RunConfig) -> FedExServer:
        return cls(cfg, knob_ranges(FEDEX_KNOBS.of(cfg), client_knob_hparams(cfg)))

    def __init__(self, cfg: RunConfig, ranges: Sequence[KnobRange]):
        self.knobs = tuple(r.name for r in ranges)
        self.k = int(FEDEX_CONFIGS.of(cfg))
        self.seed = int(cfg.seed)
        self.schedule, self.baseline_factor = FEDEX_SCHEDULE.of(cfg), float(FEDEX_BASELINE.of(cfg))
        self.diff, self.cutoff = bool(FEDEX_DIFF.of(cfg)), float(FEDEX_CUTOFF.of(cfg))
        self.eta0 = math.sqrt(2.0 * math.log(self.k))
        hparams = client_knob_hparams(cfg)
        base = [float(hparams[n].of(cfg)) if n in hparams else float(getattr(cfg, n)) for n in self.knobs]
        self.configs = configurations(base, ranges, self.k, float(FEDEX_EPS.of(cfg)), self.seed)
        self.z = np.full(self.k, -math.log(self.k))
        self.store = 0.0
        self.refine: list[float] = []  # weighted score after local training, per round (the authors' trace)
        self.global_: list[float] = []  # weighted score before it (fedex_diff only)
        self.stopped = False
        self._seen: list[tuple[int, float, float, float]] = []  # this round: (config, after, before, weight)

    @property
    def theta(self) -> np.ndarray:
        return np.exp(self.z)

    def payload(self, round: int, participants: Sequence[int], num_clients: int) -> dict[str, np.ndarray]:  # noqa: A002
        """The round's broadcast: the configurations ``[k, knobs]`` and each client's drawn
        configuration (−1: not a participant); every participant draws the most likely one once
        the distribution has stopped (``fedex_cutoff``)."""
        assignment = np.full(num_clients, -1, dtype=np.int64)
        ids = sorted(participants)
        if self.stopped:
            assignment[ids] = int(np.argmax(self.z))
        else:
            rng = np.random.default_rng([self.seed, _ROUND_STREAM, int(round)])
            assignment[ids] = rng.choice(self.k, size=len(ids), p=self.theta / self.theta.sum())
        self._seen = []
        return {"fedex.configs": self.configs, "fedex.assignment": assignment}

    def take(self, extras: dict[str, np.ndarray]) -> None:
        """Take (and remove) a client's FedEx extras from its reply's ``extras``; a client that
        trained outside FedEx (the fda target client, an empty validation split) sends none."""
        keys = [key for key in extras if key.startswith("fedex.")]
        got = {key: extras.pop(key) for key in keys}
        if "fedex.index" in got:
            self._seen.append((int(got["fedex.index"][0]), float(got["fedex.after"][0]),
                               float(got["fedex.before"][0]), float(got["fedex.weight"][0])))

    def end_round(self) -> dict[str, Any]:
        """The round's exponentiated-gradient step on the scores taken; its ``diag.*`` values
        (entropy, the most likely configuration's probability and index, the weighted scores, the
        step size) and ``fedex_json`` (knobs, configurations, distribution). A round without a
        finite score (no participant with a validation split) takes no step."""
        seen, self._seen = self._seen, []
        diag: dict[str, Any] = {"fedex_step": math.nan, "fedex_refine": math.nan}
        usable = [s for s in seen if s[3] > 0 and math.isfinite(s[1]) and (not self.diff or math.isfinite(s[2]))]
        if usable and not self.stopped:
            idx, after, before, weight = (np.array(v, dtype=np.float64) for v in zip(*usable))
            w = weight / weight.sum()
            if self.refine:
                trace = np.array(self.refine) - (np.array(self.global_) if self.diff else 0.0)
                baseline = discounted_mean(trace, self.baseline_factor)
            else:
                baseline = 0.0
            refine, glob = float(np.inner(after, w)), float(np.inner(before, w))
            self.refine.append(refine)
            self.global_.append(glob if self.diff else math.nan)
            scores = after - before if self.diff else after
            self.z, self.store, eta, _ = exponentiated_gradient_step(
                self.z, idx.astype(np.int64), scores, weight, baseline, self.schedule, self.eta0, self.store)
            diag.update(fedex_step=eta, fedex_refine=refine, fedex_baseline=baseline)
            if entropy(self.theta) < self.cutoff:
                self.stopped = True
        theta = self.theta
        diag.update(fedex_entropy=entropy(theta), fedex_mle_prob=float(theta.max()),
                    fedex_mle_config=int(np.argmax(theta)))
        return diag

    def columns(self) -> dict[str, str]:
        """The round row's ``fedex_json`` (the trial row keeps the last round's): the knobs, the
        configurations, the distribution, the most likely configuration, whether it stopped."""
        mle = int(np.argmax(self.z))
        return {"fedex_json": json.dumps({"knobs": list(self.knobs), "configs": self.configs.tolist(),
                           "theta": self.theta.tolist(), "mle": dict(zip(self.knobs, self.configs[mle].tolist())),
                           "stopped": self.stopped}, sort_keys=True)}

    def state_dict(self) -> dict[str, Any]:
        return {"z": self.z.copy(), "store": self.store, "refine": list(self.refine),
                "global": [None if math.isnan(v) else v for v in self.global_], "stopped": self.stopped,
                "configs": self.configs.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        configs = np.asarray(state["configs"], dtype=np.float64)
        if configs.shape != self.configs.shape or not np.array_equal(configs, self.configs):
            raise ValueError("checkpoint's FedEx configurations differ from this run's (another seed, knobs, "
                             "fedex_configs or fedex_eps): it belongs to another configuration")
        self.z = np.asarray(state["z"], dtype=np.float64).copy()
        self.store = float(state["store"])
        self.refine = [float(v) for v in state["refine"]]
        self.global_ = [math.nan if v is None else float(v) for v in state["global"]]
        self.stopped = bool(state["stopped"])


def fedex_server(cfg: RunConfig) -> FedExServer | None:
    """The run's :class:`FedExServer` (None when ``fedex_configs`` is 0)."""
    if not FEDEX_CONFIGS.of(cfg):
        return None
    return FedExServer.from_config(cfg)


def __getattr__(name: str) -> NoReturn:
    """FedEx's declarations (``FEDEX_MAX_CONFIGS``, ``AUTHORS_RANGES``, ``client_knob_hparams``, ...)
    moved to :mod:`fedtune.algorithms.tuner_declarations`: one line naming the new home."""
    raise old_name_error(__name__, name)
