"""The check of a torchvision model against a run's input before anything launches.

:func:`check_model_runs` builds the model on torch's meta device (nothing allocated; a model
whose construction needs real tensors, such as the RegNets, is built on the CPU and moved to
meta), with the run's head and without its weights, and runs one training-mode forward on a
batch of two inputs of the dataset's shape. A model that cannot run on that input (inception_v3
or vit_b_16 at 32 px, alexnet at 8 px) or has no linear classifier for fedtune to replace
(squeezenet with pretrained weights or another head) is refused in one ConfigError line naming
``model`` / ``image_size`` and what runs, instead of a traceback in every worker mid-launch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedtune.errors import ConfigError
from fedtune.model_factory import is_factory
from fedtune.models import (BUILTIN_MODELS, WEIGHT_FREE, build_model, has_linear_head, refuse_oversized,
                            require_linear_head, resolve_weights, weight_free_options)

_PASSED: set[tuple] = set()  # configurations already checked in this process
PROBE_MAX_SIDE = 512
"""The largest image side :func:`check_model_runs` tries when it looks for the smallest side a
model runs at."""


def check_model_runs(name: str, input_shape: tuple[int, ...], num_classes: int, head: dict[str, Any], *,
                     weights: str | None = WEIGHT_FREE, pretrained_path: str | None = None,
                     method: str | None = None, reads_features: bool = False) -> None:
    """Refuse, in one ConfigError line, a torchvision model or a factory's model
    (:mod:`fedtune.model_factory`) that cannot train on ``input_shape`` with the head ``head``
    (``build_model``'s head keywords) and, when ``weights`` or ``pretrained_path`` is given, a
    classifier fedtune replaces; ``method``: the run's client method (named in the messages), with
    ``reads_features`` when it reads the model's features, the input of its last ``nn.Linear`` (MOON,
    CORAL, ...), which the model must then have. cnn and mlp are not checked here (``build_model``
    checks their input as it builds them)."""
    if is_factory(name):
        _check_factory(name, input_shape, num_classes, head, pretrained_path, method, reads_features)
        return
    if name in BUILTIN_MODELS or len(input_shape) != 3:
        return
    pretrained = weights not in (None, WEIGHT_FREE) or bool(pretrained_path)
    key = (name, tuple(input_shape), int(num_classes), tuple(sorted(head.items())), str(weights), pretrained,
           reads_features)
    if key in _PASSED and not pretrained_path:  # a checkpoint is read every time
        return
    if pretrained:
        check_replaceable_head(name)
    model = _meta_model(name, input_shape, num_classes, head, weights, pretrained_path)
    problem = _forward_problem(model, input_shape)
    if problem:
        c, h, w = input_shape
        raise ConfigError(f"field 'model': {name} does not run on {c}x{h}x{w} images ({problem}); allowed: "
                          f"{_sides_that_run(name, model, input_shape)}")
    if reads_features and not has_linear_head(model):
        raise ConfigError(_no_head(name, f"whose input client method {method} reads as the features"))
    _PASSED.add(key)


def _no_head(name: str, role: str) -> str:
    return (f"field 'model': {name} has no linear classifier (nn.Linear) {role}; allowed: a model whose last "
            "nn.Linear (in module order) is its classifier")


def _check_factory(name: str, input_shape: tuple[int, ...], num_classes: int, head: dict[str, Any],
                   pretrained_path: str | None, method: str | None, reads_features: bool) -> None:
    """A factory's model against the run (:func:`check_model_runs`): the plain model runs on a batch of
    two inputs and returns ``[2, num_classes]``, within :data:`~fedtune.models.MAX_MODEL_PARAMS`; with a
    head to replace, a checkpoint or a method that reads its features, it has an ``nn.Linear``, and
    the model with the run's head and checkpoint runs too."""
    plain = _meta_model(name, input_shape, num_classes, {}, None, None)
    refuse_oversized(name, input_shape, sum(p.numel() for p in plain.parameters()))
    shape = "x".join(str(v) for v in input_shape)
    problem = _forward_problem(plain, input_shape)
    if problem:
        hint = _factory_sides(name, input_shape, num_classes) if len(input_shape) == 3 else \
            f"a model that takes inputs of shape {tuple(input_shape)}"
        raise ConfigError(f"field 'model': factory {name} does not run on inputs of shape {shape} ({problem}); "
                          f"allowed: {hint}")
    problem = _forward_problem(plain, input_shape, num_classes)
    if problem:
        raise ConfigError(f"field 'model': factory {name}: {problem}; allowed: a model whose forward returns "
                          f"[N, num_classes] = [N, {num_classes}] logits")
    kind = head.get("head", "classifier")
    role = (f"for client method {method}'s {kind} head to replace" if kind != "classifier" else
            "to replace for pretrained_path's classifier" if pretrained_path else
            f"whose input client method {method} reads as the features" if reads_features else "")
    if role and not has_linear_head(plain):
        raise ConfigError(_no_head(f"factory {name}", role))
    if kind != "classifier" or pretrained_path:
        model = _meta_model(name, input_shape, num_classes, head, None, pretrained_path)
        problem = _forward_problem(model, input_shape)
        if problem:
            raise ConfigError(f"field 'model': factory {name} with the {kind} head does not run on inputs of shape "
                              f"{shape} ({problem}); allowed: a model whose last nn.Linear is its classifier")


def _factory_sides(name: str, input_shape: tuple[int, ...], num_classes: int) -> str:
    """What to configure instead for a factory that does not run at ``input_shape``'s side: the
    smallest ``image_size`` at which its model, built for that size, runs (bisection on the meta
    device, up to :data:`PROBE_MAX_SIDE`), else another model."""
    c, side = input_shape[0], int(input_shape[-1])

    def runs(s: int) -> bool:
        try:
            return not _forward_problem(_meta_model(name, (c, s, s), num_classes, {}, None, None), (c, s, s))
        except ConfigError:
            return False

    if side < PROBE_MAX_SIDE and runs(PROBE_MAX_SIDE):
        lo, hi = side, PROBE_MAX_SIDE
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if runs(mid) else (mid, hi)
        return f"image_size >= {hi} (field 'image_size'), or another model"
    return "another model or image_size (field 'image_size')"


def check_replaceable_head(name: str) -> None:
    """Refuse, in one ConfigError line, pretrained weights for a torchvision model without a linear
    classifier to replace (squeezenet1_0, squeezenet1_1): checked on the meta device before the
    weights file is looked for or fetched."""
    if name in BUILTIN_MODELS or name in _HEAD_PASSED:
        return
    from torchvision.models import get_model  # lazy: keeps torchvision out of this module's import

    try:
        with torch.device("meta"):
            model = get_model(name, weights=None, **weight_free_options(name))
    except (NotImplementedError, RuntimeError):  # regnet_*'s init needs real tensors: check_model_runs
        return  # builds it on the CPU before launch
    require_linear_head(model, name)
    _HEAD_PASSED.add(name)


_HEAD_PASSED: set[str] = set()


def _meta_model(name: str, input_shape: tuple[int, ...], num_classes: int, head: dict[str, Any],
                weights: str | None, pretrained_path: str | None) -> nn.Module:
    """The run's model on the meta device: without torchvision's weights (a ViT built from them takes
    their image size, as torchvision sets it from ``meta['min_size']``), with ``pretrained_path``'s
    keys and shapes checked (:func:`~fedtune.models.load_checkpoint`)."""
    from torchvision.models import get_model  # lazy: keeps torchvision out of this module's import

    if weights not in (None, WEIGHT_FREE) and name.startswith("vit_"):
        size = resolve_weights(name, weights).meta["min_size"][0]
        build = lambda: get_model(name, weights=None, num_classes=num_classes, image_size=size)  # noqa: E731
    else:
        build = lambda: build_model(name, input_shape=input_shape, num_classes=num_classes,  # noqa: E731
                                    pretrained_path=pretrained_path, **head)
    try:
        try:
            with torch.device("meta"):
                return build()
        except (NotImplementedError, RuntimeError):  # a builder that needs real tensors (regnet_*'s init)
            with torch.random.fork_rng(devices=[]):
                return build().to("meta")
    except TypeError as exc:  # build_model's head swap: no nn.Linear to put the head on
        if "no linear head" not in str(exc):
            raise
        raise ConfigError(f"field 'model': {name} has no linear classifier (nn.Linear) for the {head.get('head')} "
                          f"head to replace; allowed: a model with a linear classifier "
                          "(resnet18, resnet50, convnext_tiny, ...)") from None


def _forward_problem(model: nn.Module, input_shape: tuple[int, ...], num_classes: int | None = None) -> str:
    """'' when a training-mode forward of two inputs of ``input_shape`` gives a batch of
    outputs (of ``num_classes`` logits each, when given), else the first line of what torch said."""
    model.train()
    try:
        with torch.no_grad():
            out = model(torch.empty((2, *input_shape), device="meta"))
    except Exception as exc:  # noqa: BLE001 - any failure of the forward is the user's model/size choice
        return (str(exc).splitlines() or [type(exc).__name__])[0][:150]
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != 2:
        what = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        return f"its forward returns {what} for a batch of 2, not a batch of logits [2, classes]"
    if num_classes is not None and out.shape[1] != num_classes:
        return (f"its forward returns logits of shape {list(out.shape)} for a batch of 2 inputs, and the dataset "
                f"has {num_classes} classes")
    return ""


def _sides_that_run(name: str, model: nn.Module, input_shape: tuple[int, ...]) -> str:
    """What to configure instead: ``image_size >= m`` or ``image_size m`` where ``m`` is the
    smallest side torchvision declares for the model's weights (``meta['min_size']``) and it runs
    there (``>=`` when it also runs one pixel wider; the ViTs take one size only), else the
    smallest side that runs found by bisection on the meta device, else another model."""
    c, side = input_shape[0], int(input_shape[-1])
    runs = lambda s: not _forward_problem(model, (c, s, s))  # noqa: E731
    declared = _declared_min_side(name)
    if declared and declared != side and runs(declared):
        return f"image_size {'>= ' if runs(declared + 1) else ''}{declared} (field 'image_size'), or another model"
    if side < PROBE_MAX_SIDE and runs(PROBE_MAX_SIDE):
        lo, hi = side, PROBE_MAX_SIDE  # lo fails, hi runs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if runs(mid) else (mid, hi)
        return f"image_size >= {hi} (field 'image_size'), or another model"
    return "another model or image_size (field 'image_size')"


def _declared_min_side(name: str) -> int | None:
    """The smallest image side torchvision's weight sets of ``name`` declare (``meta['min_size']``)."""
    from torchvision.models import get_model_weights  # lazy: keeps torchvision out of this module's import

    try:
        sides = [int(m.meta["min_size"][0]) for m in get_model_weights(name) if "min_size" in m.meta]
    except (ValueError, KeyError, TypeError):  # a model without weight sets
        return None
    return min(sides) if sides else None
