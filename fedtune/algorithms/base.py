"""The vocabulary of declarations: a hyperparameter (:class:`HParam`) and what each kind of
component declares about itself (:class:`ClientMethodSpec`, :class:`ServerRuleSpec`,
:class:`ServerOptimizerSpec`, :class:`InRunTunerSpec`). Torch-free and NumPy-free: the declarations themselves
(:mod:`fedtune.algorithms.declarations`) are read by the config, the search spaces and the CLI
without importing any component's code."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fedtune.bounds import Bounds
from fedtune.errors import ConfigError, shown

T = TypeVar("T")


class RunConfig(Protocol):
    """What components read from a run's configuration: the part of
    :class:`~fedtune.config.FederatedRunConfig` the algorithms see (algorithms never import the
    config module; the config satisfies this protocol, and tests may pass any object that does).
    Hyperparameters are read through their declaration, ``OMG_KAPPA.of(cfg)`` (``cfg.params``)."""

    algorithm: str
    dataset: str
    seed: int
    rounds: int
    local_epochs: int
    local_steps: int | None
    batch_size: int
    local_lr: float
    target_lr_scale: float
    local_optimizer: str
    local_momentum: float
    weight_decay: float
    global_lr: float | None
    val_fraction: float
    coordinator_cpus: float
    params: dict[str, Any]

    @property
    def resolved(self) -> Any: ...  # fedtune.algorithms.Resolved

    @property
    def effective_global_lr(self) -> float: ...

    @property
    def target_lr(self) -> float: ...


HPARAM_TRIAL_ID_ROLES = ("always", "when_set", "as_run")
"""A hyperparameter's part in the trial id (:attr:`HParam.trial_id`)."""


@dataclass(frozen=True)
class HParam(Generic[T]):
    """A hyperparameter a component declares: default, allowed values, meaning.

    ``kind`` is ``float``, ``int``, ``bool`` or ``choice`` (``choices`` lists the values;
    ``float_or_choice`` accepts a number in range or one of ``choices``, e.g. β = 0.5 or "auto"),
    or ``names`` (a list of names, its default a tuple: FedEx's ``fedex_knobs``). ``note`` is said
    after the allowed range in an error (``"0: off"``).
    ``lo_open=True`` makes ``lo`` exclusive (``sam_rho > 0``), ``hi_open=True`` makes ``hi``
    exclusive (``server_beta1 < 1``). ``variant=True`` marks a choice
    between a paper and its authors' code that changes results (FedGaLA's gate sign, FedOMG's
    solver, ...): every report says which value ran.

    A component reads its values once, typed, when it is built: ``self.kappa = OMG_KAPPA.of(cfg)``
    (the value the config holds, already checked by :meth:`check` when it was validated, else
    the default).

    >>> RHO = HParam("r", 1.0, "radius", lo=0.0, lo_open=True)
    >>> RHO.check("0.5", "test")
    0.5
    >>> RHO.check(0, "test")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: field 'r' (test): 0.0 is out of range; allowed: > 0
    """

    name: str
    default: T
    help: str
    kind: str = "float"
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] = ()
    variant: bool = False
    lo_open: bool = False
    hi_open: bool = False
    # How a search space samples it when no override says otherwise: one entry of a search-space
    # file's ``params`` (``{"distribution": "loguniform", "low": ..., "high": ..., "default": ...}``,
    # :mod:`fedtune.spaces.lookup`); None: fixed at the default. Not part of the value's identity.
    search: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    # A choice that names a whole reading (FedADG's fedadg_variant): value -> ((name, value), ...), the
    # other hyperparameters that value sets where the run leaves them unset (the config puts them in
    # its ``params``, :meth:`fedtune.algorithms.Resolved.implied_defaults`), so reports and trial ids show them.
    implies: tuple[tuple[Any, tuple[tuple[str, Any], ...]], ...] = field(default=(), compare=False, hash=False)
    # Values that were allowed once: value -> why it went and what to write instead (one line).
    retired: tuple[tuple[Any, str], ...] = field(default=(), compare=False, hash=False)
    note: str = field(default="", compare=False, hash=False)
    # Its part in a run's trial id (fedtune.trial_ids): always; when_set (left out at its default,
    # the value every run before it was declared computed with: a hyperparameter added to a component
    # that earlier studies ran); as_run (hashed at the value that runs, set or not: its default changed
    # after studies were written, so a run leaving it unset is not taken for one of the old default's).
    trial_id: str = "always"

    def __post_init__(self) -> None:
        if self.trial_id not in HPARAM_TRIAL_ID_ROLES:
            raise TypeError(f"HParam {self.name!r}: trial_id={self.trial_id!r} is not a trial-id role; allowed: "
                            f"{', '.join(HPARAM_TRIAL_ID_ROLES)}")

    @property
    def bounds(self) -> Bounds:
        return Bounds(lo=self.lo, hi=self.hi, lo_open=self.lo_open, choices=self.choices, hi_open=self.hi_open,
                      note=self.note)

    def check(self, value: Any, owner: str) -> T:
        """``value`` converted to this hyperparameter's kind, or a ConfigError naming the field and
        ``owner`` (the component(s) declaring it) with the allowed values."""
        where = f"field '{self.name}' ({owner})"
        if self.kind in ("choice", "float_or_choice") and value in self.choices:
            return value
        why = dict(self.retired).get(value) if isinstance(value, str) else None
        if why is not None:
            raise ConfigError(f"{where}: {shown(value)} was removed: {why}")
        if self.kind == "choice":
            if value is None:  # Bounds passes None as "unset"; a hyperparameter set to null is no choice
                raise ConfigError(f"{where}: None is not allowed; allowed: {', '.join(map(str, self.choices))}")
            return self.bounds.check(where, value)  # not a choice: the error
        if self.kind == "bool":
            if isinstance(value, bool):
                return value  # type: ignore[return-value]
            raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
        if self.kind == "names":
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return list(value)  # type: ignore[return-value]
            raise ConfigError(f"{where}: expected a list of names such as [local_lr], got {shown(value)}")
        try:
            if isinstance(value, bool):
                raise TypeError
            num = int(value) if self.kind == "int" else float(value)
        except (TypeError, ValueError, OverflowError):
            allowed = (f"a number or one of {', '.join(map(str, self.choices))}" if self.choices else
                       f"a{'n integer' if self.kind == 'int' else ' number'}")
            raise ConfigError(f"{where}: expected {allowed}, got {shown(value)}") from None
        if self.kind == "int" and float(value) != num:
            raise ConfigError(f"{where}: expected an integer, got {shown(value)}")
        return self.bounds.check(where, num, extra_choices=True)

    def of(self, cfg: RunConfig) -> T:
        """This hyperparameter's value in ``cfg`` (a validated
        :class:`~fedtune.config.FederatedRunConfig`): the one set, else the default; an in-run
        tuner's (a run field, ``fedex_eps``) the field's value."""
        if self.name in getattr(type(cfg), "__dataclass_fields__", {}):
            return getattr(cfg, self.name)
        return cfg.params.get(self.name, self.default)


# A cross-field condition on a validated config: raises ConfigError where the run cannot go.
ConfigCheck = Callable[[Any], None]


def variant(name: str, help: str, choices: tuple[str, ...], **more: Any) -> HParam[str]:
    """A method variant (``HParam(..., variant=True)``): a choice between a paper's and its authors'
    code (or two readings of them) that changes results, its first choice the default; never
    searched (a study fixes it: run a second study for the other value).

    >>> variant("omg_solver", "FedOMG's solver", ("exact", "sgd")).default
    'exact'
    """
    return HParam(name, choices[0], help, kind="choice", choices=choices, variant=True, **more)


def read_hparams(component: Any, cfg: RunConfig) -> None:
    """Set each attribute that ``component``'s class and its bases name in their ``reads``
    (attribute -> :class:`HParam`) to the hyperparameter's value in ``cfg``: how a client method or
    a server rule reads its hyperparameters once, when it is built (``reads = {"rho": SAM_RHO}``)."""
    for klass in reversed(type(component).__mro__):
        for attribute, hparam in vars(klass).get("reads", {}).items():
            setattr(component, attribute, hparam.of(cfg))


# An HParam's ``search``: how a derived search space samples it (fedtune.spaces.lookup's format).
def search_loguniform(low: float, high: float, default: float) -> dict[str, Any]:
    return {"distribution": "loguniform", "low": low, "high": high, "default": default}


def search_uniform(low: float, high: float, default: float) -> dict[str, Any]:
    return {"distribution": "uniform", "low": low, "high": high, "default": default}


def search_int(low: int, high: int, default: int) -> dict[str, Any]:
    return {"distribution": "int", "low": low, "high": high, "default": default}


def search_categorical(choices: list[Any], default: Any) -> dict[str, Any]:
    return {"distribution": "categorical", "choices": choices, "default": default}


@dataclass(frozen=True)
class ComponentSpec:
    """What every component declares: its registry ``name``, where its class lives
    (``"module:Class"``, imported only when the class is needed; a class registered with
    ``fedtune.register`` may leave it empty: it is filled in from the class), a one-line
    ``description``, its ``hparams`` and an optional cross-field ``check`` run once when a config
    is validated."""

    name: str
    where: str = ""
    description: str = ""
    hparams: tuple[HParam, ...] = ()
    check: ConfigCheck | None = None


@dataclass(frozen=True)
class ClientMethodSpec(ComponentSpec):
    """A client method (:class:`~fedtune.algorithms.client.method.ClientMethod`, PyTorch code).

    ``supervised=False``: it trains without labels (setting ufdg; evaluation by linear probe).
    ``scales_fp16_gradients=False``: some backward pass bypasses the fp16 gradient scaler, so
    ``precision: fp16`` is refused. ``model_head(cfg)``: the ``build_model`` keywords of its
    model's head (SimCLR's projector, FedSR's probabilistic head); None: the classifier (or, for an
    unsupervised method, the projector at its default width). ``server_side``: where the NumPy class
    that keeps its state on the server lives (:class:`~fedtune.algorithms.server.side.ServerSide`).
    ``needs_source_bank``: its clients read the run's *source bank*, every source client's training
    examples un-augmented (``ClientContext.source_bank``; FedDG's shared amplitude spectra).
    ``needs_images``: it runs only on image datasets (refused in one line before any actor starts).
    ``reads_features``: it reads the model's encoder features, the input of its last ``nn.Linear``
    (MOON, CORAL, FedIIR, ...), so a model without one is refused in one line before launch.
    ``keeps_client_state``: a client keeps something on its actor between rounds (``ctx.state``:
    SCAFFOLD's control variate, FedDyn's gradient, MOON's previous model, ...), so it is always
    trained by the actor that owns it (:mod:`fedtune.runtime.placement`); a callable decides from
    the run's config. A method that declares False and writes ``ctx.state`` on a roaming actor
    stops the run with a RuntimeError naming it."""

    supervised: bool = True
    scales_fp16_gradients: bool = True
    model_head: Callable[[Any], dict[str, Any]] | None = None
    server_side: str | None = None
    needs_source_bank: bool = False
    needs_images: bool = False
    reads_features: bool = False
    keeps_client_state: bool | Callable[[Any], bool] = False

    def head(self, cfg: RunConfig) -> dict[str, Any]:
        """The ``build_model`` keywords of this method's model under ``cfg``."""
        if self.model_head is not None:
            return dict(self.model_head(cfg))
        return {} if self.supervised else {"head": "projector"}


@dataclass(frozen=True)
class ServerRuleSpec(ComponentSpec):
    """A server rule (:class:`~fedtune.algorithms.server.rule.ServerRule`, NumPy code).

    ``needs_target_client``: runs only in the fda setting. ``needs_supervised_client``: never in
    ufdg. ``default_global_lr``: the run's ``global_lr`` when unset. ``client_hooks(cfg)``: where
    the client-side hooks live that every participant runs around its training for this rule
    (``"module:Class"`` of a
    :class:`~fedtune.algorithms.client.hooks.ClientHook`: FedGA's generalization gaps, auto-β's step
    records); the worker knows none of them by name."""

    needs_target_client: bool = False
    # True: the rule reads class logits of the clients' models (FedGA's validation cross-entropy),
    # so no unsupervised client method (setting ufdg) runs under it.
    needs_supervised_client: bool = False
    default_global_lr: float = 1.0
    client_hooks: Callable[[Any], tuple[str, ...]] | None = None
    # Sampled choices that only steer its hyperparameters' ``when`` conditions in a search space (a
    # search-space file's ``switches`` entries, :mod:`fedtune.spaces.derive`): FedDA/FedGP's gp_beta_mode.
    search_switches: Mapping[str, Mapping[str, Any]] | None = field(default=None, compare=False, hash=False)

    def hooks(self, cfg: RunConfig) -> tuple[str, ...]:
        """The client hooks a run with ``cfg`` needs (none by default)."""
        return tuple(self.client_hooks(cfg)) if self.client_hooks is not None else ()


@dataclass(frozen=True)
class ServerOptimizerSpec(ComponentSpec):
    """A server optimiser (:class:`~fedtune.algorithms.server.optimizer.ServerOptimizer`, NumPy code).

    ``default_lr``: the run's ``global_lr`` when unset under this optimiser (an adaptive step's
    scale is its own, not the server rule's); None: the server rule's ``default_global_lr``."""

    default_lr: float | None = None


@dataclass(frozen=True)
class InRunTunerSpec(ComponentSpec):
    """An in-run tuner (:class:`~fedtune.algorithms.server.tuner.InRunTuner`, NumPy code on the
    coordinator; FedEx): it tunes client knobs inside one run, drawing each participant's values
    every round and learning from the scores the participants send back.

    Its :attr:`hparams` are run fields (``fedex_configs: 4`` in a YAML file or ``--set``; the config
    reads them as ``cfg.fedex_configs``, :func:`fedtune.config.tuner_fields`), the first of them,
    ``switch``, turning it on when not 0; the others are refused while it is off, in one line
    saying ``off`` and how to turn it on (``on``). ``knobs``: the field listing the run's knobs it
    tunes (a population scheduler must not explore them). ``client_hooks``: where its client half
    lives (``"module:Class"`` of a :class:`~fedtune.algorithms.client.hooks.ClientHook`). ``columns``:
    the round-row columns it adds (:meth:`InRunTuner.columns`) that a trial row repeats from the
    last round. ``title``: its name in messages."""

    title: str = ""
    off: str = ""
    on: str = ""
    knobs: str = ""
    client_hooks: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    @property
    def switch(self) -> str:
        """The run field that turns it on (its first hyperparameter)."""
        return self.hparams[0].name

    def is_on(self, cfg: RunConfig) -> bool:
        """Whether a run with ``cfg`` tunes with it."""
        return bool(getattr(cfg, self.switch, 0))

    def tuned_knobs(self, cfg: RunConfig) -> tuple[str, ...]:
        """The run's knobs it tunes under ``cfg``."""
        return tuple(getattr(cfg, self.knobs)) if self.knobs else ()


@dataclass(frozen=True)
class ServerSideSpec:
    """Where a client method's server side lives (:class:`~fedtune.algorithms.server.side.ServerSide`,
    NumPy code), under the client method's ``name``: derived from
    :attr:`ClientMethodSpec.server_side`, never declared on its own."""

    name: str
    where: str


@dataclass(frozen=True)
class Preset:
    """A named algorithm: a client method, a server rule, the settings it is meant for."""

    name: str
    client_method: str
    server_rule: str
    settings: tuple[str, ...]
    description: str
    # Client method used instead in the unsupervised ``ufdg`` setting (FedGaLA: SimCLR + gating).
    unsupervised_client_method: str | None = None
    # Shared fields this algorithm's paper tunes as its own (FedOMG: its server step scales d, η_g).
    own_shared: tuple[str, ...] = ()
    # This algorithm's defaults for hyperparameters of its client method or server rule, where its
    # authors' code differs from the component's default (FedSR, FedIIR: the uniform mean of the
    # models, ``client_weighting: uniform``). A run of the preset whose pair declares the name and
    # leaves it unset gets this value in its ``params`` (:meth:`Resolved.preset_defaults`).
    defaults: tuple[tuple[str, Any], ...] = ()
