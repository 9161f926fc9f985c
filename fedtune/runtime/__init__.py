"""The federated runtime: client workers/actors (:mod:`~fedtune.runtime.worker`), the coordinator
(:mod:`~fedtune.runtime.coordinator`) and its pools (:mod:`~fedtune.runtime.pools`), and the run driver
(:mod:`~fedtune.runtime.driver`: :func:`~fedtune.runtime.driver.run`). Every name is imported from its module;
a name this package exported before the house-keeping of issue 18 (``fedtune.runtime.FederatedRun``)
raises one line naming its home (:mod:`fedtune.old_names`)."""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A name this package exported before issue 18 raises one line naming its new spelling."""
    raise old_name_error(__name__, name)
