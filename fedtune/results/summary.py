"""A trial's summary row (``trials.parquet``) from its round rows: :func:`summarize_trial`.

The reported round and score of each selection protocol come from
:func:`fedtune.results.selection.choose_round`, so a trial row says what ``fedtune report``
would report for that trial alone.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedtune.algorithms.tuner_declarations import IN_RUN_TUNER_SPECS
from fedtune.results import selection
from fedtune.results.arrow import is_number, to_json, to_timestamp
from fedtune.results.schema import IDENTITY_COLUMNS

__all__ = ["CARRIED_COLUMNS", "summarize_trial"]

CARRIED_COLUMNS = (*(c for spec in IN_RUN_TUNER_SPECS for c in spec.columns), "pbt_history")
"""Round-row columns a trial row repeats from its last round that has one: an in-run tuner's
(its spec's ``columns``: FedEx's final distribution ``fedex_json``), a PBT/PB2 member's
mutation history (:mod:`fedtune.tune.trial.population`)."""


def _finite(v: Any) -> bool:
    return is_number(v) and math.isfinite(float(v))


def _by_round(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows ordered by ``round`` (duplicates: the last one wins), rows without one at the end."""
    by_round: dict[Any, Mapping[str, Any]] = {}
    unnumbered: list[Mapping[str, Any]] = []
    for r in rows:
        if r.get("round") is None:
            unnumbered.append(r)
        else:
            by_round[int(r["round"])] = r
    return [by_round[k] for k in sorted(by_round)] + unnumbered


def summarize_trial(
    rows: Sequence[Mapping[str, Any]],
    *,
    config: Mapping[str, Any],
    status: str,
    error: str | None,
    started_at: _dt.datetime | float | str | None,
    ended_at: _dt.datetime | float | str | None,
) -> dict[str, Any]:
    """Build the ``trials.parquet`` row of a trial from its round rows (which may be empty).

    Identity columns (study, trial_id, algorithm, ...) come from the last round row, else
    from ``config``. Rows are ordered by ``round`` (duplicates: the last one wins). The
    reported round and score of each selection protocol come from
    :func:`fedtune.results.selection.choose_round`: ``best_round`` / ``best_val_acc`` /
    ``target_acc_at_best_val`` (``val``: the highest finite ``val_acc``, earliest on ties, and
    the target accuracy *at that round*), ``target_val_round`` / ``best_target_val_acc`` /
    ``target_acc_at_best_target_val`` (``target-val``, fda), ``id_test_acc_at_best_val`` (a split file's
    ID test accuracy at ``best_round``: Bai et al.'s ID number), ``ood_val_round`` / ``best_ood_val_acc`` /
    ``target_acc_at_best_ood_val`` (``ood-val``, a split file's) and ``final_oracle_acc``
    (``oracle``: the last evaluated round). ``final_*`` are the values of the last round that
    has one (NaN included, so a diverged trial ends in NaN).
    ``hp.*`` columns of the rows (and ``hp.*`` keys or an ``hp`` dict of ``config``) are
    copied over; ``config_json`` is ``config`` as sorted JSON.

    >>> rows = [{"round": 0, "val_acc": 0.5, "target_acc": 0.4},
    ...         {"round": 1, "val_acc": 0.7, "target_acc": 0.3},
    ...         {"round": 2, "val_acc": 0.6, "target_acc": 0.9}]
    >>> s = summarize_trial(rows, config={"trial_id": "t"}, status="ok", error=None,
    ...                     started_at=0.0, ended_at=12.5)
    >>> s["best_round"], s["target_acc_at_best_val"], s["final_target_acc"], s["total_wall_s"]
    (1, 0.3, 0.9, 12.5)
    """
    ordered = _by_round(rows)
    out = _identity(ordered, config)
    out.update(status=status, rounds_done=len(ordered), **_reported(ordered))
    start, end = to_timestamp(started_at, "started_at"), to_timestamp(ended_at, "ended_at")
    out.update(
        total_wall_s=_total_wall_s(ordered, start, end),
        started_at=start,
        ended_at=end,
        error=error,
        restarts=None,  # sweeps: set by the Tune callback (fedtune.tune.trial.callback)
        config_json=to_json(dict(config)),
    )
    out.update(_hparams(ordered, config))
    for name in CARRIED_COLUMNS:  # the last round's record of an in-run tuner
        value = next((r[name] for r in reversed(ordered) if r.get(name) is not None), None)
        if value is not None:
            out[name] = value
    return out


def _identity(ordered: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity columns (study, trial_id, algorithm, ...): the last round row's, else ``config``'s."""
    out: dict[str, Any] = {}
    for name in IDENTITY_COLUMNS:
        value = None
        for r in reversed(ordered):
            if r.get(name) is not None:
                value = r[name]
                break
        out[name] = value if value is not None else config.get(name)
    return out


def _reported(ordered: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``final_*`` values and, per selection protocol, the reported round and score
    (:func:`fedtune.results.selection.choose_round`)."""
    def last(col: str) -> Any:
        for r in reversed(ordered):
            if r.get(col) is not None:
                return float(r[col])
        return None

    val = selection.choose_round(ordered, "val")
    tval = selection.choose_round(ordered, "target-val")
    ood = selection.choose_round(ordered, "ood-val")
    oracle = selection.choose_round(ordered, "oracle")

    def score(c: selection.Choice, v: float) -> float | None:
        return None if c.round is None or math.isnan(v) else v

    return dict(
        final_val_acc=last("val_acc"),
        final_target_acc=last("target_acc"),
        best_val_acc=score(val, val.score),
        best_round=val.round,
        target_acc_at_best_val=score(val, val.target_acc),
        best_target_val_acc=score(tval, tval.score),
        target_val_round=tval.round,
        target_acc_at_best_target_val=score(tval, tval.target_acc),
        id_test_acc_at_best_val=_at(ordered, val.round, "id_test_acc"),
        best_ood_val_acc=score(ood, ood.score),
        ood_val_round=ood.round,
        target_acc_at_best_ood_val=score(ood, ood.target_acc),
        final_oracle_acc=score(oracle, oracle.score),
    )


def _at(ordered: Sequence[Mapping[str, Any]], rnd: int | None, col: str) -> float | None:
    """``col`` of round ``rnd`` (None when that round has no value, or there is no round)."""
    for r in ordered:
        if rnd is not None and r.get("round") == rnd and r.get(col) is not None:
            return float(r[col])
    return None


def _total_wall_s(ordered: Sequence[Mapping[str, Any]], start: _dt.datetime | None,
                  end: _dt.datetime | None) -> float | None:
    """``ended_at - started_at`` in seconds when both are known, else the sum of the rows' ``wall_s``."""
    if start is not None and end is not None:
        return (end - start).total_seconds()
    walls = [float(r["wall_s"]) for r in ordered if _finite(r.get("wall_s"))]
    return float(sum(walls)) if walls else None


def _hparams(ordered: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``hp.*`` columns: ``config``'s ``hp`` dict and ``hp.*`` keys, then the rows' (later wins)."""
    hps: dict[str, Any] = {}
    if isinstance(config.get("hp"), Mapping):
        hps.update({f"hp.{k}": v for k, v in config["hp"].items()})
    hps.update({k: v for k, v in config.items() if isinstance(k, str) and k.startswith("hp.")})
    for r in ordered:
        hps.update({k: v for k, v in r.items() if k.startswith("hp.") and v is not None})
    return hps
