"""fedtune's data layer: datasets made of named domains, and federated plans over them.

Importing this package imports neither torch, sklearn nor PIL; datasets import them only when
pixels are decoded (:meth:`~fedtune.data.base.DomainDataset.load`). See
:func:`fedtune.data.registry.get_dataset` / :func:`~fedtune.data.registry.list_datasets` for the datasets
and :func:`fedtune.data.partition.make_plan` for the settings. Every name is imported from its module;
a name this package exported before the house-keeping of issue 18 (``fedtune.data.get_dataset``) raises
one line naming its home (:mod:`fedtune.old_names`).
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A name this package exported before issue 18 raises one line naming its new spelling."""
    raise old_name_error(__name__, name)
