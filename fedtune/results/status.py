"""The status vocabulary: the words a round, a trial and a study search are recorded with.

One owner for these strings; every writer and reader imports them from here.

Round status (``rounds`` table, column ``status``):
  ``ok``; ``diverged`` on the round whose loss or weights turned NaN/Inf, or whose training loss
  exploded (over 1000 times the first round's, floored at 1: ``fedtune.runtime.coordinator.loss_exploded``).
Trial status (``trials`` table, column ``status``):
  ``running`` (written when a trial starts), ``completed`` (ran all its rounds), ``diverged``
  (its last round diverged), ``pruned`` (a scheduler stopped it early), ``failed`` (it raised, or
  a sweep's trial ran all its rounds without a value of the study's objective; ``error`` says
  which), ``interrupted`` (Ctrl-C or SIGTERM).

>>> is_finished(COMPLETED), is_finished(RUNNING)
(True, False)
>>> TRIAL_STATUSES
('running', 'completed', 'diverged', 'pruned', 'failed', 'interrupted')
"""

from __future__ import annotations

__all__ = ["OK", "DIVERGED", "ROUND_STATUSES", "RUNNING", "COMPLETED", "PRUNED", "FAILED", "INTERRUPTED",
           "TRIAL_STATUSES", "PENDING", "DONE", "SKIPPED", "SEARCH_STATUSES", "NO_METRIC", "ORPHANED", "DUPLICATE", "TUNE_TERMINATED", "TUNE_ERROR", "TUNE_RUNNING",
           "TUNE_PENDING", "TUNE_FINISHED", "is_finished"]

# rounds
OK = "ok"
DIVERGED = "diverged"
ROUND_STATUSES = (OK, DIVERGED)

# trials
RUNNING = "running"
COMPLETED = "completed"
PRUNED = "pruned"
FAILED = "failed"
INTERRUPTED = "interrupted"
TRIAL_STATUSES = (RUNNING, COMPLETED, DIVERGED, PRUNED, FAILED, INTERRUPTED)

# a search or seed run of a sweep study (study.json): PENDING, then DONE (or INTERRUPTED);
# a seed run with nothing to re-run (no selectable trial) is SKIPPED
PENDING = "pending"
DONE = "done"
SKIPPED = "skipped"
SEARCH_STATUSES = (PENDING, DONE, SKIPPED, INTERRUPTED)
# an Optuna trial that ended without a finite objective
NO_METRIC = "no_metric"
# an Optuna trial left RUNNING by a killed process, closed on resume
ORPHANED = "orphaned"
# an Optuna trial whose sampled configuration had already run in its search: told FAIL, never run
DUPLICATE = "duplicate"

# Ray Tune's own trial states, as fedtune reads them
TUNE_TERMINATED = "TERMINATED"
TUNE_ERROR = "ERROR"
TUNE_RUNNING = "RUNNING"
TUNE_PENDING = "PENDING"
TUNE_FINISHED = (TUNE_TERMINATED, TUNE_ERROR)


def is_finished(status: str) -> bool:
    """True for a trial status that will not change (everything but ``running``)."""
    return status in TRIAL_STATUSES and status != RUNNING
