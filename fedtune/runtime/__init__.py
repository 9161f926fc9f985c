"""The federated runtime: client workers/actors (:mod:`~fedtune.runtime.worker`), the coordinator
(:mod:`~fedtune.runtime.coordinator`) and its pools (:mod:`~fedtune.runtime.pools`), and the run driver
(:mod:`~fedtune.runtime.driver`: :func:`~fedtune.runtime.driver.run`). Every name is imported from its module."""
