"""The columns of the results tables: their types, their meaning, and the identity columns.

A round row (``rounds/<trial_id>.parquet``) has the core columns of :data:`ROUND_CORE_SCHEMA`
plus open-ended extra columns (``val_acc.<domain>``, ``target_acc.<domain>``, ``test_acc``,
``hp.<name>``, ``diag.<name>``, ...) whose types are inferred per file
(:func:`fedtune.results.arrow.rows_to_table`). A trial row (``trials.parquet``) has the core
columns of :data:`TRIAL_CORE_SCHEMA` plus the trial's ``hp.<name>`` columns. Both tables start
with the :data:`IDENTITY_COLUMNS`, which say what a row is *of* (never a measurement).

>>> IDENTITY_COLUMNS == tuple(ROUND_CORE_SCHEMA.names[:9]) == tuple(TRIAL_CORE_SCHEMA.names[:9])
True
>>> sorted(TABLES)
['rounds', 'trials']
"""

from __future__ import annotations

import pyarrow as pa

from fedtune.results import status as st
from fedtune.results.study_dir import ROUNDS_DIR, TRIALS_FILE

__all__ = ["TIMESTAMP", "IDENTITY_COLUMNS", "ROUND_CORE_SCHEMA", "TRIAL_CORE_SCHEMA", "ROUND_COLUMN_DOCS",
           "TRIAL_COLUMN_DOCS", "TABLES", "REQUIRED_COLUMNS", "JSON_PREFIXES", "schema_markdown"]

TIMESTAMP = pa.timestamp("us", tz="UTC")

# (name, type, meaning). Every column is nullable: a column missing from a row is null.
_IDENTITY: list[tuple[str, pa.DataType, str]] = [
    ("study", pa.string(), "Study name (directory under the output dir)."),
    ("trial_id", pa.string(), "Trial identifier, unique within the study."),
    ("algorithm", pa.string(), "Federated algorithm, e.g. `fedavg`."),
    ("client_method", pa.string(), "Local (client-side) training method."),
    ("server_rule", pa.string(), "Server aggregation rule."),
    ("dataset", pa.string(), "Dataset name."),
    ("setting", pa.string(), "Experimental setting, e.g. `fdg` or `fl`."),
    ("target_domain", pa.string(), "Held-out target domain; null when there is none."),
    ("seed", pa.int64(), "Random seed of the trial."),
]

IDENTITY_COLUMNS: tuple[str, ...] = tuple(n for n, _, _ in _IDENTITY)
"""The columns that say what a row is of (study, trial, algorithm and its parts, data, seed), in
schema order: the first columns of both tables; every other column is a measurement or a setting."""

_ROUND_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    *_IDENTITY,
    ("round", pa.int64(), "Communication round index."),
    ("train_loss", pa.float64(), "Mean client training loss of the round (NaN if diverged)."),
    ("val_acc", pa.float64(), "Validation accuracy on the *source* clients' validation splits (selection protocol `val`)."),
    ("target_acc", pa.float64(), "The reported accuracy: on the held-out target domain minus its oracle slice (and, in fda, the target client's labelled sample; in ufdg, the probe split); in fl, on all clients' test splits. Never used to choose anything."),
    ("target_val_acc", pa.float64(), "fda only: accuracy on the target client's validation split (`val_fraction` of its labelled sample; selection protocol `target-val`); never part of `val_acc`."),
    ("oracle_acc", pa.float64(), "Accuracy on the oracle slice (`oracle_fraction` of the target domain, stratified, fixed by `data_seed`; never part of `target_acc`), for selection protocol `oracle`; null in fl."),
    ("wall_s", pa.float64(), "Wall-clock seconds of the round, from its fit being sent (a round run ahead is sent before the previous round's row is written: docs/methods.md §0.1)."),
    ("client_s", pa.float64(), "Wall seconds of the round's fit phase (broadcast, client training on all actors, updates back)."),
    ("server_s", pa.float64(), "Seconds spent in server aggregation during the round."),
    ("status", pa.string(), f"Round status: `{st.OK}`, or `{st.DIVERGED}` on the round whose loss or weights turned NaN/Inf or whose loss exploded (over 1000 times the first round's, floored at 1)."),
    ("num_participants", pa.int64(), "Clients that took part in the round."),
    ("skipped_clients", pa.int64(), "Sampled clients that were skipped (failed, straggled)."),
    ("bytes_moved", pa.int64(), "Float32 weight bytes of the round's model exchange: one broadcast read by each actor plus one state per participant (what a streamed round moves; a folded round sends one float64 sum per actor in place of the states)."),
    ("attempt", pa.int64(), "Sweeps: 0 for a round of the trial's first run, n for one run after its n-th restart (`--max-failures`: a lost node, an error); a restarted trial continues from its last checkpoint and its rows replace those of the rounds it runs again."),
]

_TRIAL_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    *_IDENTITY,
    ("status", pa.string(), f"Trial status: `{st.COMPLETED}`, `{st.DIVERGED}` (NaN/Inf loss or weights, or an exploded loss), `{st.FAILED}` (an error; see `error`), `{st.INTERRUPTED}` (Ctrl-C or SIGTERM); sweeps add `{st.PRUNED}`."),
    ("rounds_done", pa.int64(), "Number of rounds recorded."),
    ("final_val_acc", pa.float64(), "`val_acc` of the last round that has one."),
    ("final_target_acc", pa.float64(), "`target_acc` of the last round that has one."),
    ("best_val_acc", pa.float64(), "Highest finite `val_acc` over the rounds (the trial's score under selection `val`)."),
    ("best_round", pa.int64(), "Round with the highest `val_acc` (earliest on ties): the reported round under `val`."),
    ("target_acc_at_best_val", pa.float64(), "`target_acc` at `best_round`: honest, validation-selected target accuracy."),
    ("best_target_val_acc", pa.float64(), "fda: highest finite `target_val_acc` (the trial's score under selection `target-val`)."),
    ("target_val_round", pa.int64(), "fda: round with the highest `target_val_acc` (earliest on ties): the reported round under `target-val`."),
    ("target_acc_at_best_target_val", pa.float64(), "fda: `target_acc` at `target_val_round`."),
    ("id_test_acc_at_best_val", pa.float64(), "split_scheme: `id_test_acc` at `best_round` (the ID-validation-selected ID test accuracy, Bai et al.'s `best_id_val_acc`)."),
    ("best_ood_val_acc", pa.float64(), "split_scheme: highest finite `ood_val_acc` (the trial's score under selection `ood-val`)."),
    ("ood_val_round", pa.int64(), "split_scheme: round with the highest `ood_val_acc` (earliest on ties): the reported round under `ood-val`."),
    ("target_acc_at_best_ood_val", pa.float64(), "split_scheme: `target_acc` at `ood_val_round`."),
    ("final_oracle_acc", pa.float64(), "`oracle_acc` of the last evaluated round (the trial's score under selection `oracle`, which reports `final_target_acc`); null for a diverged trial."),
    ("total_wall_s", pa.float64(), "`ended_at - started_at` in seconds, else the sum of the rounds' `wall_s`."),
    ("restarts", pa.int64(), "Sweeps: how many times Ray Tune restarted the trial after a failure (`--max-failures`; e.g. its node was preempted)."),
    ("started_at", TIMESTAMP, "When the trial started (UTC)."),
    ("ended_at", TIMESTAMP, "When the trial ended (UTC)."),
    ("error", pa.string(), "Error message of a failed trial; null otherwise."),
    ("config_json", pa.string(), "The trial's full configuration as sorted JSON."),
]

ROUND_CORE_SCHEMA: pa.Schema = pa.schema([pa.field(n, t) for n, t, _ in _ROUND_COLUMNS])
"""Required columns of a round row, in order (all nullable)."""

TRIAL_CORE_SCHEMA: pa.Schema = pa.schema([pa.field(n, t) for n, t, _ in _TRIAL_COLUMNS])
"""Required columns of a ``trials.parquet`` row, in order (all nullable)."""

ROUND_COLUMN_DOCS: dict[str, str] = {n: d for n, _, d in _ROUND_COLUMNS}
TRIAL_COLUMN_DOCS: dict[str, str] = {n: d for n, _, d in _TRIAL_COLUMNS}

TABLES: dict[str, pa.Schema] = {"rounds": ROUND_CORE_SCHEMA, "trials": TRIAL_CORE_SCHEMA}
"""Table names accepted by :func:`fedtune.results.store.load`, with their core schemas."""

REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "rounds": (*IDENTITY_COLUMNS, "round"),
    "trials": (*IDENTITY_COLUMNS, "status", "rounds_done"),
}
"""The columns a file must have to be read as that table: those every version of fedtune has
written (its first schema had them all, and every core column is written, null or not), so files of
older versions load, and a Parquet file of anything else is refused
(:class:`fedtune.results.arrow.ForeignResultsError`). ``round`` tells a round file from a trial
file, ``rounds_done`` a trial file from a round file. Their types are the core schema's (any
integer width for int64, any string type for string; an all-null column of any type)."""

JSON_PREFIXES = ("hp.",)
"""Extra-column prefixes whose list/dict values are always stored as JSON strings."""


def schema_markdown() -> str:
    """A Markdown description of the core round and trial columns, for docs/results.md.

    >>> print(schema_markdown().splitlines()[4])
    | `study` | string | Study name (directory under the output dir). |
    """

    def table(cols: list[tuple[str, pa.DataType, str]]) -> list[str]:
        lines = ["| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{n}` | {t} | {d} |" for n, t, d in cols]
        return lines

    parts = [
        f"### Round rows (`<study>/{ROUNDS_DIR}/<trial_id>.parquet`)",
        "",
        *table(_ROUND_COLUMNS),
        "",
        "Extra columns follow the core ones, sorted by name, with inferred types: "
        "`val_acc.<domain>`, `target_acc.<domain>`, `test_acc`, ... (float64); with a split file "
        "(`split_scheme`) `ood_val_acc`, `ood_val_loss`, `id_test_acc`, `id_test_loss`, `id_test_worst_acc`, "
        "`target_worst_acc` (the lowest per-domain accuracy), WILDS' macro-F1 `val_macro_f1`, `ood_val_macro_f1`, "
        "`target_macro_f1`, `id_test_macro_f1`, and their `.<domain>` columns (per-domain columns for "
        "sets of at most 16 domains); "
        "`hp.<name>` (one per hyperparameter: int64, float64, bool or string; "
        "lists and dicts as JSON strings); `diag.<name>` (float64 or list<float64>). "
        "A column mixing ints and floats is float64; one mixing strings with other values "
        "is string. NaN/Inf are stored as such.",
        "",
        f"### Trial rows (`<study>/{TRIALS_FILE}`, one per `trial_id`)",
        "",
        *table(_TRIAL_COLUMNS),
        "",
        "Trial rows also carry the trial's `hp.<name>` columns and, for a FedEx run (`fedex_configs`), its last "
        "round's `fedex_json` (the knobs, configurations and final distribution; a round-row column too).",
    ]
    return "\n".join(parts) + "\n"
