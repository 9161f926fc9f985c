"""Run configuration: every field, its default, its allowed values and its roles (part of the trial id,
of the data plan, a sweep option, its group: :mod:`fedtune.config_roles`), in one place: every list of
fields elsewhere is derived from them (:data:`ROLES`).

A :class:`FederatedRunConfig` is what one federated run (one trial) needs. It is built from
defaults, then an optional YAML file, then command-line flags and ``--set key=value`` overrides,
and validated before anything starts, the hyperparameters of its client method and server rule
included (each once, here). Every error names the field and what is allowed.

>>> cfg = FederatedRunConfig.from_dict({"rounds": 3, "local_lr": 0.1})
>>> cfg.rounds, cfg.local_lr
(3, 0.1)
>>> cfg.resolved.client_method.name, cfg.resolved.server_rule.name, cfg.effective_global_lr
('sgd', 'fedavg', 1.0)
>>> FederatedRunConfig.from_dict({"client_gpus": -1})
Traceback (most recent call last):
...
fedtune.errors.ConfigError: field 'client_gpus': -1.0 is out of range; allowed: >= 0
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

import yaml

from fedtune import yaml_safe
from fedtune.algorithms import LOCAL_OPTIMIZERS, PRECISIONS, SERVER_OPTIMIZERS, all_hparams, in_run_tuner_spec, resolve
from fedtune.algorithms.base import HParam, InRunTunerSpec
from fedtune.algorithms.tuner_declarations import IN_RUN_TUNER_SPECS
from fedtune.config_roles import roles_of, run_field as _f
from fedtune.config_values import check_mlp_hidden, coerce, unknown_key_message
from fedtune.data.heterogeneity import ROUNDINGS
from fedtune.data.partition import fidelity_participation
from fedtune.data.registry import DOMAINBED, dataset_owner, is_domainbed, is_image_folder, plugin_dataset
from fedtune.data.split_file import check_scheme
from fedtune.errors import ConfigError, clipped, shown
from fedtune.plugins import MAIN_MODULE, check_run_field_names, load_plugins, parse_model_factory, plugins_of_run
from fedtune.results.study_dir import NAME_RULE, check_path_text, name_problem
from fedtune.trial_ids import trial_id_of

if TYPE_CHECKING:
    from fedtune.algorithms import Resolved


SETTINGS = ("fdg", "fl", "fda", "ufdg")
BACKENDS = ("ray", "local")
AUGMENTS = ("none", "domainbed")  # fedtune.runtime.augment.make_augment
FAILURE_POLICIES = ("retry", "skip", "fail")
PLACEMENTS = ("auto", "fixed", "roaming")  # client_placement (fedtune.runtime.placement)
CACHE_KEYS = ("stat", "content")  # fedtune.data.cache.KEY_MODES
_HINTS = {"int": "int", "float": "float", "bool": "bool", "choice": "str", "names": "list[str]"}


def tuner_fields(after: str):
    """Class decorator (under ``@dataclass``): a run field for each hyperparameter of each in-run tuner
    (:data:`~fedtune.algorithms.tuner_declarations.IN_RUN_TUNER_SPECS`: FedEx's ``fedex_configs``, ...),
    after the field ``after``, with the HParam's default, help and bounds; all but the switch are
    refused while it is 0 (``needs``). Run fields, not ``params``: the spelling of every earlier
    YAML file, ``--set`` and stored config, and so of every trial id."""
    def made(spec: InRunTunerSpec, h: HParam):
        if h.kind not in _HINTS or h.hi_open:
            raise TypeError(f"in-run tuner {spec.name}: {h.name} ({h.kind}) has no run-field form")
        # when_set: earlier studies ran without any tuner, at these defaults (their trial ids are kept)
        return _f(h.default, h.help, trial_id="when_set", group="fedex", choices=h.choices or None, lo=h.lo, hi=h.hi,
                  lo_open=h.lo_open, note=h.note,
                  factory=(lambda: list(h.default)) if h.kind == "names" else None,
                  needs=None if h.name == spec.switch else (spec.switch, spec.off, spec.on))

    def add(cls: type) -> type:
        hints: dict[str, str] = {}
        for name, hint in cls.__dict__["__annotations__"].items():
            hints[name] = hint
            if name == after:
                for spec in IN_RUN_TUNER_SPECS:
                    for h in spec.hparams:
                        hints[h.name] = _HINTS[h.kind]
                        setattr(cls, h.name, made(spec, h))
        cls.__annotations__ = hints
        return cls
    return add


@dataclass
@tuner_fields(after="fidelity_factor")
class FederatedRunConfig:
    """Everything one federated run needs. Field names are what ``--set`` and YAML use."""

    # --- what to run -------------------------------------------------------------------
    plugins: list[str] = _f(None, "plugins to import before anything else, in every process of the run (fedtune.plugins): a module (pkg.mod), MODULE:NAME (register that component), or a .py file; the modules of components from outside fedtune that the run uses are added when it is validated; never part of the trial id", trial_id="never", group="run", factory=list)
    algorithm: str = _f("fedavg", "named algorithm: a preset (client method, server rule); see `fedtune algorithms`", trial_id="always", group="run", plan=True, sweep_option="algorithms", resume_fixed=True, run_flag=True)
    client_method: str | None = _f(None, "override the preset's client method (how a client trains)", trial_id="always", group="run", plan=True)
    server_rule: str | None = _f(None, "override the preset's server rule (how updates combine)", trial_id="always", group="run", plan=True)
    dataset: str = _f("rotated-digits", "dataset name; see `fedtune datasets`", trial_id="always", group="data", plan=True, sweep_option="dataset", resume_fixed=True, run_flag=True)
    data_root: str | None = _f(None, "directory holding the dataset's files (not needed by embedded datasets)", trial_id="always", group="data", plan=True, sweep_option="data_root", resume_fixed=True, run_flag="DIR")
    data_seed: int = _f(0, "seed of the dataset's own construction (rotated-digits subsets, rect4 points)", trial_id="always", group="data", plan=True, lo=0)
    image_size: int | None = _f(None, "resize folder datasets to this many pixels per side (default 64)", trial_id="always", group="data", plan=True, lo=8)
    setting: str | None = _f(None, "fdg (leave-one-domain-out), fl (Dirichlet label skew), fda (adds a target client), ufdg (unsupervised); default: the dataset's", trial_id="always", group="data", plan=True, choices=SETTINGS)
    target_domain: str | None = _f(None, "held-out target domain (fdg/fda/ufdg); default: the dataset's first domain", trial_id="always", group="data", plan=True, sweep_option="target_domain", resume_fixed=True, run_flag="NAME")
    clients_per_domain: int = _f(1, "clients per source domain (fdg/fda/ufdg)", trial_id="always", group="data", plan=True, lo=1)
    num_clients: int = _f(10, "number of clients in the fl setting, and of source clients in fdg/fda/ufdg when domain_homogeneity is set (the fda target client comes on top)", trial_id="always", group="data", plan=True, lo=1)
    domain_homogeneity: float | None = _f(None, "fdg/fda/ufdg: spread the source domains over num_clients clients with Bai et al.'s (ICLR 2024) lambda, their code's iid: 1 = homogeneous (every client holds the source-domain proportions), 0.1 = heterogeneous, 0 = each client one domain; null: clients_per_domain clients per source domain (`fedtune partition` shows the split)", trial_id="when_set", group="data", plan=True, lo=0.0, hi=1.0)
    domain_homogeneity_rounding: str = _f("authors", "domain_homogeneity's counts: authors (NonIIDSplitter's: truncate, each domain's leftover examples to the first clients) or largest-remainder (exact; lambda 0 is then exactly one domain per client)", trial_id="when_set", group="data", plan=True, choices=ROUNDINGS)
    split_scheme: str | None = _f(None, "fdg: the protocol of WILDS and of Bai et al.'s FedDG benchmark instead of leave-one-domain-out: the dataset's split file beside its domain folders (official: metadata.csv; NAME: NAME.csv, e.g. the benchmark's pacs_v1.0 files) names each image's split: train (the clients'), val (OOD validation: ood_val_acc, selection ood-val), test (OOD test: target_acc), id_val (ID validation: val_acc), id_test (id_test_acc); target_domain, val_fraction and oracle_fraction are then unused; null: leave-one-domain-out", trial_id="when_set", group="data", plan=True)
    dirichlet_alpha: float = _f(0.5, "Dirichlet concentration of the fl label skew (smaller = more skew)", trial_id="always", group="data", plan=True, lo=0.0, lo_open=True)
    participation: float = _f(1.0, "fraction of clients sampled each round", trial_id="always", group="data", plan=True, lo=0.0, hi=1.0, lo_open=True)
    fidelity_participation: float | None = _f(None, "multi-fidelity over clients (FedHPO-Bench's client sample rate; fedtune sweep --client-fidelity): the participation of the first fidelity_grace_rounds rounds, multiplied by fidelity_factor after each rung milestone the trial passes (rounds fidelity_grace_rounds * fidelity_factor**k, ASHA's rungs), at most participation; null: participation every round", trial_id="when_set", group="data", lo=0.0, hi=1.0, lo_open=True)
    fidelity_grace_rounds: int = _f(1, "rounds of the first fidelity rung (fidelity_participation; ASHA's grace period)", trial_id="when_set", group="data", lo=1)
    fidelity_factor: float = _f(2.0, "growth of the participation from one fidelity rung to the next (fidelity_participation; ASHA's reduction factor)", trial_id="when_set", group="data", lo=1.0, lo_open=True)
    target_fraction: float = _f(0.05, "fda: fraction of the target domain given to the target client as labelled data", trial_id="always", group="data", plan=True, lo=0.0, hi=1.0, lo_open=True)
    val_fraction: float = _f(0.2, "per-client validation hold-out (source validation = model selection)", trial_id="always", group="data", plan=True, lo=0.0, hi=0.9)
    test_fraction: float = _f(0.2, "fl: per-client test hold-out", trial_id="always", group="data", plan=True, lo=0.0, hi=0.9, lo_open=True)
    probe_fraction: float = _f(0.1, "ufdg: fraction of the target domain's labels for the linear probe", trial_id="always", group="data", plan=True, lo=0.0, hi=1.0, lo_open=True)
    oracle_fraction: float = _f(0.2, "fdg/fda/ufdg: fraction of the target domain held out (stratified, fixed by data_seed) as the oracle slice: scored as oracle_acc, never part of target_acc; 0: no slice (no oracle selection)", trial_id="always", group="data", lo=0.0, hi=0.9)
    model: str | None = _f(None, "cnn, mlp, a torchvision classification model by name (resnet18, resnet50, convnext_tiny, efficientnet_b0, ...), or your own: MODULE:FUNCTION or path/to/file.py:FUNCTION, a factory build(input_shape, num_classes) -> torch.nn.Module whose module every process imports (docs/extending.md); default: the dataset's", trial_id="always", group="model", plan=True)
    mlp_hidden: list[int] = _f(None, "hidden layer widths of the mlp model ([] = linear model)", trial_id="always", group="model", factory=lambda: [256, 256])
    weights: str = _f("none", "torchvision models: pretrained weights, none, DEFAULT or an enum name such as IMAGENET1K_V1 (read from $TORCH_HOME/hub/checkpoints); the classifier is replaced for the dataset's classes", trial_id="when_set", group="model")
    freeze_batchnorm: bool = _f(False, "keep the model's batch-norm layers in eval mode while clients train: normalisation by the running statistics they start with (pretrained or initial), never updated; their scale and shift still train (DomainBed's and Bai et al.'s ResNets); no effect on a model without batch norm", trial_id="when_set", group="model")
    pretrained_path: str | None = _f(None, "local checkpoint to start from (torch.load weights_only=True; a plain, 'module.'-prefixed or {'state_dict'|'model': ...} state dict whose backbone keys all match; only the classifier may differ)", trial_id="always", group="model", plan=True)
    augment: str = _f("auto", "training augmentation applied per batch on the client's device: none, domainbed (DomainBed's crop, flip, colour jitter, greyscale), auto (domainbed for DomainBed's own datasets pacs, vlcs, office-home, terra-incognita, domain-net; none for the others, a generic folder included: a flip or crop may change what a folder's label means)", trial_id="when_set", legacy="none", group="training", choices=("auto", *AUGMENTS))
    cache_dir: str | None = _f(None, "image-folder datasets: folder of the decoded-image cache (default: $FEDTUNE_CACHE_DIR, else ~/.cache/fedtune/images)", trial_id="never", group="data")
    cache_key: str = _f("stat", "image-folder datasets: what the cache key holds of each image file: stat (path, size, modification time: cheap; misses an image rewritten in place with both kept) or content (its bytes hashed: every file read once per process)", trial_id="never", group="data", choices=CACHE_KEYS)
    cache_wait_s: float = _f(600.0, "image-folder datasets: seconds to wait for another process's build of the same image cache while it makes no progress (a suspended or hung builder), then stop with an error naming it", trial_id="never", group="data", lo=0.0, lo_open=True)

    # --- training ------------------------------------------------------------------------
    rounds: int = _f(10, "federated rounds", trial_id="always", group="training", sweep_option="rounds", resume_fixed=True, run_flag="N", lo=1)
    local_epochs: int = _f(1, "local epochs per round (ignored when local_steps is set)", trial_id="always", group="training", lo=1, hp=True)
    local_steps: int | None = _f(None, "local SGD steps per round; overrides local_epochs", trial_id="always", group="training", lo=1, hp=True)
    batch_size: int = _f(32, "local mini-batch size", trial_id="always", group="training", lo=1, hp=True)
    local_lr: float = _f(0.05, "client learning rate", trial_id="always", group="training", lo=0.0, lo_open=True, hp=True)
    target_lr_scale: float = _f(1.0, "fda: the target client's learning rate as a multiple of local_lr (seed 002 trains its target at 1/5 of the sources' rate: 0.2); no effect without a target client", trial_id="when_set", group="training", lo=0.0, lo_open=True)
    local_optimizer: str = _f("sgd", "client optimiser: sgd (local_momentum, weight_decay) or adam (torch Adam, betas 0.9/0.999, L2 weight_decay: DomainBed's, with local_lr 5e-5); its state is reset every round", trial_id="when_set", group="training", choices=LOCAL_OPTIMIZERS, hp=True)
    local_momentum: float = _f(0.9, "client SGD momentum (optimizer state is reset every round; unused by adam)", trial_id="always", group="training", lo=0.0, hi=1.0, hp=True)
    weight_decay: float = _f(0.0, "client weight decay", trial_id="always", group="training", lo=0.0, hp=True)
    global_lr: float | None = _f(None, "server learning rate: theta <- theta + global_lr * aggregate(updates); unset: the server optimiser's default (adam, yogi, adagrad 1e-3: Adam's step size), else the server rule's (fedavg 1.0, fedomg 0.05)", trial_id="always", group="training", lo=0.0, lo_open=True, hp=True)
    server_optimizer: str = _f("sgd", "server optimiser on the server rule's step d (any rule): sgd (theta + global_lr d, the rule as it is), avgm (FedAvgM: server_momentum), adam (FedAdam: server_beta1, server_beta2, server_tau, server_v_start, server_adam_bias_correction), yogi (FedYogi), adagrad (FedAdagrad: server_tau, server_v_start); global_lr is its learning rate; its state is checkpointed", trial_id="when_set", group="training", choices=tuple(SERVER_OPTIMIZERS), hp=True)
    eval_batch_size: int = _f(256, "batch size of evaluation", trial_id="never", group="evaluation", lo=1)
    eval_batch_mib: float = _f(160.0, "at most this many MiB of float32 inputs in an evaluation batch: fewer images than eval_batch_size where they are large (256 at 224 px are 147 MiB; at 448 px a batch is 69 images)", trial_id="never", group="evaluation", lo=0.0, lo_open=True)
    eval_every: int = _f(1, "evaluate every N rounds (and always the last round); other rounds have no accuracy columns", trial_id="never", group="evaluation", lo=1)
    seed: int = _f(0, "seed of partitions, client sampling, initialisation and data order (32 bits: the "
                      "per-client, per-round seeds keep 32 bits of it)", trial_id="always", group="training", plan=True, run_flag="S", lo=0, hi=2**32 - 1)

    # --- resources and runtime -------------------------------------------------------------
    backend: str = _f("ray", "ray (actors) or local (in-process, sequential)", trial_id="never", group="resources", run_flag=True, choices=BACKENDS)
    address: str | None = _f(None, "Ray cluster address ('auto' to join a running cluster); default: start a local Ray", trial_id="never", group="resources", sweep_option="address", run_flag="ADDR")
    num_cpus: int | None = _f(None, "CPUs of a local Ray started by fedtune (default: all of this machine's)", trial_id="never", group="resources", lo=1)
    num_gpus: float | None = _f(None, "GPUs of a local Ray started by fedtune (default: detected)", trial_id="never", group="resources", lo=0.0)
    client_cpus: float = _f(1.0, "CPUs reserved per client actor (fractions allowed); torch threads = max(1, floor)", trial_id="never", group="resources", lo=0.0, lo_open=True)
    client_gpus: float = _f(0.0, "GPUs per client actor (fractions share a GPU, e.g. 0.25 = 4 actors per GPU)", trial_id="never", group="resources", lo=0.0)
    coordinator_cpus: float = _f(0.0, "CPUs reserved for the coordinator actor (0: it shares the first client bundle; it is "
                                      "idle while clients train); its whole CPUs are the server rule's threads (the same "
                                      "results bit for bit, faster FedOMG and auto-β rounds)", trial_id="never", group="resources", lo=0.0)
    coordinator_gpus: float = _f(0.0, "GPUs reserved for the coordinator actor (today's server rules run on NumPy and need none)", trial_id="never", group="resources", lo=0.0)
    max_client_actors: int | None = _f(None, "client actors; logical clients are spread over them (default: as many as the cluster fits, at most one per client)", trial_id="never", group="resources", lo=1)
    client_placement: str = _f("auto", "which client actor trains a client: fixed (its owner, client id mod actors), roaming (dealt out each round so the actors finish together; every actor holds every client's data; not for a client method that keeps per-client state) or auto (roaming when clients are sampled, the method keeps no client state and all clients' data is at most 256 MiB); never changes a number", trial_id="never", group="resources", choices=PLACEMENTS)
    on_client_failure: str = _f("retry", "a dead client actor: retry (restart it, retry its clients once), skip (go on without them, recorded), fail", trial_id="never", group="resources", choices=FAILURE_POLICIES)
    placement_timeout_s: float = _f(60.0, "seconds to wait for the placement group when the cluster is busy", trial_id="never", group="resources", lo=0.0, lo_open=True)
    precision: str = _f("fp32", "client compute precision: fp32, bf16 (autocast; CPU or a GPU that has it) or fp16 (autocast and a gradient scaler; CUDA only); weights travel as float32", trial_id="when_set", group="resources", choices=PRECISIONS)
    channels_last: bool = _f(True, "CUDA clients: convolutional models and batches in channels_last memory format (no effect on CPU clients)", trial_id="when_set", group="resources")
    cudnn_benchmark: bool = _f(True, "CUDA clients: torch.backends.cudnn.benchmark (faster convolutions; GPU results may then differ in the last bits between runs)", trial_id="when_set", group="resources")
    checkpoint_every: int = _f(0, "Ray Tune trials: ask Tune to checkpoint the run every N rounds (weights, server-rule and client state; 0: never); `fedtune run` ignores it", trial_id="never", group="resources", lo=0)

    # --- hyperparameters declared by client methods / server rules (omg_kappa, gp_beta, ...) ---
    params: dict[str, Any] = _f(None, "hyperparameters of the client method and server rule; set them by name (--set omg_kappa=0.3)", trial_id="always", group="run", factory=dict)

    # --- results -----------------------------------------------------------------------------
    output: str = _f("fedtune_results", "results directory (holds one folder per study)", trial_id="never", group="results", sweep_option="output", run_flag="DIR")
    name: str = _f("default", "study name (a folder under output)", trial_id="never", group="results", sweep_option="name", run_flag="STUDY")

    # ------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> FederatedRunConfig:
        """Build and validate. Unknown keys are an error naming the closest known fields."""
        known = {f.name: f for f in fields(cls)}
        if values.get("plugins") is not None:  # first: they declare the names everything below looks up
            load_plugins(coerce("plugins", values["plugins"], list[str]), source=f"{source}: field 'plugins'")
        check_run_field_names(known)
        component = all_hparams()
        hints = get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        params: dict[str, Any] = {}
        flat: set[str] = set()
        for key, value in values.items():
            if key == "params":
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: field 'params' must be a mapping of name: value")
                params.update(value)
            elif key in component:
                params[key] = value
                flat.add(key)
            elif key in RENAMED_FIELDS:
                if value is not None:  # null means the clients_per_domain split under both names: old studies read
                    raise ConfigError(f"{source}: {renamed_field_message(key, value)}")
            elif key not in known:
                raise ConfigError(unknown_key_message(key, list(known) + list(component), source))
            else:
                kwargs[key] = coerce(key, value, hints[key])
        nested = values.get("params") if isinstance(values.get("params"), dict) else {}
        twice = sorted(flat & set(nested))
        if twice:  # one spelling: a hyperparameter is written by its name; `params` is how to_dict() nests it
            raise ConfigError(f"{source}: {twice[0]} is given twice, at the top level and under 'params'; "
                              f"write it once, as {twice[0]}: VALUE")
        kwargs["params"] = params
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def from_validated(cls, values: dict[str, Any]) -> FederatedRunConfig:
        """Rebuild a config from another config's :meth:`to_dict`, without checking it again: for a
        process handed a config that was validated where it was built (the coordinator and the
        client workers of a run). Anything a user wrote goes through :meth:`from_dict`.

        >>> cfg = FederatedRunConfig.from_dict({"algorithm": "fedomg", "omg_kappa": 0.3})
        >>> FederatedRunConfig.from_validated(cfg.to_dict()) == cfg
        True
        """
        load_plugins(values.get("plugins"), source="the run's field 'plugins'")
        return cls(**copy.deepcopy(values))

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> FederatedRunConfig:
        data = read_config_file(path)
        data.update(overrides or {})
        return cls.from_dict(data, source=str(path))

    def replace(self, **changes: Any) -> FederatedRunConfig:
        """A validated copy with some fields changed (a hyperparameter by its name, as anywhere else)."""
        values = self.to_dict()
        component = all_hparams()
        values["params"].update({k: changes.pop(k) for k in list(changes) if k in component})
        return FederatedRunConfig.from_dict({**values, **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def resolved(self) -> Resolved:
        """The client method and server rule this config runs (:func:`fedtune.algorithms.resolve`),
        resolved on first use and kept while ``algorithm``, ``client_method``, ``server_rule`` and
        ``setting`` stay as they were: ask the config, not :func:`~fedtune.algorithms.resolve`."""
        key = (self.algorithm, self.client_method, self.server_rule, self.setting)
        cached = self.__dict__.get("_resolved")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_resolved"] = (key, resolve(self))
        return cached[1]

    @property
    def effective_global_lr(self) -> float:
        """The server learning rate the run uses: ``global_lr``, or when unset the server optimiser's
        declared default, else the server rule's (:meth:`~fedtune.algorithms.Resolved.effective_global_lr`)."""
        return self.resolved.effective_global_lr(self)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles (Ray, checkpoints) carry the fields only, not the :attr:`resolved` cache."""
        state = dict(self.__dict__)
        state.pop("_resolved", None)
        return state

    def validate(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            setattr(self, f.name, coerce(f.name, value, hints[f.name]))
            f.metadata["bounds"].check(f"field '{f.name}'", getattr(self, f.name))
        check_mlp_hidden(self.mlp_hidden)
        self._refuse_unused()
        for name in ("client_gpus", "coordinator_gpus"):
            v = getattr(self, name)
            if v > 1 and v != int(v):
                raise ConfigError(f"field '{name}': {v} is not allowed; allowed: a fraction <= 1 or a whole number of GPUs")
        if self.setting == "fl" and self.val_fraction + self.test_fraction >= 0.95:
            raise ConfigError(
                f"fields 'val_fraction' + 'test_fraction' = {self.val_fraction + self.test_fraction} leave no "
                "training data; allowed: a sum below 0.95")

        if name_problem(self.name) is not None:  # a name too long, '/', NUL: before any folder is made
            raise ConfigError(f"field 'name': {shown(self.name, 60)} is not a valid study name "
                              f"({name_problem(self.name)}); allowed: {NAME_RULE}")
        check_path_text(self.output, "field 'output'")
        self._validate_model_and_data()
        # Names that need a registry are checked here too, so bad input fails before anything starts.
        resolved = self.resolved
        specs = {**resolved.hparam_specs(), **{h.name: h for h in SERVER_OPTIMIZERS.spec(self.server_optimizer).hparams}}
        owners = all_hparams()
        for key, value in resolved.implied_defaults(self.params).items():  # a named reading's knobs (fedadg_variant)
            self.params.setdefault(key, value)
        for key, value in resolved.preset_defaults().items():  # the algorithm's own defaults (fedsr: uniform mean)
            self.params.setdefault(key, value)
        for key, value in list(self.params.items()):
            if key not in owners:
                raise ConfigError(unknown_key_message(key, self.field_names() + list(owners), "params"))
            if key not in specs:
                raise ConfigError(
                    f"field '{key}' is a hyperparameter of {owners[key][0]}, which algorithm '{self.algorithm}' "
                    f"(client method {resolved.client_method_name}, server rule {resolved.server_rule_name}, "
                    f"server_optimizer {self.server_optimizer}) does not use")
            self.params[key] = specs[key].check(value, owners[key][0])
        # Conditions across fields (e.g. auto-β needs 2 local steps): once, here, not when the run starts.
        tuner = in_run_tuner_spec(self)
        for check in (resolved.client_spec.check, resolved.rule_spec.check, tuner.check if tuner else None):
            if check is not None:
                check(self)
        self._validate_plugins()
        if self.precision == "fp16" and not resolved.client_spec.scales_fp16_gradients:
            raise ConfigError(f"field 'precision': fp16 is not available with client method {resolved.client_method_name} "
                              "(its extra gradient passes bypass the fp16 gradient scaler); allowed: fp32, bf16")

    def _refuse_unused(self) -> None:
        """A field declared ``needs=(field, off, on)`` set to another value than its default while
        ``field`` is off (an in-run tuner's fields without its switch) is refused: it would change
        nothing but the trial id."""
        for f in fields(self):
            needs = f.metadata.get("needs")
            if needs is None or getattr(self, needs[0]):
                continue
            value, default = getattr(self, f.name), default_of(f)
            if value != default:
                raise ConfigError(f"field '{f.name}': {shown(value, 60)} has no effect: {needs[1]}; allowed: "
                                  f"{needs[2]}, or {f.name} left at its default {default!r}")

    def _validate_plugins(self) -> None:
        """``plugins`` gains where every component from outside fedtune the run uses comes from; one
        defined in ``__main__`` cannot reach Ray's workers."""
        entries = plugins_of_run(self)
        if MAIN_MODULE in entries and self.backend == "ray":
            raise ConfigError("field 'backend': a component of this run is registered from __main__ (a notebook cell "
                              "or the script itself), which Ray's workers cannot import; move it into a module file "
                              "(e.g. my_methods.py) and register it from there, or run with backend: local")
        self.plugins = [e for e in entries if e != MAIN_MODULE]

    def _validate_model_and_data(self) -> None:
        """Model name, pretrained weights, augmentation and precision against each other."""
        if self.model is not None and parse_model_factory(self.model) is not None:
            # lazy: keeps torch out of this module's import
            from fedtune.model_factory import resolve_factory

            resolve_factory(self.model)  # imports its module (a plugin); one line if it is not there
        elif self.model is not None and self.model not in ("cnn", "mlp"):
            from fedtune.models import check_model_name  # lazy: keeps torch out of this module's import

            check_model_name(self.model)
        if self.weights != "none":
            if self.pretrained_path:
                raise ConfigError("fields 'weights' and 'pretrained_path': give one of them, not both")
            if self.model in (None, "cnn", "mlp"):
                raise ConfigError(f"field 'weights': {shown(self.weights)} needs a torchvision model; set model (for "
                                  f"example model=resnet18 or resnet50), got model={self.model or 'the dataset default'}")
            # lazy: keeps torch out of this module's import
            from fedtune.model_check import check_replaceable_head
            from fedtune.models import ensure_weights_file, resolve_weights

            resolve_weights(self.model, self.weights)  # the weight set's name, then the head, then the file
            check_replaceable_head(self.model)
            ensure_weights_file(self.model, self.weights)
        if self.fidelity_participation is not None and self.fidelity_participation > self.participation:
            raise ConfigError(f"field 'fidelity_participation': {self.fidelity_participation} is above participation "
                              f"{self.participation} (the full fidelity); allowed: (0, {self.participation}]")
        if self.split_scheme is not None:
            check_scheme(self.split_scheme)
            plugin = plugin_dataset(self.dataset)
            if plugin is not None and self.split_scheme not in plugin.split_schemes:
                raise ConfigError(f"field 'split_scheme': {shown(self.split_scheme, 40)} is not a split scheme of "
                                  f"dataset {plugin.name!r} ({dataset_owner(plugin.name)}); allowed: "
                                  f"{', '.join((*plugin.split_schemes, 'null'))}")
            if plugin is None and not is_image_folder(self.dataset):
                raise ConfigError(f"field 'split_scheme': a split file lists image paths of a folder dataset (folder, "
                                  f"{', '.join(DOMAINBED)}); dataset {shown(self.dataset)} allows: null")
            if self.setting not in (None, "fdg"):
                raise ConfigError(f"field 'split_scheme': {self.split_scheme!r} gives a split file's train / OOD "
                                  f"validation / OOD test splits, which setting {self.setting!r} does not use; "
                                  "allowed: setting fdg, or split_scheme null")
            if self.target_domain is not None:  # the split file's 'test' rows are the test domains
                raise ConfigError(f"field 'target_domain': {shown(self.target_domain, 60)} has no effect with "
                                  f"split_scheme {self.split_scheme!r}, whose split file names the test domains "
                                  "(its 'test' rows); allowed: null (leave target_domain unset), or split_scheme "
                                  "null for leave-one-domain-out")
        if self.augment == "domainbed" and not is_image_folder(self.dataset):
            raise ConfigError(f"field 'augment': domainbed applies to image-folder datasets (folder, "
                              f"{', '.join(DOMAINBED)}); dataset {shown(self.dataset)} allows: none")
        if self.precision == "fp16" and self.client_gpus == 0:
            raise ConfigError("field 'precision': fp16 needs CUDA clients (client_gpus > 0); allowed on CPU clients: "
                              "fp32, bf16")

    @property
    def target_lr(self) -> float:
        """The FDA target client's learning rate: ``local_lr · target_lr_scale`` (exactly
        ``local_lr`` at the default scale 1)."""
        return float(self.local_lr) * float(self.target_lr_scale)

    @property
    def effective_augment(self) -> str:
        """The training augmentation the run uses: ``augment``, else ``domainbed`` for DomainBed's own
        datasets (DomainBed augments those) and ``none`` for the others: a generic folder may hold
        digits or text, whose labels a flip or crop can change, and DomainBed's digit sets are not augmented."""
        if self.augment != "auto":
            return self.augment

        return "domainbed" if is_domainbed(self.dataset) else "none"

    def hyperparameters(self) -> dict[str, Any]:
        """The tunable fields (``hp.<name>`` columns of the results), plus the rule's and method's own."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("hp")}
        out["global_lr"] = self.effective_global_lr
        out.update(self.resolved.hyperparameters(self))
        out.update({h.name: h.of(self) for h in SERVER_OPTIMIZERS.spec(self.server_optimizer).hparams})
        return out

    def participation_at(self, round: int) -> float:  # noqa: A002 - the round number
        """The participation of round ``round``: ``participation``, or under multi-fidelity over
        clients (``fidelity_participation``) :func:`~fedtune.data.partition.fidelity_participation`."""
        if self.fidelity_participation is None:
            return self.participation

        return fidelity_participation(round, self.participation, self.fidelity_participation,
                                      self.fidelity_grace_rounds, self.fidelity_factor)

    def trial_id(self) -> str:
        """A stable id of what this run computes: equal configs (up to output/naming/backends) share it
        (:func:`fedtune.trial_ids.trial_id_of`)."""
        return trial_id_of(self)


ROLES = roles_of(FederatedRunConfig)
"""Every list of run fields a role gives (:mod:`fedtune.config_roles`); derived here, at import, so a
field declared without a trial-id role or a group fails at once, in one line."""


# Old field names, refused with a message saying what changed (a null value still reads: the default).
RENAMED_FIELDS = {"domain_heterogeneity": "domain_homogeneity"}


def renamed_field_message(name: str, value: Any = None) -> str:
    """Why the old field ``name`` (a key of :data:`RENAMED_FIELDS`) is refused, and what to write instead."""
    flipped = ""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        flipped = f": set domain_homogeneity = 1 - {shown(value, 40)} = {1 - float(value):g}"
    elif value is not None:
        flipped = f": set domain_homogeneity = 1 - {shown(value, 40)}"
    return (f"field '{name}' was renamed {RENAMED_FIELDS[name]} and its direction flipped to Bai et "
            f"al.'s lambda (1 = homogeneous, 0 = one domain per client; new = 1 - old){flipped}")

def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping of field: value a YAML config file holds, unchecked (:meth:`FederatedRunConfig.from_yaml`
    checks it); a missing file, bad YAML or another shape than a mapping is one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        data = yaml_safe.load_file(path, f"config file '{path}'") or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of field: value, not {type(data).__name__}")
    return data


def default_of(f: dataclasses.Field) -> Any:
    """The default value of the config field ``f`` (a fresh one for a list or mapping)."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def describe_fields() -> list[tuple[str, str, str]]:
    """(name, default, help) of every field: the reference table in docs and `--help`."""
    rows = []
    for f in fields(FederatedRunConfig):
        default = default_of(f)
        help_ = f.metadata["help"]
        if f.metadata["bounds"].choices:
            help_ += f" [{'|'.join(f.metadata['bounds'].choices)}]"
        rows.append((f.name, repr(default), help_))
    return rows


def parse_set_options(items: list[str] | None) -> dict[str, Any]:
    """``["local_epochs=2", "mlp_hidden=[64]"]`` -> dict; values parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set '{clipped(item, 80)}': expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml_safe.load(raw, f"--set '{clipped(key, 60)}'") if raw.strip() != "" else None
        except yaml.YAMLError:
            value = raw
        out[key] = value
    return out
