"""The checkpoint of a federated run: what :meth:`~fedtune.runtime.driver.FederatedRun.get_state`
returns, written to a directory and read back. Plain NumPy and JSON files: no pickle is ever loaded.

A checkpoint directory holds ``weights.npy`` (the global weights, float32), ``arrays.npz`` (every
array of the server rule's, the client method's server side's and the clients' state) and
``fedtune_state.json`` (the round, the rule, server-side and client state trees with their
arrays referenced by key, and ``meta``). A checkpoint written before server sides existed may
hold FedGaLA's last global move in ``global_move.npy``; it is read back as ``global_move`` (the
coordinator hands it to FedGaLA's server side). Each file is written atomically
(:func:`fedtune.results.atomic.atomic_write`), ``fedtune_state.json`` last. Server-rule and client
state must consist of arrays, tensors, numbers, strings, lists, tuples and dicts; anything else
(e.g. a live ``nn.Module``) fails the checkpoint with a TypeError naming where it sits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedtune.results.atomic import atomic_write, atomic_write_text

__all__ = ["CHECKPOINT_FORMAT", "STATE_FILE", "WEIGHTS_FILE", "MOVE_FILE", "ARRAYS_FILE", "read_checkpoint",
           "write_checkpoint"]

CHECKPOINT_FORMAT = 1
STATE_FILE = "fedtune_state.json"
WEIGHTS_FILE = "weights.npy"
MOVE_FILE = "global_move.npy"
ARRAYS_FILE = "arrays.npz"
_MARKERS = ("__array__", "__items__", "__tuple__")


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
        "clients": _encode(state.get("clients") or {}, arrays, "clients"),
        "meta": _encode(dict(meta or {}), arrays, "meta"),
    }
    weights = np.asarray(state["weights"], dtype=np.float32)
    _write_binary(directory / WEIGHTS_FILE, lambda f: np.save(f, weights))
    _write_binary(directory / ARRAYS_FILE, lambda f: np.savez(f, **arrays))
    atomic_write_text(directory / STATE_FILE, json.dumps(doc))  # last: the checkpoint is complete
    return directory


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read :func:`write_checkpoint`'s files back into a state dict (arrays loaded without pickle)."""
    directory = Path(directory)
    path = directory / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"'{directory}' is not a fedtune checkpoint (no {STATE_FILE})")
    doc = json.loads(path.read_text())
    if doc.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint '{directory}' has format {doc.get('format')}, this fedtune reads {CHECKPOINT_FORMAT}")
    with np.load(directory / ARRAYS_FILE, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    move = directory / MOVE_FILE
    return {
        "round": int(doc["round"]),
        "weights": np.load(directory / WEIGHTS_FILE, allow_pickle=False),
        "global_move": np.load(move, allow_pickle=False) if move.is_file() else None,
        "rule": _decode(doc["rule"], arrays),
        "side": _decode(doc.get("side"), arrays),
        "optimizer": _decode(doc.get("optimizer"), arrays),
        "clients": _decode(doc["clients"], arrays),
        "meta": _decode(doc["meta"], arrays),
    }
