"""What the sweep driver shows while Tune runs: the live table (:class:`LiveView`), the Tune callback
that feeds it (:class:`SweepProgress`), and whether an ended Tune loop was interrupted.

:mod:`fedtune.tune.study.sweep` imports this module only when a study runs (it imports Ray Tune).
Trial states in the table: ``done`` (ran its last round), ``running``, ``pruned``, ``failed``,
``diverged`` and ``pending``:

>>> classify("TERMINATED", {"round": 3, "status": "ok"}, rounds=3), classify("ERROR", None, rounds=3)
('done', 'failed')
>>> count_states(["done", "running", "done", "PAUSED"])["done"], count_states(["PAUSED"])["pending"]
(2, 1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ray.tune import Callback
from rich import box
from rich.live import Live

from fedtune.results import status
from fedtune.results.selection import is_finite
from fedtune.tune.common.active import ACTIVE, SESSIONS
from fedtune.tune.common.searches import StudyView, search_of

__all__ = ["LiveView", "SweepProgress", "classify", "count_states", "interrupted"]

"""A trial of the table that ran its last round (Tune: TERMINATED at the last round)."""
_STATES = (status.DONE, status.RUNNING, status.PRUNED, status.FAILED, status.DIVERGED, status.PENDING)


class LiveView:
    """The driver's live table: per search, trials done / running / pruned / failed and the
    best so far by the selection metric (with its target accuracy)."""

    def __init__(self, plan: StudyView, console: Any, live: bool):
        self.plan = plan
        self.console = console
        self.rows: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.live = None
        self.enabled = live

    def start(self) -> None:
        if not self.enabled:
            return

        self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
            if not self.console.is_terminal:
                self.console.print()  # the last frame ends without a newline off a terminal

    def row(self, key: str, total: int) -> dict[str, Any]:
        with self.lock:
            return self.rows.setdefault(key, {"total": total, "trials": {}, "state": "waiting"})

    def render(self) -> Any:
        """The table; without its vertical rules when the console is too narrow for them, so that a
        search's name and the numbers stay whole at 80 columns (log files, CI, ``ray job logs``)."""
        table = self._table(box.HEAVY_HEAD)
        width = self.console.measure(table, options=self.console.options.update_width(10**6)).maximum
        return table if width <= self.console.width else self._table(box.SIMPLE_HEAD, compact=True)

    def _table(self, table_box: Any, compact: bool = False) -> Any:
        from rich.table import Table  # lazy: keeps more of rich out of this module's import

        metric = self.plan.metrics[0]
        label = self.plan.options.protocol()
        t = Table(title=f"study {self.plan.name} — {time.time() - self.t0:.0f}s — selection: {label} "
                        f"({metric}{', ORACLE' if label == 'oracle' else ''})", box=table_box,
                  **(dict(show_edge=False, pad_edge=False, collapse_padding=True) if compact else {}))
        # "best": the best value of the selection metric (named in the title), "target": its target accuracy
        for col in ("search", "state", "done", "run", "pruned", "failed", "of", "best", "target"):
            t.add_column(col, justify="left" if col in ("search", "state") else "right", no_wrap=True)
        with self.lock:
            for key, r in self.rows.items():
                c = count_states(r["trials"].values())
                best = r.get("best")
                failed, diverged = c[status.FAILED], c[status.DIVERGED]
                t.add_row(key, r["state"], str(c[status.DONE]), str(c[status.RUNNING]), str(c[status.PRUNED]),
                          str(failed + diverged) + (f" ({diverged} div.)" if diverged else ""),
                          str(r["total"]), f"{best[0]:.4f}" if best else "—",
                          f"{best[1]:.4f}" if best and is_finite(best[1]) else "—")
        return t


def count_states(states: Iterable[str]) -> dict[str, int]:
    """How many trials are in each table state (anything else counts as pending)."""
    c = dict.fromkeys(_STATES, 0)
    for s in states:
        c[s if s in c else status.PENDING] += 1
    return c


def classify(tune_status: str, last: Mapping[str, Any] | None, rounds: int) -> str:
    """The table state of a trial from Tune's status and its last result."""
    if tune_status == status.TUNE_ERROR:
        return status.FAILED
    if tune_status == status.TUNE_TERMINATED:
        if not last:
            return status.PRUNED
        if last.get("status") == status.DIVERGED:
            return status.DIVERGED
        return status.DONE if int(last.get("round", 0) or 0) >= rounds else status.PRUNED
    return status.RUNNING if tune_status == status.TUNE_RUNNING else status.PENDING


class SweepProgress(Callback):
    """Feeds the live view and records which trials started and ended in this driver session
    (to tell an interrupted ``fit`` from a finished one), per search: ``key`` and ``total`` of
    a fit of one search, or ``totals`` (search key -> trials asked) of a fit of several, whose
    trials carry their search in their config (:func:`fedtune.tune.common.searches.search_of`). Holds
    only names, so it pickles into Tune's experiment state; the view lives in this process
    (:data:`fedtune.tune.common.active.ACTIVE`)."""

    def __init__(self, key: str, rounds: int, metric: str, mode: str, total: int,
                 totals: Mapping[str, int] | None = None):
        self.key, self.rounds = key, rounds
        self.metric, self.mode, self.total = metric, mode, total
        self.totals = dict(totals) if totals else {key: total}

    def _totals(self) -> dict[str, int]:  # an experiment pickled before ``totals`` existed has one search
        return self.__dict__.get("totals") or {self.key: self.total}

    def _key(self, trial: Any) -> str:
        return search_of(trial, self.key)

    def _session(self, key: str) -> dict[str, Any]:
        return SESSIONS.setdefault(key, {"started": set(), "ended": set(), "errored": {},
                                         "statuses": {}, "num_trials": 0})

    def _update(self, trials: list) -> None:
        view = ACTIVE["view"]
        if view is None:
            return
        totals = self._totals()
        by_key: dict[str, list] = {}
        for t in trials:
            by_key.setdefault(self._key(t), []).append(t)
        for key, mine in by_key.items():
            s = self._session(key)
            row = view.row(key, totals.get(key, self.total))
            with view.lock:
                row["state"] = status.RUNNING
                for t in mine:
                    # Tune calls on_trial_complete/_error before it changes the trial's status
                    tune_status = s["errored"].get(t.trial_id) or (
                        status.TUNE_TERMINATED if t.trial_id in s["ended"] and t.status == status.TUNE_RUNNING
                        else t.status)
                    row["trials"][t.trial_id] = classify(tune_status, t.last_result, self.rounds)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if not self.__dict__.get("_seen"):  # first step: show what a restored experiment already holds
            self._seen = True
            for t in trials:
                value = (getattr(t, "metric_analysis", None) or {}).get(self.metric, {}).get(self.mode)
                self._best(self._key(t), value, None)
            self._update(trials)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_seen"}

    def _best(self, key: str, value: Any, target: Any) -> None:
        view = ACTIVE["view"]
        if view is None or not is_finite(value):
            return
        row = view.row(key, self._totals().get(key, self.total))
        with view.lock:
            best = row.get("best")
            if best is None or (value > best[0] if self.mode == "max" else value < best[0]):
                row["best"] = (float(value), target)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._session(self._key(trial))["started"].add(trial.trial_id)
        self._update(trials)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        key = self._key(trial)
        self._session(key)["started"].add(trial.trial_id)
        self._best(key, result.get(self.metric), result.get("target_acc"))
        self._update(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._session(self._key(trial))["ended"].add(trial.trial_id)
        self._update(trials)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        s = self._session(self._key(trial))
        s["ended"].add(trial.trial_id)
        s["errored"][trial.trial_id] = status.TUNE_ERROR
        self._update(trials)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for key in self._totals():
            mine = [t for t in trials if self._key(t) == key]
            s = self._session(key)
            s["num_trials"] = len(mine)
            s["statuses"] = {t.trial_id: t.status for t in mine}


def interrupted(session: Mapping[str, Any], total: int) -> bool:
    """An ended ``fit`` was interrupted when a trial started in this session never ended, a trial
    is still pending/running, or fewer trials than asked for exist.

    >>> interrupted({"started": {"a"}, "ended": {"a"}, "statuses": {"a": "TERMINATED"}, "num_trials": 1}, 1)
    False
    """
    if session.get("started", set()) - session.get("ended", set()):
        return True
    if any(s not in status.TUNE_FINISHED for s in session.get("statuses", {}).values()):
        return True
    return session.get("num_trials", 0) < total
