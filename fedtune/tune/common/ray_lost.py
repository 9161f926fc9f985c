"""When the Ray a sweep runs on goes away (its raylet killed, the machine out of memory, the head
node lost): one line instead of Ray's stack traces, and a study that ``--resume`` continues with
Optuna and the Arrow store in agreement.

A trial whose actor dies because the node died is not a failed trial: it did nothing wrong and
would have finished. So when a trial errors while no node of the cluster is alive
(:func:`ray_gone`), fedtune's Optuna searcher raises :class:`RayLost` *before* telling Optuna
anything and before Tune marks the trial ERROR or the Arrow callback writes its row. Tune's fit
then ends; its last experiment snapshot holds the trial as running, so ``--resume`` runs it again
(from its last checkpoint, else round 1; the Arrow store keeps each round once), and the Optuna
trial, still RUNNING, is told its real result then. A trial lost with only *some* nodes (a
preempted worker on a cluster whose head lives) is the ordinary failure path: ``--max-failures``
restarts it. :func:`fedtune.tune.study.search_fit.fit_stop` says which of the reasons that end a
study mid-search (Ray gone, a write the disk refused) stopped a search's fit.
"""

from __future__ import annotations

import logging

from fedtune.errors import ResourceError

__all__ = ["RayLost", "TrialLogFilter", "ray_gone", "ray_lost_in"]


class RayLost(ResourceError):
    """The Ray cluster of a running study has no alive node left (or cannot be reached)."""


def ray_gone() -> bool:
    """True when the connected Ray cluster has no alive node, or its control store cannot be asked
    (both mean every actor of every trial is gone). False when Ray is not initialised here."""
    import ray  # lazy: keeps ray out of this module's import

    if not ray.is_initialized():
        return False
    if _own_processes_died():
        return True
    try:
        return not any(node.get("Alive") for node in ray.nodes())
    except Exception:  # noqa: BLE001 - the GCS itself is unreachable
        return True


def _own_processes_died() -> bool:
    """Whether a raylet or GCS server that this process started (a local Ray: ``fedtune sweep`` on a
    laptop) has exited. Asked first because it is immediate: the GCS marks a dead node dead only
    after its health checks fail, seconds later."""
    try:
        from ray._private import worker  # lazy: keeps ray out of this module's import

        node = getattr(worker, "_global_node", None)
        processes = getattr(node, "all_processes", None) or {}
        for kind in ("raylet", "gcs_server"):
            for info in processes.get(kind, []):
                proc = getattr(info, "process", None)
                if proc is not None and proc.poll() is not None:
                    return True
    except Exception:  # noqa: BLE001 - Ray's private layout changed: fall back to asking the GCS
        return False
    return False


class TrialLogFilter(logging.Filter):
    """Drops Tune's "Trial task failed" stack trace of a trial whose node died while Ray is gone
    (:class:`RayLost` says it in one line instead); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.getMessage()).startswith("Trial task failed"):
            return True
        return not ray_gone()


def ray_lost_in(exc: BaseException) -> BaseException | None:
    """The :class:`RayLost` in ``exc``'s chain (Tune may wrap it), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, RayLost):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
