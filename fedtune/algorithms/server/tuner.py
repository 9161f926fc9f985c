"""What the coordinator asks of an in-run tuner (FedEx: :mod:`fedtune.algorithms.server.fedex`),
declared by an :class:`~fedtune.algorithms.base.InRunTunerSpec` in
:mod:`fedtune.algorithms.tuner_declarations` and built by
:meth:`fedtune.algorithms.Resolved.in_run_tuner`. The coordinator knows no tuner by name: each
round it adds :meth:`InRunTuner.payload` to the broadcast, hands every client reply's extras to
:meth:`InRunTuner.take` (which removes the tuner's own), and after the round's aggregation records
:meth:`InRunTuner.end_round` (as ``diag.<key>``) and :meth:`InRunTuner.columns`; the tuner's
:meth:`InRunTuner.state_dict` is part of the run's checkpoint. Its client half is a
:class:`~fedtune.algorithms.client.hooks.ClientHook` the spec names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedtune.algorithms.base import RunConfig


class InRunTuner:
    """The coordinator's half of an in-run tuner. A subclass carries its registry ``name``."""

    name: str = ""

    @classmethod
    def from_config(cls, cfg: RunConfig) -> InRunTuner:
        """The tuner of a run with ``cfg`` (validated, the tuner on)."""
        raise NotImplementedError

    def payload(self, round: int, participants: Sequence[int], num_clients: int) -> dict[str, Any]:  # noqa: A002
        """What the round's broadcast carries for the participants' hooks (arrays by key)."""
        raise NotImplementedError

    def take(self, extras: dict[str, Any]) -> None:
        """Take (and remove) this tuner's entries from one client reply's ``extras``."""
        raise NotImplementedError

    def end_round(self) -> dict[str, Any]:
        """The round's update from what it took; returns the round's ``diag.*`` values (by key)."""
        raise NotImplementedError

    def columns(self) -> dict[str, Any]:
        """Round-row columns of its own (those its spec declares in ``columns``)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a checkpoint's state; a state of another configuration is a ValueError, raised
        before anything changes."""
        raise NotImplementedError


__all__ = ["InRunTuner"]
