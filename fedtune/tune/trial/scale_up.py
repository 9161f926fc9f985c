"""Waiting for the autoscaler: :class:`ScaleUpWatch`, the Tune callback that shows a search whose
trials wait for nodes, and stops the study when no node comes within ``--scale-up-timeout``.

A trial that fits the cluster's node types but not its alive nodes stays PENDING: its placement
group is the autoscaler's demand, and the autoscaler adds the nodes (``ray status`` shows them as
pending). While no trial of the search runs and one is pending, the live view says
``scaling up <seconds>``, and once the wait passes :data:`ANNOUNCE_AFTER_S` a plain line says so
every :data:`ANNOUNCE_EVERY_S` (what a Ray Job's log shows: it has no live table). The line
speaks of the autoscaler only where the cluster has one (:func:`has_autoscaler`); on a laptop's
Ray it says that something else holds the resources, and on a Ray fedtune started for the study
(nothing else runs there: a trial waits only for the trials before it or its own actors) it says
nothing. After
``timeout_s`` the watch raises :class:`ScaleUpTimeout`, naming what the trials wait for, instead of letting the study hang (a node type that cannot launch: no quota,
no spot capacity, a wrong image).

>>> class T:  # a Tune trial, as far as the watch looks at it
...     def __init__(self, status): self.status, self.placement_group_factory = status, None
>>> w = ScaleUpWatch("fedavg", timeout_s=10.0, clock=iter([0.0, 4.0, 11.0]).__next__)
>>> w.on_step_begin(0, [T("PENDING")]); w.waiting_s
0.0
>>> w.on_step_begin(1, [T("PENDING")]); w.waiting_s
4.0
>>> w.on_step_begin(2, [T("PENDING")])
Traceback (most recent call last):
...
fedtune.tune.trial.scale_up.ScaleUpTimeout: search 'fedavg': no trial could start for 11 s (--scale-up-timeout 10 s): ...
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from fedtune.errors import ResourceError
from fedtune.results import status
from fedtune.tune.common.active import ACTIVE
from fedtune.tune.common.ray_lost import RayLost, ray_gone
from fedtune.tune.common.searches import search_of

__all__ = ["ANNOUNCE_AFTER_S", "ANNOUNCE_EVERY_S", "ScaleUpTimeout", "ScaleUpWatch", "has_autoscaler", "own_ray"]

ANNOUNCE_AFTER_S = 10.0  # shorter waits are a trial handing over its slot, not the autoscaler
ANNOUNCE_EVERY_S = 60.0


class ScaleUpTimeout(ResourceError):
    """Trials waited longer than ``--scale-up-timeout`` for nodes the autoscaler did not add."""


class ScaleUpWatch(Callback):
    """Show and bound the time a search's trials wait for nodes (see the module docstring)."""

    def __init__(self, key: str, timeout_s: float, clock: Callable[[], float] | None = None):
        self.key, self.timeout_s = key, float(timeout_s)
        self._clock = clock
        self._since: float | None = None
        self._announced = -1e18
        self.waiting_s = 0.0
        self._shown = key

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks into its experiment state
        return {"key": self.key, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["key"], state["timeout_s"])

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        pending = [t for t in trials if t.status == status.TUNE_PENDING]
        if not pending or any(t.status == status.TUNE_RUNNING for t in trials):
            if self._since is not None:
                self._show(None, self._shown)
            self._since, self.waiting_s, self._announced = None, 0.0, -1e18
            return
        now = self._now()
        if self._clock is None:  # trials wait for a Ray that is gone: say so now, not after the timeout

            if ray_gone():
                raise RayLost("Ray went away: no node of the cluster is alive (its raylet was killed, the machine "
                              "ran out of memory, or the head node was lost); finished trials are kept")
        if self._since is None:
            self._since = now
        self.waiting_s = now - self._since
        key = search_of(pending[0], self.key)  # a fit of several searches: the waiting trial's
        self._show(self.waiting_s, key)
        # On a Ray fedtune started for this study nothing else holds resources: a trial waits only for
        # the trials before it to hand theirs over, or for its actors to start; no line blames "something else".
        if self.waiting_s >= ANNOUNCE_AFTER_S and now - self._announced >= ANNOUNCE_EVERY_S and not own_ray():
            self._announced = now
            if has_autoscaler():
                why = (f"waiting for the autoscaler ({self.waiting_s:.0f} s of at most {self.timeout_s:g} s, "
                       "--scale-up-timeout; `ray status` shows pending nodes)")
            else:
                why = (f"something else on this Ray holds them (another Ray job or its actors; `ray status`), and "
                       f"it has no autoscaler to add a node: waiting for them to be freed ({self.waiting_s:.0f} s "
                       f"of at most {self.timeout_s:g} s, --scale-up-timeout)")
            self._say(f"search '{key}': {len(pending)} trial(s) wait for {_wanted(pending[0])}, which no "
                      f"node has free: {why}")
        if self.waiting_s > self.timeout_s:
            if has_autoscaler():
                why = ("the cluster neither has it free nor added a node that holds it; `ray status` shows the "
                       "autoscaler's pending and failed nodes (quota, spot capacity, node image)")
            elif own_ray():
                why = ("nothing freed it on the local Ray fedtune started for this study (no other job runs "
                       "there); `ray status` shows what holds the resources")
            else:
                why = ("nothing freed it, and this Ray has no autoscaler to add a node; `ray status` shows what "
                       "holds the resources")
            raise ScaleUpTimeout(
                f"search '{key}': no trial could start for {self.waiting_s:.0f} s (--scale-up-timeout "
                f"{self.timeout_s:g} s): {len(pending)} trial(s) wait for {_wanted(pending[0])} and {why}. "
                "Finished trials are kept: continue with fedtune sweep --resume")

    def _say(self, text: str) -> None:
        view = ACTIVE.get("view")
        if view is not None:
            view.console.print(f"[yellow]{text}[/yellow]", soft_wrap=True)

    def _show(self, waiting_s: float | None, key: str) -> None:
        self._shown = key
        view = ACTIVE.get("view")
        if view is None or key not in view.rows:
            return
        with view.lock:
            view.rows[key]["state"] = status.RUNNING if waiting_s is None else f"scaling up {waiting_s:.0f}s"


def has_autoscaler() -> bool:
    """Whether the running study's cluster has an autoscaler (what :func:`~fedtune.runtime.cluster.cluster_view`
    found when the study started; assumed when unknown, e.g. a Tuner run outside ``fedtune sweep``)."""
    return ACTIVE.get("autoscaler", True) is not False


def own_ray() -> bool:
    """Whether the running study's Ray is one fedtune started for it (``fedtune sweep`` without
    ``--address``), so no other job holds its resources; False when unknown."""
    return ACTIVE.get("own_ray") is True


def _wanted(trial: Any) -> str:
    """The resources one pending trial asks for, e.g. ``2 CPU, 1 GPU``."""
    pgf = getattr(trial, "placement_group_factory", None)
    total: dict[str, float] = {}
    for bundle in getattr(pgf, "bundles", None) or []:
        for k, v in bundle.items():
            total[k] = total.get(k, 0.0) + float(v)
    return ", ".join(f"{v:g} {k}" for k, v in sorted(total.items()) if v) or "its resources"
