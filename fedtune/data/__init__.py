"""fedtune's data layer: datasets made of named domains, and federated plans over them.

Importing this package imports neither torch, sklearn nor PIL; datasets import them only when
pixels are decoded (:meth:`~fedtune.data.base.DomainDataset.load`). See
:func:`fedtune.data.registry.get_dataset` / :func:`~fedtune.data.registry.list_datasets` for the datasets
and :func:`fedtune.data.partition.make_plan` for the settings. Every name is imported from its module.
"""
