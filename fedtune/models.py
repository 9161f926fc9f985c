"""Models: the architectures fedtune builds, their heads, encoders and weight files.

Their weights travel between processes as one flat float32 vector laid out by
:class:`~fedtune.layout.FlatLayout`; :mod:`fedtune.flat_weights` copies them in and out.

>>> model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
>>> count_parameters(model)
22
"""

from __future__ import annotations

import contextlib
import difflib
import types
from pathlib import Path
from typing import Any, Iterator, NoReturn

import numpy as np
import torch
from torch import nn

from fedtune.errors import ConfigError, shown
from fedtune.model_factory import build_factory_model, is_factory
from fedtune.model_heads import ProbabilisticHead, projector_mlp
from fedtune.old_names import old_name_error
from fedtune.weight_files import checkpoint_state_dict, published_file



class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al. used for FL in the FedOMG paper: two 5x5 conv layers (32, 64
    channels) each followed by 2x2 max-pooling, a 512-unit fully connected layer, a classifier."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * side * side, 512), nn.ReLU(inplace=True), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


BUILTIN_MODELS = ("cnn", "mlp")
WEIGHT_FREE = "none"
AUX_LOGIT_MODELS = ("googlenet", "inception_v3")
"""torchvision models built with ``aux_logits=False`` (their training forward returns one tensor)."""


def torchvision_models() -> list[str]:
    """torchvision's classification models (``torchvision.models.list_models``)."""
    import torchvision.models  # lazy: keeps torchvision out of this module's import

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name: str) -> None:
    """Raise a ConfigError unless ``name`` is cnn, mlp or a torchvision classification model."""
    if name in BUILTIN_MODELS:
        return
    known = torchvision_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6) if len(str(name)) < 100 else []
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"field 'model': {shown(name)} is unknown; allowed: cnn, mlp or a torchvision classification "
                          f"model such as resnet18, resnet50, convnext_tiny, efficientnet_b0 ({len(known)} in all; "
                          f"`python -c \"import torchvision; print(torchvision.models.list_models())\"`){hint}")


def resolve_weights(model: str, weights: str):
    """torchvision's weights enum member for ``model`` named ``weights`` (``DEFAULT`` or a member
    name such as ``IMAGENET1K_V1``), or a ConfigError naming the choices."""
    if model in BUILTIN_MODELS:
        raise ConfigError(f"field 'weights': model '{model}' has no pretrained weights; allowed: none "
                          "(or a torchvision model such as resnet18)")
    if is_factory(model):
        raise ConfigError(f"field 'weights': {shown(weights)} names torchvision's weights, and model {model!r} is your "
                          "own factory; allowed: weights none, with a checkpoint of the factory's model as "
                          "pretrained_path")
    from torchvision.models import get_model_weights  # lazy: keeps torchvision out of this module's import

    check_model_name(model)
    enum = get_model_weights(model)
    names = [m.name for m in enum]
    if weights == "DEFAULT":
        return enum.DEFAULT
    if weights not in names:
        raise ConfigError(f"field 'weights': '{weights}' is not a weight set of {model}; allowed: none, DEFAULT, "
                          f"{', '.join(names)}")
    return enum[weights]


def ensure_weights_file(model: str, weights: str, download_timeout_s: float = 20.0) -> Path:
    """The local file of torchvision's ``weights`` for ``model``: found in
    ``$TORCH_HOME/hub/checkpoints`` (SHA-256 checked against its name), else downloaded there
    (torch.hub, hash checked), else one ConfigError line naming the file, the folder and
    ``pretrained_path`` (:func:`fedtune.weight_files.published_file`)."""
    return published_file(resolve_weights(model, weights), model, download_timeout_s)


def weight_free_options(name: str) -> dict:
    """torchvision's builder options for ``name`` without weights: googlenet / inception_v3 without
    auxiliary classifiers (training would return a tuple of logits) and with ``init_weights=True``,
    torchvision's present default said explicitly (left out, torchvision warns that it will change)."""
    return {"aux_logits": False, "init_weights": True} if name in AUX_LOGIT_MODELS else {}


def _drop_auxiliary_classifiers(model: nn.Module) -> None:
    """googlenet's ``aux1`` / ``aux2``, inception_v3's ``AuxLogits`` removed and ``aux_logits`` off:
    what torchvision's builders do after loading their weights when ``aux_logits`` is not asked for
    (inception_v3's builder keeps them unless told ``aux_logits=False``, which it refuses with weights)."""
    model.aux_logits = False
    for key in ("aux1", "aux2", "AuxLogits"):
        if hasattr(model, key):
            setattr(model, key, None)


def _torchvision_model(name: str, input_shape: tuple[int, ...], num_classes: int, weights: str | None) -> nn.Module:
    check_model_name(name)
    if len(input_shape) != 3:
        raise ConfigError(f"field 'model': {name} needs image input, dataset gives shape {input_shape}; use mlp")
    from torchvision.models import get_model  # lazy: keeps torchvision out of this module's import

    if weights in (None, WEIGHT_FREE):
        model = get_model(name, weights=None, num_classes=num_classes, **weight_free_options(name))
    else:
        if input_shape[0] != 3:
            raise ConfigError(f"field 'weights': {name}'s pretrained weights take RGB input, dataset gives "
                              f"{input_shape[0]} channel(s); allowed: weights none")
        path = ensure_weights_file(name, weights)
        try:  # torchvision's builder reads it with weights_only=False: only a plain state dict may get there
            torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ConfigError(f"field 'weights': {path} is not a plain state dict (torch.load with weights_only=True "
                              f"refused it: {type(exc).__name__}); delete it and fetch torchvision's file again") from None
        try:  # torchvision loads it, strictly (with its auxiliary classifiers: it refuses aux_logits=False)
            model = get_model(name, weights=resolve_weights(name, weights))
        except RuntimeError as exc:  # a state dict of another architecture: torchvision's key list
            raise ConfigError(f"field 'weights': {path} does not hold {name}'s weights (torchvision's strict load "
                              f"refused it: {str(exc).splitlines()[0][:120]}); delete it and fetch torchvision's "
                              "file again") from None
        if name in AUX_LOGIT_MODELS:  # then drops them, as torchvision does when aux_logits is left out
            _drop_auxiliary_classifiers(model)
    if input_shape[0] != 3:  # grey input: the first convolution takes input_shape[0] channels
        conv_name, conv = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
        parent_name, _, key = conv_name.rpartition(".")
        _set_child(model.get_submodule(parent_name) if parent_name else model, key,
                   nn.Conv2d(input_shape[0], conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                             conv.dilation, conv.groups, conv.bias is not None))
    return model


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int,
                mlp_hidden: list[int] | None = None, pretrained_path: str | None = None,
                weights: str | None = None, head: str = "classifier", proj_dim: int = 128,
                z_dim: int = 512, eval_samples: int = 0) -> nn.Module:
    """Build a model (initialisation follows torch's global RNG).

    ``name``: ``cnn`` (:class:`FedAvgCNN`), ``mlp``, or any torchvision classification model
    (``torchvision.models.get_model``: resnet18, resnet50, convnext_tiny, efficientnet_b0, ...;
    grey input replaces the first convolution), or your own factory ``MODULE:FUNCTION``
    (:mod:`fedtune.model_factory`). ``weights`` (torchvision models): ``none``,
    ``DEFAULT`` or an enum member name such as ``IMAGENET1K_V1``; torchvision's weights are read
    from ``$TORCH_HOME/hub/checkpoints`` (:func:`ensure_weights_file`, SHA-256 checked against the
    file name), then the classifier is replaced by a fresh ``num_classes`` one. ``pretrained_path``:
    a local checkpoint (:func:`load_checkpoint`: strict on every backbone key). With pretrained
    weights by either route, every new head module (classifier, projector, probabilistic head) is
    drawn from one seed drawn from torch's global RNG, so the same file by either route and the
    same seed give the same model bit for bit (docs/methods-protocol.md §5.9).

    ``head="classifier"`` (supervised runs) ends in a ``num_classes`` linear classifier.
    ``head="projector"`` (unsupervised runs, e.g. SimCLR) builds exactly the same model (same
    RNG draws for every encoder weight), then replaces that last linear layer by a SimCLR
    projector MLP ``features -> features -> proj_dim`` (:func:`projector_mlp`), so the projector
    is part of the flat weights and federated like everything else. :func:`encode` returns the
    encoder's features (what the head sees) for either head.

    ``head="probabilistic"`` (FedSR) likewise builds the classifier model, then replaces its last
    linear layer by a :class:`ProbabilisticHead`: ``features -> 2·z_dim`` (mean and softplus scale
    of ``z``), a ``z_dim -> num_classes`` classifier on a sampled ``z``, and FedSR's class-conditional
    prior (``r_mu``, ``r_sigma``, ``z_scale``) as parameters, federated like everything else. In eval
    mode it returns class logits (``eval_samples=0``: the classifier on the mean; see the class).

    >>> m = build_model("mlp", input_shape=(6,), num_classes=3, mlp_hidden=[5], head="projector", proj_dim=4)
    >>> m(torch.zeros(2, 6)).shape, encode(m, torch.zeros(2, 6)).shape
    (torch.Size([2, 4]), torch.Size([2, 5]))
    >>> p = build_model("mlp", input_shape=(6,), num_classes=3, mlp_hidden=[5], head="probabilistic", z_dim=4)
    >>> p.eval()(torch.zeros(2, 6)).shape, encode(p, torch.zeros(2, 6)).shape
    (torch.Size([2, 3]), torch.Size([2, 5]))
    """
    if head not in HEADS:
        raise ValueError(f"build_model head: '{head}' is unknown; allowed: {', '.join(HEADS)}")
    if head == "projector" and int(proj_dim) < 1:
        raise ValueError(f"build_model proj_dim: {proj_dim} is out of range; allowed: >= 1")
    if head == "probabilistic" and (int(z_dim) < 1 or int(eval_samples) < 0):
        raise ValueError(f"build_model z_dim {z_dim} / eval_samples {eval_samples}: out of range; allowed: z_dim >= 1, "
                         "eval_samples >= 0")
    if weights not in (None, WEIGHT_FREE):
        if pretrained_path:
            raise ConfigError("fields 'weights' and 'pretrained_path': give one of them, not both")
        if name in BUILTIN_MODELS:
            resolve_weights(name, weights)  # raises: cnn/mlp have no pretrained weights
    pretrained = weights not in (None, WEIGHT_FREE) or bool(pretrained_path)
    # Pretrained weights (either route): the new head is drawn from one seed taken from torch's global
    # RNG, whatever the backbone's construction drew, and the global RNG moves by that one draw only.
    head_seed = int(torch.randint(0, 2**62, (), device="cpu")) if pretrained else None
    with _rng_seeded(head_seed):
        model = _body(name, input_shape, num_classes, mlp_hidden, weights)
        head_loaded = load_checkpoint(model, pretrained_path) if pretrained_path else False
        if head_seed is not None:
            torch.random.default_generator.manual_seed(head_seed)
            if not head_loaded:
                require_linear_head(model, name)
                _fresh_classifier(model, num_classes)
        if head == "projector":
            _replace_head(model, int(proj_dim))
        elif head == "probabilistic":
            parent, key = _head_owner(model)
            old = _child(parent, key)
            new = ProbabilisticHead(old.in_features, int(z_dim), num_classes, int(eval_samples))
            _set_child(parent, key, new.to(old.weight.device))
    return model


@contextlib.contextmanager
def _rng_seeded(seed: int | None) -> Iterator[None]:
    """Within the block torch's CPU generator starts from ``seed`` and is put back afterwards
    (nothing changes when ``seed`` is None)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


def _fresh_classifier(model: nn.Module, num_classes: int) -> None:
    """Replace the model's last linear layer by a new ``num_classes`` one (drawn from the CPU RNG)."""
    parent, key = _head_owner(model)
    old = _child(parent, key)
    _set_child(parent, key, nn.Linear(old.in_features, num_classes, device=old.weight.device))


def _body(name: str, input_shape: tuple[int, ...], num_classes: int, mlp_hidden: list[int] | None,
          weights: str | None) -> nn.Module:
    """The model ``name`` with a ``num_classes`` classifier, torchvision's ``weights`` loaded."""
    if name == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        width = int(np.prod(input_shape))
        for h in mlp_hidden if mlp_hidden is not None else [256, 256]:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        return nn.Sequential(*layers)
    if name == "cnn":
        if len(input_shape) != 3:
            raise ConfigError(f"field 'model': cnn needs image input, dataset gives shape {input_shape}; use mlp")
        c, h, w = input_shape
        if h != w or h < 8:
            raise ConfigError(f"field 'model': cnn needs square images of side >= 8, got {h}x{w}")
        return FedAvgCNN(c, h, num_classes)
    if is_factory(name):
        return build_factory_model(name, input_shape, num_classes)
    return _torchvision_model(name, input_shape, num_classes, weights)


HEADS = ("classifier", "projector", "probabilistic")


def _key_list(keys: list[str]) -> str:
    return ", ".join(keys[:6]) + (f" (and {len(keys) - 6} more)" if len(keys) > 6 else "")


def load_checkpoint(model: nn.Module, pretrained_path: str | Path) -> bool:
    """Load a local checkpoint into ``model``, strictly on the backbone.

    Read with ``torch.load(..., weights_only=True)``; accepts a plain state dict, one wrapped as
    ``{"state_dict": ...}`` or ``{"model": ...}``, and ``module.``-prefixed keys. Every key of the
    model except its classifier must be in the checkpoint with the same shape, and the checkpoint
    may hold nothing else; the classifier is loaded when its shapes match (same class count) and
    left as built otherwise. Anything else is refused, naming the keys. Returns whether the
    classifier was loaded."""
    path = Path(pretrained_path)
    state = checkpoint_state_dict(path)
    require_linear_head(model, type(model).__name__)
    own = model.state_dict()
    parent, key = _head_owner(model)
    head_name = next(n for n, m in model.named_modules() if m is _child(parent, key))
    is_head = lambda k: k.startswith(head_name + ".")  # noqa: E731
    optional = lambda k: is_head(k) or k.endswith("num_batches_tracked")  # noqa: E731
    missing = [k for k in own if k not in state and not optional(k)]
    unexpected = [k for k in state if k not in own]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own
             if k in state and not is_head(k) and state[k].shape != own[k].shape]
    problems = []
    if missing:
        problems.append(f"missing {_key_list(missing)}")
    if wrong:
        problems.append(f"wrong shape {_key_list(wrong)}")
    if unexpected:
        problems.append(f"not in the model {_key_list(unexpected)}")
    if problems:
        raise ConfigError(f"field 'pretrained_path': '{path}' does not match the model's backbone ({len(own)} keys; only "
                          f"the classifier {head_name} may differ): {'; '.join(problems)}")
    load = {k: v for k, v in state.items() if not is_head(k) or v.shape == own[k].shape}
    if not any(t.is_meta for t in own.values()):  # on the meta device (the pre-launch check) keys and shapes are
        model.load_state_dict(load, strict=False)  # all there is: a copy there is a no-op torch warns of per tensor
    return any(is_head(k) for k in load)


def prepare_for_device(model: nn.Module, device: torch.device | str, channels_last: bool = False) -> nn.Module:
    """``model`` on ``device``, in ``channels_last`` memory format when asked (convolutional
    models on GPUs; the flat weights stay in logical order either way)."""
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def freeze_batchnorm(model: nn.Module) -> nn.Module:
    """Keep ``model``'s batch-norm layers in eval mode whatever ``model.train()`` is asked (DomainBed's
    and Bai et al.'s ``ResNet.train``/``freeze_bn``): they normalise by their running statistics and
    never update them; their affine scale and shift still train. ``model.train`` is replaced on this
    instance (a deep copy keeps it, bound to the copy). Returns ``model``, in eval mode.

    >>> m = freeze_batchnorm(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    >>> _ = m.train(); m.training, m[0].training, m[1].training
    (True, True, False)
    """
    def train(self: nn.Module, mode: bool = True) -> nn.Module:
        nn.Module.train(self, mode)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self

    model.train = types.MethodType(train, model)  # type: ignore[method-assign]
    return model.eval()


def _child(parent: nn.Module, key: str) -> nn.Module:
    return parent[int(key)] if key.isdigit() else getattr(parent, key)


def _set_child(parent: nn.Module, key: str, module: nn.Module) -> None:
    if key.isdigit():
        parent[int(key)] = module
    else:
        setattr(parent, key, module)


def _head_owner(model: nn.Module) -> tuple[nn.Module, str]:
    """(parent module, attribute/index) of the model's head: its last linear layer in module
    order (cnn, mlp and every torchvision classifier: ``fc``, ``classifier[-1]``, ``heads.head``)
    or the SimCLR projector / FedSR probabilistic head that replaced it."""
    found = None
    for name, module in model.named_modules():
        if getattr(module, "_fedtune_projector", False) or isinstance(module, ProbabilisticHead):
            found = name
            break
        if isinstance(module, nn.Linear):
            found = name
    if not found:
        raise TypeError(f"no linear head on a {type(model).__name__}: fedtune replaces a classifier's last nn.Linear")
    parent_name, _, key = found.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), key


def has_linear_head(model: nn.Module) -> bool:
    """Whether ``model`` has a head fedtune can replace or read (a last ``nn.Linear``, or a
    projector / probabilistic head that replaced it); squeezenet's convolutional classifier is not."""
    try:
        _head_owner(model)
    except TypeError:
        return False
    return True


def require_linear_head(model: nn.Module, name: str) -> None:
    """A ConfigError line unless ``model`` (named ``name``) has a linear classifier for pretrained
    weights to leave out and replace."""
    if not has_linear_head(model):
        raise ConfigError(f"field 'model': {name} has no linear classifier (nn.Linear) to replace for the dataset's "
                          "classes; allowed with weights or pretrained_path: a model with a linear classifier "
                          "(resnet18, resnet50, convnext_tiny, ...)")


def _replace_head(model: nn.Module, proj_dim: int) -> None:
    parent, key = _head_owner(model)
    old = _child(parent, key)
    new = projector_mlp(old.in_features, proj_dim).to(old.weight.device)
    new._fedtune_projector = True
    _set_child(parent, key, new)


def encode(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Encoder features of ``x``: what the model's head (classifier or projector) receives.

    cnn: the 512-unit FC layer after ReLU; mlp: the last hidden layer after ReLU (the flattened
    input when ``mlp_hidden=[]``); resnet18: the 512-d global-average-pooled features; any other
    torchvision model: the input of its last linear layer (read with a forward pre-hook).
    Runs in whatever mode the model is in (call ``model.eval()`` first for evaluation).
    """
    if isinstance(model, FedAvgCNN):
        return model.classifier[:-1](model.features(x))
    if isinstance(model, nn.Sequential) and len(model) and _head_owner(model) == (model, str(len(model) - 1)):
        return model[:-1](x)  # the mlp (and a Sequential ending in its head): every layer but the head
    parent, key = _head_owner(model)
    seen: list[torch.Tensor] = []
    handle = _child(parent, key).register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return seen[0]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


MAX_MODEL_PARAMS = 1 << 30
"""Most parameters of a cnn, mlp or factory model (4 GiB as float32, per copy: every client actor,
the coordinator and each trained state hold one)."""


def check_model_size(name: str, input_shape: tuple[int, ...], num_classes: int, mlp_hidden: list[int],
                     head: dict[str, Any]) -> int:
    """The parameters of model ``name`` (cnn or mlp, whose size grows with the input: image_size,
    the dataset's features, mlp_hidden; a factory's, which may), counted on torch's meta device
    (nothing allocated), or a ConfigError above :data:`MAX_MODEL_PARAMS`: raised before any data is
    decoded or weight built. torchvision models have the sizes of their architecture: 0, not
    counted; so has a factory whose construction needs real tensors (the pre-launch check,
    :func:`fedtune.model_check.check_model_runs`, counted it on the CPU).

    >>> check_model_size("cnn", (3, 32, 32), 10, [], {})
    2156490
    """
    if name not in ("cnn", "mlp") and not is_factory(name):
        return 0
    try:
        with torch.device("meta"):
            model = build_model(name, input_shape=input_shape, num_classes=num_classes, mlp_hidden=mlp_hidden, **head)
    except (NotImplementedError, RuntimeError):
        if not is_factory(name):
            raise
        return 0
    return refuse_oversized(name, input_shape, sum(p.numel() for p in model.parameters()))


def refuse_oversized(name: str, input_shape: tuple[int, ...], count: int) -> int:
    """``count`` (model ``name``'s parameters on inputs of ``input_shape``), or one ConfigError line
    above :data:`MAX_MODEL_PARAMS` naming what to lower."""
    if count > MAX_MODEL_PARAMS:
        knob = ("image_size" if name == "cnn" else "mlp_hidden (or image_size)" if name == "mlp"
                else "the factory's widths (or image_size)")
        raise ConfigError(f"field 'model': {name} on inputs of shape {tuple(input_shape)} has {count} parameters "
                          f"({count * 4 / 2**30:.1f} GiB as float32); allowed: at most {MAX_MODEL_PARAMS}; lower {knob}")
    return count


def __getattr__(name: str) -> NoReturn:
    """``fedtune.models.get_flat``/``set_flat`` moved to :mod:`fedtune.flat_weights`: one line naming it."""
    raise old_name_error(__name__, name)
