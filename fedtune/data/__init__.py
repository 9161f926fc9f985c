"""fedtune's data layer: datasets made of named domains, and federated plans over them.

Importing this package imports neither torch, sklearn nor PIL; datasets import them only when
pixels are decoded (:meth:`DomainDataset.load`). See :func:`get_dataset` / :func:`list_datasets`
for the datasets and :func:`make_plan` for the settings.
"""

from .base import ClientSpec, DataError, DatasetInfo, DomainDataset, FederatedPlan, Pieces
from .partition import SETTINGS, make_plan, sample_participants
from .registry import DatasetEntry, dataset_info, get_dataset, list_datasets

__all__ = [
    "DatasetInfo",
    "DomainDataset",
    "ClientSpec",
    "FederatedPlan",
    "DataError",
    "Pieces",
    "DatasetEntry",
    "get_dataset",
    "list_datasets",
    "dataset_info",
    "make_plan",
    "sample_participants",
    "SETTINGS",
]
