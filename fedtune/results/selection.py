"""Model selection: the one place that says which round of a trial is reported and which trial
of a search is selected (as DomainBed's ``model_selection.py``; docs/methods-protocol.md §5).

Every consumer goes through this module: ``trials.parquet`` (:func:`fedtune.results.summary.summarize_trial`),
``fedtune report`` (:mod:`fedtune.reports.report`), the objective a sweep tells Optuna
(:func:`objective_values`) and the configuration ``--seeds`` re-runs.

Protocols (:data:`PROTOCOLS`):

``val`` (default; training-domain validation)
    Score of a round: ``val_acc``, the accuracy on the *source* clients' validation splits.
    Reported round: the one with the highest finite ``val_acc`` (earliest on ties). The target
    domain never chooses anything.
``target-val`` (setting ``fda`` only)
    The FDA target client holds out ``val_fraction`` of its labelled sample; the runtime scores
    it as ``target_val_acc`` (never part of ``val_acc``). Reported round: the highest finite
    ``target_val_acc``. Legitimate in FDA: those labels belong to the target client.
``ood-val`` (a split file's OOD validation; WILDS' and Bai et al.'s ``val`` split)
    A run with ``split_scheme`` (:mod:`fedtune.data.split_file`) holds out whole validation
    domain(s) that neither train nor test; the runtime scores them as ``ood_val_acc``. Reported
    round: the highest finite ``ood_val_acc``. Honest: no target example chooses anything. (Under
    a split scheme ``val`` is the file's ID validation split, ``id_val``.)
``val-f1`` / ``ood-val-f1`` (a split file's, by WILDS' macro-F1)
    As ``val`` / ``ood-val`` with a split file, but a round's score is the macro-F1 of the same
    examples (``val_macro_f1``: ID validation; ``ood_val_macro_f1``: OOD validation): Bai et al.'s
    selection on iWildCam, whose key metric is F1. What is reported stays ``target_acc`` (the
    rows also hold ``target_macro_f1``).
``oracle`` (DomainBed's test-domain validation; *not* an honest result)
    A fixed slice of the target domain (``oracle_fraction``, stratified, determined by
    ``data_seed`` only) is held out of the reported target set in every run, whatever the
    protocol, and scored as ``oracle_acc``. Reported round: the *last* round (no early stopping
    by the target). Undefined in setting ``fl`` (no held-out domain: its ``target_acc`` is the
    clients' own test splits), so refused there.

Whatever the protocol, what a trial reports is ``target_acc`` (the target domain minus the
oracle slice, minus the FDA target client's sample or the ufdg probe) at the reported round; a
trial's *score* is the protocol metric at that round, and in every group (algorithm, target
domain, seed) the trial with the highest score is selected (ties: the first trial id in sorted
order). A trial without a finite score is not selectable.

>>> rows = [{"round": 1, "val_acc": 0.5, "target_acc": 0.4, "oracle_acc": 0.3},
...         {"round": 2, "val_acc": 0.7, "target_acc": 0.2, "oracle_acc": 0.1},
...         {"round": 3, "val_acc": 0.6, "target_acc": 0.9, "oracle_acc": 0.8}]
>>> choose_round(rows, "val")
Choice(round=2, score=0.7, target_acc=0.2)
>>> choose_round(rows, "oracle")
Choice(round=3, score=0.8, target_acc=0.9)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from fedtune.errors import ConfigError
from fedtune.results.status import DIVERGED

__all__ = [
    "PROTOCOLS", "DEFAULT", "F1", "SCORE", "LOSS", "LABELS", "SPLIT_ROWS", "Choice", "check_protocol",
    "check_split_rows", "choose_round",
    "is_finite", "objective", "objective_values", "protocol_of_metric", "select", "variance_note",
]

PROTOCOLS: tuple[str, ...] = ("val", "target-val", "ood-val", "val-f1", "ood-val-f1", "oracle")
"""The selection protocols, honest first."""

DEFAULT = "val"

SCORE: dict[str, str] = {"val": "val_acc", "target-val": "target_val_acc", "ood-val": "ood_val_acc",
                         "val-f1": "val_macro_f1", "ood-val-f1": "ood_val_macro_f1", "oracle": "oracle_acc"}
"""The round column each protocol chooses by."""

LOSS: dict[str, str] = {"val": "val_loss", "target-val": "target_val_loss", "ood-val": "ood_val_loss",
                        "val-f1": "val_loss", "ood-val-f1": "ood_val_loss", "oracle": "oracle_loss"}
"""The loss on the same examples (a sweep may minimise it instead)."""

LABELS: dict[str, str] = {
    "val": "selection by source validation accuracy (training-domain validation)",
    "target-val": "selection by the FDA target client's validation accuracy (target-val)",
    "ood-val": "selection by OOD validation accuracy (the split file's held-out validation domain)",
    "val-f1": "selection by ID validation macro-F1 (the split file's id_val split)",
    "ood-val-f1": "selection by OOD validation macro-F1 (the split file's held-out validation domain)",
    "oracle": "ORACLE selection by a held-out target slice, last round (test-domain validation; not an honest result)",
}
"""Words for titles: what chose the reported round and the trial."""

F1: tuple[str, ...] = ("val-f1", "ood-val-f1")
"""Protocols that choose by macro-F1 (a split file's runs only)."""

LAST_ROUND = frozenset({"oracle"})
"""Protocols that report the last round (DomainBed's oracle) instead of the best one."""


class Choice(NamedTuple):
    """A trial's reported round, its score (the protocol metric there) and its ``target_acc``."""

    round: int | None
    score: float
    target_acc: float


SPLIT_ROWS: dict[str, str] = {"val": "id_val", "val-f1": "id_val", "ood-val": "val", "ood-val-f1": "val"}
"""Under a split file (``split_scheme``), the rows whose accuracy each protocol selects by: ``val`` and
``val-f1`` the file's ID validation (``id_val``), ``ood-val`` and ``ood-val-f1`` its OOD validation (``val``)."""


def check_split_rows(protocol: str, split_scheme: str | None, rows: Mapping[str, int], where: str,
                     field: str = "selection") -> None:
    """Refuse a protocol whose validation rows the split file lacks: ``rows`` counts the examples of
    its ``id_val`` and ``val`` splits. WILDS' CelebA, for one, has no ``id_val`` rows under its official
    scheme: selecting by ``val`` there would find no ``val_acc`` in any round, and every trial would
    have nothing to be chosen by.

    >>> check_split_rows("val", "official", {"id_val": 0, "val": 12}, "dataset 'celeba'", "option '--selection':")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--selection': 'val' selects by val_acc, measured on the split file's 'id_val' rows (ID validation), but split scheme 'official' of dataset 'celeba' has none (its validation rows: 'val', 12); allowed: ood-val, ood-val-f1
    """
    need = SPLIT_ROWS.get(protocol)
    if split_scheme is None or need is None or rows.get(need, 0) > 0:
        return
    allowed = [p for p, s in SPLIT_ROWS.items() if rows.get(s, 0) > 0]
    held = ", ".join(f"'{s}', {n}" for s, n in rows.items() if n > 0) or "none"
    what = "ID validation" if need == "id_val" else "OOD validation"
    raise ConfigError(f"{field} {protocol!r} selects by {SCORE[protocol]}, measured on the split file's {need!r} "
                      f"rows ({what}), but split scheme {split_scheme!r} of {where} has none (its validation rows: "
                      f"{held}); allowed: {', '.join(allowed) or 'none: the split file needs id_val or val rows'}")


def check_protocol(protocol: Any, setting: str | None = None, *, oracle_fraction: float | None = None,
                   val_fraction: float | None = None, split_scheme: str | None = None,
                   field: str = "selection") -> str:
    """``protocol`` if it is allowed (in ``setting`` when given, with ``split_scheme`` when the runs
    read one), else a ConfigError naming the allowed values.

    >>> check_protocol("target-val", "fdg")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: selection 'target-val' needs setting fda (the target client's held-out labels); setting 'fdg' allows: val, oracle
    >>> check_protocol("ood-val", "fdg", split_scheme="official")
    'ood-val'
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{field} {protocol!r} is not allowed; allowed: {', '.join(PROTOCOLS)}")
    if setting is None:
        return protocol
    allowed = allowed_in(setting, split_scheme)
    if protocol == "target-val" and setting != "fda":
        raise ConfigError(f"{field} 'target-val' needs setting fda (the target client's held-out labels); "
                          f"setting '{setting}' allows: {', '.join(allowed)}")
    if protocol == "ood-val" and split_scheme is None:
        raise ConfigError(f"{field} 'ood-val' needs an OOD validation domain, which only a split file gives (field "
                          f"'split_scheme', whose 'val' rows are held out as ood_val_acc); setting '{setting}' without "
                          f"one allows: {', '.join(allowed)}")
    if protocol in F1 and split_scheme is None:
        raise ConfigError(f"{field} {protocol!r} selects by macro-F1, which the runs record only with a split file "
                          f"(field 'split_scheme'); setting '{setting}' without one allows: {', '.join(allowed)}")
    if protocol == "oracle" and split_scheme is not None:
        raise ConfigError(f"{field} 'oracle': split_scheme {split_scheme!r} takes its test split from the file, with no "
                          f"oracle slice; allowed: {', '.join(allowed)}")
    if protocol == "oracle" and setting == "fl":
        raise ConfigError(f"{field} 'oracle' needs a held-out target domain; setting 'fl' has none (its "
                          f"target_acc is the clients' own test splits); allowed: {', '.join(allowed)}")
    if (protocol in ("val", "target-val") and split_scheme is None and val_fraction is not None
            and not val_fraction > 0):
        held = "each source client's" if protocol == "val" else "the target client's"
        raise ConfigError(f"{field} {protocol!r} selects by {held} validation hold-out, but field 'val_fraction' "
                          f"is 0 (no hold-out: nothing would be selectable); allowed: val_fraction in (0, 0.9], "
                          f"or a selection that does not use it ({', '.join(p for p in allowed if p != protocol)})")
    if protocol == "oracle" and oracle_fraction is not None and not oracle_fraction > 0:
        raise ConfigError(f"{field} 'oracle' needs an oracle slice of the target domain, but field "
                          "'oracle_fraction' is 0; allowed: oracle_fraction in (0, 1)")
    return protocol


def allowed_in(setting: str, split_scheme: str | None = None) -> tuple[str, ...]:
    """The protocols a setting supports (with a split file: its ID and OOD validation splits).

    >>> allowed_in("fda"), allowed_in("fl"), allowed_in("fdg", "official")
    (('val', 'target-val', 'oracle'), ('val',), ('val', 'ood-val', 'val-f1', 'ood-val-f1'))
    """
    if split_scheme is not None:
        return ("val", "ood-val", *F1)
    if setting == "fl":
        return ("val",)
    return ("val", "target-val", "oracle") if setting == "fda" else ("val", "oracle")


def protocol_of_metric(metric: str) -> str | None:
    """The protocol whose score or loss ``metric`` is; None for any other metric.

    >>> protocol_of_metric("target_val_loss"), protocol_of_metric("target_acc")
    ('target-val', None)
    """
    for p in PROTOCOLS:
        if metric in (SCORE[p], LOSS[p]):
            return p
    return None


def is_finite(v: Any) -> bool:
    """True for a real, finite number (or a string of one); False for None, bools, NaN, inf, text."""
    try:
        return v is not None and not isinstance(v, bool) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _float(v: Any) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def choose_round(rows: Sequence[Mapping[str, Any]], protocol: str) -> Choice:
    """The reported round of one trial from its round rows (in round order).

    ``val`` / ``target-val``: the round with the highest finite score (earliest on ties; NaN
    ignored). ``oracle``: the last evaluated round (the last finite ``oracle_acc``; rounds
    without evaluation, ``eval_every``, have none), and nothing for a trial that diverged (a row
    with status ``diverged``: there is no last model). No finite score: ``Choice(None, nan, nan)``.

    >>> choose_round([{"round": 1, "val_acc": float("nan")}], "val")
    Choice(round=None, score=nan, target_acc=nan)
    """
    check_protocol(protocol)
    col = SCORE[protocol]
    best: Mapping[str, Any] | None = None
    if protocol in LAST_ROUND:
        # the last evaluated round; a trial that diverged has no last model to report
        if not any(r.get("status") == DIVERGED for r in rows):
            last = [r for r in rows if is_finite(r.get(col))]
            best = last[-1] if last else None
    else:
        for r in rows:
            v = r.get(col)
            if is_finite(v) and (best is None or float(v) > float(best[col])):
                best = r
    if best is None:
        return Choice(None, math.nan, math.nan)
    rnd = best.get("round")
    return Choice(None if rnd is None else int(rnd), float(best[col]), _float(best.get("target_acc")))


def select(candidates: Iterable[tuple[str, float]]) -> str | None:
    """The selected trial among ``(trial_id, score)`` pairs: the highest finite score, ties to
    the first trial id in sorted order; None when no score is finite.

    >>> select([("b", 0.5), ("a", 0.5), ("c", float("nan"))])
    'a'
    """
    best: tuple[str, float] | None = None
    for tid, score in sorted(candidates, key=lambda c: str(c[0])):
        if is_finite(score) and (best is None or float(score) > best[1]):
            best = (tid, float(score))
    return None if best is None else best[0]


def objective(values_by_round: Mapping[int, float], metric: str, mode: str) -> float | None:
    """The objective a sweep tells Optuna for ``metric`` from its per-round values: a cost
    (``*_s``, ``bytes_moved``) is the mean over rounds; an oracle metric the value of the last
    round (DomainBed's oracle: last round only); any other accuracy/loss the best (``max``/``min``
    by ``mode``) over rounds, the value of the round :func:`choose_round` reports. None when no
    value is finite (for the oracle: when the last round's is not).

    >>> objective({1: 0.2, 2: 0.6, 3: 0.5}, "val_acc", "max"), objective({1: 0.2, 2: 0.6, 3: 0.5}, "oracle_acc", "max")
    (0.6, 0.5)
    """
    ordered = [values_by_round[k] for k in sorted(values_by_round)]
    if protocol_of_metric(metric) in LAST_ROUND:
        return float(ordered[-1]) if ordered and is_finite(ordered[-1]) else None
    vals = [float(v) for v in ordered if is_finite(v)]
    if not vals:
        return None
    if metric.endswith("_s") or metric == "bytes_moved":
        return sum(vals) / len(vals)
    return max(vals) if mode == "max" else min(vals)


def variance_note(kind: str | None, k: int) -> str:
    """What a table's ± is over: ``trial-seeds`` (K whole searches: DomainBed's, includes the
    luck of the search), ``seeds`` (K re-runs of one selected configuration) or plain seeds.

    >>> variance_note("seeds", 3)
    '± over 3 re-runs of the selected configuration; excludes selection variance'
    """
    if kind == "trial-seeds":
        return f"± over {k} independent searches (includes selection variance)"
    if kind == "seeds":
        return f"± over {k} re-runs of the selected configuration; excludes selection variance"
    return f"± standard error over {k} seed(s)"


def objective_values(per_round: Mapping[int, Mapping[str, float]], metrics: Sequence[str],
                     modes: Sequence[str]) -> list[float] | None:
    """A trial's objective values from its per-round metrics, :func:`objective`
    per metric: the value at the round the protocol reports (best over rounds, max/min by mode;
    the last round for ``oracle_*``), the mean of a ``*_s``/``bytes_moved`` cost; None when a
    metric has no value.

    >>> objective_values({1: {"val_acc": 0.5, "server_s": 0.2}, 2: {"val_acc": 0.4, "server_s": 0.4}},
    ...                  ["val_acc", "server_s"], ["max", "min"])
    [0.5, 0.30000000000000004]
    """
    out = []
    for m, mode in zip(metrics, modes):
        value = objective({r: v.get(m, math.nan) for r, v in per_round.items()}, m, mode)
        if value is None:
            return None
        out.append(value)
    return out
