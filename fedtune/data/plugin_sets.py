"""A plugin's dataset (:class:`~fedtune.data.registry.DatasetSpec`) built and checked like the built-ins.

``build(root=, image_size=, data_seed=)`` runs in every process that opens the dataset; what it
returns is checked here, each problem one :class:`~fedtune.errors.DataError` line naming the dataset
and the plugin, so a plugin's mistake stops the run before any actor starts (the driver builds it
first): a value that is not a :class:`~fedtune.data.base.DomainDataset`, an ``info`` of another
name or without domains, a ``default_setting`` fedtune does not have, a factory as
``default_model`` (name it in the run's ``model`` field), images of another side than the run's
``image_size`` (or an ``image_size`` for a dataset of vectors), ``image_files`` declared and not a
:class:`~fedtune.data.folder.CachedImageDataset` or the other way round, ``split_schemes`` declared
without a ``split_pieces``. A dataset of image files then uses the run's image cache fields.
"""

from __future__ import annotations

import os
from typing import Any

from fedtune.errors import ConfigError, DataError, clipped, shown

from .base import DatasetInfo, DomainDataset
from .folder import CachedImageDataset
from .partition import SETTINGS

__all__ = ["build_plugin_dataset"]


def build_plugin_dataset(spec: Any, owner: str, *, root: str | os.PathLike | None, image_size: int | None,
                         data_seed: int, cache: tuple[Any, str, float]) -> DomainDataset:
    """``spec.build(root=root, image_size=image_size, data_seed=data_seed)``, checked (module
    docstring); a dataset of image files is given the run's ``cache`` (``cache_dir``,
    ``cache_key``, ``cache_wait_s``)."""
    where = f"dataset {spec.name!r} ({owner})"
    try:
        dataset = spec.build(root=root, image_size=image_size, data_seed=data_seed)
    except (DataError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - the plugin's own failure, in one line
        raise DataError(f"{where}: build raised {type(exc).__name__}: {clipped(' '.join(str(exc).split()), 200)}"
                        ) from None
    if not isinstance(dataset, DomainDataset):
        raise DataError(f"{where}: build returned a {type(dataset).__name__}, not a fedtune.DomainDataset")
    _check_info(getattr(dataset, "info", None), spec, where)
    _check_images(dataset, spec, image_size, where)
    if spec.split_schemes and not callable(getattr(dataset, "split_pieces", None)):
        raise DataError(f"{where}: declares split_schemes {', '.join(spec.split_schemes)} but its dataset has no "
                        "split_pieces(scheme) method; allowed: split_schemes=() or a split_pieces method")
    if spec.image_files:
        dataset.use_cache(*cache)
    return dataset


def _check_info(info: Any, spec: Any, where: str) -> None:
    if not isinstance(info, DatasetInfo):
        raise DataError(f"{where}: its dataset's info is a {type(info).__name__}, not a fedtune.DatasetInfo")
    if info.name != spec.name:
        raise DataError(f"{where}: its dataset's info.name is {shown(info.name, 60)}; allowed: {spec.name!r}, the "
                        "name it is registered under (the image cache and the results know it by that name)")
    if not info.domains or len(set(info.domains)) != len(info.domains) or \
            not all(isinstance(d, str) and d for d in info.domains):
        raise DataError(f"{where}: info.domains {shown(info.domains, 80)} is not allowed; allowed: one or more "
                        "distinct domain names (strings)")
    if info.default_setting not in SETTINGS:
        raise DataError(f"{where}: info.default_setting {shown(info.default_setting, 40)} is not allowed; allowed: "
                        f"{', '.join(SETTINGS)}")
    if not isinstance(info.default_model, str) or ":" in info.default_model:
        raise DataError(f"{where}: info.default_model {shown(info.default_model, 60)} is not allowed; allowed: cnn, "
                        "mlp or a torchvision model (name your own factory in the run's field 'model')")


def _check_images(dataset: DomainDataset, spec: Any, image_size: int | None, where: str) -> None:
    shape = tuple(dataset.info.input_shape)
    cached = isinstance(dataset, CachedImageDataset)
    if spec.image_files != cached:
        raise DataError(f"{where}: declares image_files={spec.image_files} but build returned a "
                        f"{type(dataset).__name__}; allowed: image_files=True with a fedtune.CachedImageDataset "
                        "(images decoded into the image cache), image_files=False with any other DomainDataset")
    if image_size is None:
        return
    if len(shape) != 3:
        raise DataError(f"image_size does not apply to {where}, whose examples are vectors of shape {shape}; "
                        "leave it unset")
    if shape[1:] != (image_size, image_size):
        raise DataError(f"{where} gives images of shape {shape} for image_size {image_size}; allowed: image_size "
                        f"unset, or {shape[1]} if the dataset has that fixed size (its build must resize to image_size)")
