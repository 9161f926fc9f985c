"""Your own model: ``model: MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``) names a factory

    def build(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module

called with the dataset's input shape (``(C, H, W)`` for images, ``(D,)`` for vectors) and its
number of classes, in every process that builds the run's model, under torch's RNG seeded from the
run's ``seed`` (so every client actor builds the same initial weights). Its module is a plugin
(:mod:`fedtune.plugins`): the run's ``plugins`` gain it, so Ray's workers import it (shipped with
Ray's ``runtime_env`` when it is not installed) and a study records its source hash.

The model goes through the checks a built-in one does before anything launches
(:mod:`fedtune.model_check`: one forward on the meta device with the dataset's input, outputs of
shape ``[N, num_classes]``, the size limit, a replaceable head where the client method needs one).
fedtune replaces or reads its *last* ``nn.Linear`` in module order as the classifier (a projector
or probabilistic head in its place, ``pretrained_path``'s classifier, the features MOON or CORAL
read), as for every model it builds. Bad input is one line naming field ``model``.
"""

from __future__ import annotations

import keyword
import sys
from typing import Any, Callable

import torch
from torch import nn

from fedtune.errors import ConfigError, clipped, shown
from fedtune.plugins import MAIN_MODULE, load_plugins, parse_entry, parse_model_factory

__all__ = ["is_factory", "resolve_factory", "build_factory_model"]


def is_factory(model: Any) -> bool:
    """Whether ``model`` names a factory (``MODULE:FUNCTION``) rather than cnn, mlp or a torchvision model.

    >>> is_factory("mypkg.nets:build"), is_factory("resnet18"), is_factory(None)
    (True, False, False)
    """
    return parse_model_factory(model) is not None


def resolve_factory(model: str) -> Callable[..., Any]:
    """The function ``model`` names, its module imported as a plugin (:func:`~fedtune.plugins.load_plugins`),
    or one :class:`~fedtune.errors.ConfigError` line naming field ``model``: a spelling that is not
    ``MODULE:FUNCTION``, a module that does not import, no such function, one that is not callable."""
    entry, function = parse_model_factory(model) or ("", "")
    if not entry or not all(part.isidentifier() and not keyword.iskeyword(part) for part in function.split(".")):
        raise ConfigError(f"field 'model': {shown(model, 80)} is not allowed; allowed: cnn, mlp, a torchvision model, "
                          "or a factory MODULE:FUNCTION (or path/to/file.py:FUNCTION)")
    if entry != MAIN_MODULE:  # a notebook's factory: runs on the local backend only (the config says so)
        load_plugins([entry], source=f"field 'model' ({shown(model, 80)})")  # a PluginError (a ConfigError) line
    target: Any = sys.modules[parse_entry(entry)[0]]
    for part in function.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"field 'model': factory {model!r}: module {parse_entry(entry)[0]!r} has no function "
                              f"{function!r}; allowed: a function build(input_shape, num_classes) -> torch.nn.Module "
                              "defined in it")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"field 'model': factory {model!r} is not callable (it is of type {type(target).__name__}); "
                          "allowed: a function build(input_shape, num_classes) -> torch.nn.Module")
    return target


def build_factory_model(model: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``build(tuple(input_shape), num_classes)`` of the factory ``model`` names (draws from torch's
    RNG as the factory does), or one ConfigError line naming field ``model``: the factory raised, or
    returned something that is not a ``torch.nn.Module``."""
    build = resolve_factory(model)
    try:
        out = build(tuple(int(v) for v in input_shape), int(num_classes))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's factory failing, in one line
        if isinstance(exc, (NotImplementedError, RuntimeError)) and _on_meta():
            raise  # the meta device: the caller builds it on the CPU instead
        raise ConfigError(f"field 'model': factory {model!r} raised {type(exc).__name__} for input_shape "
                          f"{tuple(input_shape)}, num_classes {num_classes}: {clipped(' '.join(str(exc).split()), 200)}"
                          ) from None
    if not isinstance(out, nn.Module):
        raise ConfigError(f"field 'model': factory {model!r} returned a {type(out).__name__}, not a torch.nn.Module; "
                          "allowed: a function build(input_shape, num_classes) -> torch.nn.Module")
    return out


def _on_meta() -> bool:
    """Whether tensors are made on the meta device here (the pre-launch check's ``torch.device('meta')``)."""
    return torch.empty(0).device.type == "meta"
