"""Models and the flat-weight layout that moves them between processes.

Weights travel as one contiguous float32 NumPy vector: every floating-point entry of the
model's ``state_dict`` (parameters first, then floating buffers such as batch-norm running
statistics), in ``state_dict`` order. :class:`FlatLayout` records where each tensor lives.
Integer buffers (``num_batches_tracked``) stay local: they do not change what the model
computes with the default batch-norm momentum.

>>> model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
>>> layout = FlatLayout.of(model)
>>> layout.num_params, layout.size
(22, 22)
>>> vec = get_flat(model, layout); vec.dtype, vec.flags.c_contiguous
(dtype('float32'), True)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedtune.errors import ConfigError
from fedtune.layout import FlatLayout, TensorSlot  # noqa: F401  (re-exported)

MODELS = ("cnn", "mlp", "resnet18")


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


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int,
                mlp_hidden: list[int] | None = None, pretrained_path: str | None = None,
                head: str = "classifier", proj_dim: int = 128) -> nn.Module:
    """Build a freshly initialised model (initialisation follows torch's global RNG).

    ``head="classifier"`` (supervised runs) ends in a ``num_classes`` linear classifier.
    ``head="projector"`` (unsupervised runs, e.g. SimCLR) builds exactly the same model (same
    RNG draws for every encoder weight), then replaces that last linear layer by a SimCLR
    projector MLP ``features -> features -> proj_dim`` (:func:`projector_mlp`), so the projector
    is part of the flat weights and federated like everything else. :func:`encode` returns the
    encoder's features (what the head sees) for either head.

    >>> m = build_model("mlp", input_shape=(6,), num_classes=3, mlp_hidden=[5], head="projector", proj_dim=4)
    >>> m(torch.zeros(2, 6)).shape, encode(m, torch.zeros(2, 6)).shape
    (torch.Size([2, 4]), torch.Size([2, 5]))
    """
    if head not in HEADS:
        raise ValueError(f"build_model head: '{head}' is unknown; allowed: {', '.join(HEADS)}")
    if head == "projector" and int(proj_dim) < 1:
        raise ValueError(f"build_model proj_dim: {proj_dim} is out of range; allowed: >= 1")
    if name == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        width = int(np.prod(input_shape))
        for h in mlp_hidden if mlp_hidden is not None else [256, 256]:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        model: nn.Module = nn.Sequential(*layers)
    elif name == "cnn":
        if len(input_shape) != 3:
            raise ConfigError(f"field 'model': cnn needs image input, dataset gives shape {input_shape}; use mlp")
        c, h, w = input_shape
        if h != w or h < 8:
            raise ConfigError(f"field 'model': cnn needs square images of side >= 8, got {h}x{w}")
        model = FedAvgCNN(c, h, num_classes)
    elif name == "resnet18":
        if len(input_shape) != 3:
            raise ConfigError(f"field 'model': resnet18 needs image input, dataset gives shape {input_shape}; use mlp")
        from torchvision.models import resnet18

        model = resnet18(weights=None, num_classes=num_classes)
        if input_shape[0] != 3:
            model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        raise ConfigError(f"field 'model': '{name}' is unknown; allowed: {', '.join(MODELS)}")
    if pretrained_path:
        if name != "resnet18":
            raise ConfigError("field 'pretrained_path': only resnet18 loads pretrained weights")
        path = Path(pretrained_path)
        if not path.is_file():
            raise ConfigError(f"field 'pretrained_path': '{path}' does not exist")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # not a torch file, or it holds objects weights_only refuses
            raise ConfigError(f"field 'pretrained_path': '{path}' is not a loadable state_dict "
                              f"(torch.load with weights_only=True): {type(exc).__name__}") from None
        if not isinstance(state, dict):
            raise ConfigError(f"field 'pretrained_path': '{path}' holds a {type(state).__name__}, not a state_dict")
        # A backbone checkpoint's classifier usually has another class count: keep ours.
        own = model.state_dict()
        state = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(state, strict=False)
    if head == "projector":
        _replace_head(model, int(proj_dim))
    return model


HEADS = ("classifier", "projector")


def projector_mlp(in_features: int, proj_dim: int) -> nn.Sequential:
    """SimCLR's projection head g(h) = W2 ReLU(W1 h): hidden width = the encoder's feature width
    (as in Chen et al. 2020), no batch norm (so it adds no buffers)."""
    return nn.Sequential(nn.Linear(in_features, in_features), nn.ReLU(inplace=True), nn.Linear(in_features, proj_dim))


def _head_owner(model: nn.Module) -> tuple[nn.Module, str]:
    """(parent module, attribute/index) of the model's final linear head, for cnn, mlp and resnet18."""
    if isinstance(model, FedAvgCNN):
        return model.classifier, str(len(model.classifier) - 1)
    if isinstance(model, nn.Sequential):  # mlp
        return model, str(len(model) - 1)
    if hasattr(model, "layer4") and hasattr(model, "fc"):  # torchvision ResNet (no torchvision import)
        return model, "fc"
    raise TypeError(f"no known head on a {type(model).__name__}; known models: {', '.join(MODELS)}")


def _replace_head(model: nn.Module, proj_dim: int) -> None:
    parent, key = _head_owner(model)
    old = parent[int(key)] if key.isdigit() else getattr(parent, key)
    new = projector_mlp(old.in_features, proj_dim).to(old.weight.device)
    if key.isdigit():
        parent[int(key)] = new
    else:
        setattr(parent, key, new)


def encode(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Encoder features of ``x``: the model's output before its head (classifier or projector).

    cnn: the 512-unit FC layer after ReLU; mlp: the last hidden layer after ReLU (the flattened
    input when ``mlp_hidden=[]``); resnet18: the 512-d global-average-pooled features.
    Runs in whatever mode the model is in (call ``model.eval()`` first for evaluation).
    """
    if isinstance(model, FedAvgCNN):
        return model.classifier[:-1](model.features(x))
    if isinstance(model, nn.Sequential):
        return model[:-1](x)
    if hasattr(model, "layer4") and hasattr(model, "fc"):
        h = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        h = model.layer4(model.layer3(model.layer2(model.layer1(h))))
        return torch.flatten(model.avgpool(h), 1)
    raise TypeError(f"cannot encode with a {type(model).__name__}; known models: {', '.join(MODELS)}")


def get_flat(model: nn.Module, layout: FlatLayout, out: np.ndarray | None = None) -> np.ndarray:
    """Copy the model's floating state into a contiguous float32 vector."""
    vec = np.empty(layout.size, dtype=np.float32) if out is None else out
    state = model.state_dict()
    view = torch.from_numpy(vec)
    with torch.no_grad():
        for s in layout.slots:
            view[s.offset:s.offset + s.size].copy_(state[s.name].detach().reshape(-1))
    return vec


def set_flat(model: nn.Module, layout: FlatLayout, vec: np.ndarray) -> None:
    """Load a flat vector (possibly a read-only zero-copy view) into the model in place."""
    if vec.shape != (layout.size,):
        raise ValueError(f"flat weights have shape {vec.shape}, the model needs ({layout.size},)")
    with warnings.catch_warnings():  # zero-copy views from Ray's object store are read-only; we only read
        warnings.simplefilter("ignore", UserWarning)
        src = torch.from_numpy(vec)
    state = model.state_dict()
    with torch.no_grad():
        for s in layout.slots:
            state[s.name].copy_(src[s.offset:s.offset + s.size].view(s.shape))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
