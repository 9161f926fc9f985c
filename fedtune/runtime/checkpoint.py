"""The checkpoint of a federated run: what :meth:`~fedtune.runtime.driver.FederatedRun.get_state`
returns, written to a directory and read back. Plain NumPy and JSON files: no pickle is ever loaded.

A checkpoint directory holds ``weights.npy`` (the global weights, float32), ``arrays.npz`` (every
array of the server rule's, the client method's server side's and the clients' state) and
``fedtune_state.json`` (the round, the rule, server-side and client state trees with their
arrays referenced by key, and ``meta``). A checkpoint written before server sides had state trees
may hold its server side's one array in a file of its own (:data:`LEGACY_SIDE_FILE`); it is read
back as that side's state. Each file is written atomically
(:func:`fedtune.results.atomic.atomic_write`), ``fedtune_state.json`` last. Server-rule and client
state must consist of arrays, tensors, numbers, strings, lists, tuples and dicts; anything else
(e.g. a live ``nn.Module``) fails the checkpoint with a TypeError naming where it sits.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from fedtune.errors import ConfigError, clipped
from fedtune.results.atomic import atomic_write, atomic_write_text

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

__all__ = ["CHECKPOINT_FORMAT", "STATE_FILE", "WEIGHTS_FILE", "LEGACY_SIDE_FILE", "ARRAYS_FILE", "IDENTITY_FIELDS",
           "DamagedCheckpoint", "check_identity", "newest_readable_checkpoint", "read_checkpoint", "run_identity",
           "write_checkpoint"]

CHECKPOINT_FORMAT = 1
STATE_FILE = "fedtune_state.json"
WEIGHTS_FILE = "weights.npy"
LEGACY_SIDE_FILE = ("global_move.npy", "global_move")
"""(file, state key): a server side's state as one array, as checkpoints held it before server sides
had state trees; read back as ``side = {key: array}``."""
ARRAYS_FILE = "arrays.npz"
_MARKERS = ("__array__", "__items__", "__tuple__")


IDENTITY_FIELDS = ("algorithm", "client_method", "server_rule", "server_optimizer")
"""What a checkpoint records of the run that wrote it (``identity`` in ``fedtune_state.json``, with the
keys of its server-rule and server-side state): it restores only into a run with the same."""


def run_identity(cfg: FederatedRunConfig, rule_state: Mapping[str, Any], side_state: Mapping[str, Any] | None,
                 server_optimizer: str) -> dict[str, Any]:
    """The ``identity`` of a checkpoint of the run of ``cfg`` (:data:`IDENTITY_FIELDS`, and the keys of
    its server rule's and client method's server-side state; ``side_keys`` None: no server side)."""
    resolved = cfg.resolved
    return {"algorithm": cfg.algorithm, "client_method": resolved.client_method_name,
            "server_rule": resolved.server_rule_name, "server_optimizer": server_optimizer,
            "rule_keys": sorted(map(str, rule_state)),
            "side_keys": None if side_state is None else sorted(map(str, side_state))}


def _described(identity: Mapping[str, Any]) -> str:
    known = [f"{f.replace('_', ' ')} {identity[f]}" for f in IDENTITY_FIELDS[1:] if identity.get(f) is not None]
    keys = f"server-rule state {identity.get('rule_keys') or []}, server side's state {identity.get('side_keys')}"
    return ", ".join([*known, keys])


def check_identity(state: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    """Refuse, in one ConfigError line naming both, to restore the checkpoint ``state`` into a run
    whose :func:`run_identity` is ``own``: another algorithm, client method, server rule or server
    optimiser, or server-rule or server-side state with other keys. A checkpoint written before
    checkpoints recorded their identity is compared by its state's keys.

    >>> own = {"algorithm": "a", "client_method": "m", "server_rule": "r",
    ...        "server_optimizer": "sgd", "rule_keys": [], "side_keys": ["h"]}
    >>> check_identity({"identity": dict(own, algorithm="b", client_method="n",
    ...                 side_keys=["c"])}, own)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: checkpoint of algorithm b (client method n, ...) cannot be restored ...
    """
    saved = state.get("identity")
    if not isinstance(saved, Mapping):  # an older checkpoint: what its state shows
        side = state.get("side")
        saved = {"rule_keys": sorted(map(str, state.get("rule") or {})),
                 "side_keys": None if side is None else sorted(map(str, side))}
    fields = [f for f in (*IDENTITY_FIELDS, "rule_keys", "side_keys") if f in saved]
    words = {"rule_keys": "server-rule state keys", "side_keys": "server side's state keys"}
    differ = [words.get(f, f.replace("_", " ")) for f in fields if saved.get(f) != own.get(f)]
    if differ:
        raise ConfigError(f"checkpoint of {_name(saved)} ({_described(saved)}) cannot be restored into this run of "
                          f"{_name(own)} ({_described(own)}): its {', '.join(differ)} differ; allowed: a checkpoint "
                          "written by a run of the same algorithm, client method, server rule and server optimizer")


def _name(identity: Mapping[str, Any]) -> str:
    return f"algorithm {identity['algorithm']}" if identity.get("algorithm") else "an earlier fedtune version"


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """A JSON-able tree of ``value`` with NumPy arrays moved to ``arrays`` (referenced by key)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"checkpoint: {where} is an object array, which cannot be stored without pickle")
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and k not in _MARKERS for k in value):
            return {k: _encode(v, arrays, f"{where}.{k}") for k, v in value.items()}
        return {"__items__": [[_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")]
                              for k, v in value.items()]}
    raise TypeError(f"checkpoint: cannot store {type(value).__name__} at {where}; server-rule and client state "
                    "must hold NumPy arrays, tensors, numbers, strings, lists, tuples and dicts")


def _decode(tree: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    if isinstance(tree, dict):
        if set(tree) == {"__array__"}:
            return np.array(arrays[tree["__array__"]])
        if set(tree) == {"__tuple__"}:
            return tuple(_decode(v, arrays) for v in tree["__tuple__"])
        if set(tree) == {"__items__"}:
            return {_decode(k, arrays): _decode(v, arrays) for k, v in tree["__items__"]}
        return {k: _decode(v, arrays) for k, v in tree.items()}
    return tree


def _write_binary(path: Path, save: Callable[[BinaryIO], Any]) -> None:
    """:func:`atomic_write` of a file ``save`` writes to an open binary file (NumPy would add a
    suffix to the temporary file's name)."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            save(f)

    atomic_write(path, write)


def write_checkpoint(directory: str | os.PathLike[str], state: Mapping[str, Any],
                     meta: Mapping[str, Any] | None = None) -> Path:
    """Write :meth:`FederatedRun.get_state`'s output to ``directory``: ``weights.npy`` (float32),
    ``arrays.npz`` (the arrays of the rule, server-side and client state) and
    ``fedtune_state.json`` (round, rule, server-side and client state trees, ``meta``).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> state = {"round": 2, "weights": np.ones(3, np.float32), "side": {"move": np.zeros(3, np.float32)},
    ...          "rule": {"momentum": np.zeros(3), "steps": 2}, "clients": {0: {"seen": (1, 2)}}}
    >>> _ = write_checkpoint(d, state)
    >>> back = read_checkpoint(d)
    >>> back["round"], back["rule"]["steps"], back["clients"], back["weights"].dtype, back["side"]["move"].shape
    (2, 2, {0: {'seen': (1, 2)}}, dtype('float32'), (3,))
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    doc = {
        "format": CHECKPOINT_FORMAT, "round": int(state["round"]),
        "rule": _encode(state.get("rule") or {}, arrays, "rule"),
        "side": _encode(state.get("side"), arrays, "side"),
        "optimizer": _encode(state.get("optimizer"), arrays, "optimizer"),
        "tuner": _encode(state.get("tuner"), arrays, "tuner"),  # an in-run tuner's, else None
        "first_loss": state.get("first_loss"),  # round 1's training loss (the explosion check's scale)
        "clients": _encode(state.get("clients") or {}, arrays, "clients"),
        "meta": _encode(dict(meta or {}), arrays, "meta"),
        "identity": _encode(state.get("identity"), arrays, "identity"),
    }
    weights = np.asarray(state["weights"], dtype=np.float32)
    _write_binary(directory / WEIGHTS_FILE, lambda f: np.save(f, weights))
    _write_binary(directory / ARRAYS_FILE, lambda f: np.savez(f, **arrays))
    atomic_write_text(directory / STATE_FILE, json.dumps(doc))  # last: the checkpoint is complete
    return directory


class DamagedCheckpoint(ValueError):
    """A checkpoint directory whose files cannot be read back (truncated, overwritten, missing: a
    process killed while the disk wrote them, a full disk). The message names the directory and the
    file."""


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read :func:`write_checkpoint`'s files back into a state dict (arrays loaded without pickle).
    A checkpoint of another format is a ValueError; one whose files cannot be read is a
    :class:`DamagedCheckpoint` naming the file."""
    directory = Path(directory)
    path = directory / STATE_FILE
    if not path.is_file():
        raise DamagedCheckpoint(f"checkpoint '{directory}' is damaged: it has no {STATE_FILE} (not a fedtune "
                                "checkpoint, or one whose writing did not finish)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # JSONDecodeError, undecodable bytes: truncated or overwritten
        raise DamagedCheckpoint(f"checkpoint '{directory}' is damaged: {STATE_FILE} cannot be read "
                                f"({type(exc).__name__}: {clipped(str(exc), 120)})") from None
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise ValueError(f"checkpoint '{directory}' has format {found}, this fedtune reads {CHECKPOINT_FORMAT}")
    where = ARRAYS_FILE
    try:
        with np.load(directory / ARRAYS_FILE, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        legacy_file, legacy_key = LEGACY_SIDE_FILE
        side = _decode(doc.get("side"), arrays)
        if side is None and (directory / legacy_file).is_file():
            where = legacy_file
            side = {legacy_key: np.load(directory / legacy_file, allow_pickle=False)}
        where = WEIGHTS_FILE
        weights = np.load(directory / WEIGHTS_FILE, allow_pickle=False)
        where = STATE_FILE
        return {
            "round": int(doc["round"]),
            "weights": weights,
            "rule": _decode(doc["rule"], arrays),
            "side": side,
            "optimizer": _decode(doc.get("optimizer"), arrays),
            "tuner": _decode(doc.get("tuner"), arrays),
            "first_loss": doc.get("first_loss"),
            "clients": _decode(doc["clients"], arrays),
            "meta": _decode(doc["meta"], arrays),
            "identity": _decode(doc.get("identity"), arrays),
        }
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise DamagedCheckpoint(f"checkpoint '{directory}' is damaged: {where} cannot be read "
                                f"({type(exc).__name__}: {clipped(str(exc), 120)})") from None


def newest_readable_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, Path | None,
                                                                            list[str]]:
    """``directory``'s checkpoint or, when it is damaged (:class:`DamagedCheckpoint`), the newest
    readable one of the older checkpoints beside it (named like it, with a smaller number: Ray Tune's
    ``checkpoint_000004``, ``checkpoint_000002``, ...). Returns (state, the directory read, one line
    per damaged checkpoint); (None, None, lines) when none can be read: the run starts again from
    round 1.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> state = {"round": 2, "weights": np.ones(3, np.float32)}
    >>> _ = write_checkpoint(d / "checkpoint_000002", state)
    >>> _ = write_checkpoint(d / "checkpoint_000004", dict(state, round=4))
    >>> _ = (d / "checkpoint_000004" / STATE_FILE).write_text('{"format": 1, "rou')
    >>> back, read, damaged = newest_readable_checkpoint(d / "checkpoint_000004")
    >>> back["round"], read.name, len(damaged)
    (2, 'checkpoint_000002', 1)
    """
    directory = Path(directory)
    damaged: list[str] = []
    for candidate in [directory, *_older_siblings(directory)]:
        try:
            return read_checkpoint(candidate), candidate, damaged
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
    return None, None, damaged


def _older_siblings(directory: Path) -> list[Path]:
    """The checkpoints beside ``directory`` with its name's stem and a smaller number, newest first."""
    m = re.fullmatch(r"(.*?)(\d+)", directory.name)
    if m is None or not directory.parent.is_dir():
        return []
    stem, number = m.group(1), int(m.group(2))
    older = []
    for p in directory.parent.iterdir():
        n = re.fullmatch(re.escape(stem) + r"(\d+)", p.name)
        if n is not None and int(n.group(1)) < number and p.is_dir():
            older.append((int(n.group(1)), p))
    return [p for _, p in sorted(older, reverse=True)]
