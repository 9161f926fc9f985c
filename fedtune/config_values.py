"""Values of a run config as YAML and ``--set`` give them, turned into each field's type (or one
ConfigError line naming the field): :func:`coerce`, the int64 range, the mlp's size limits and the
unknown-key message. Split from :mod:`fedtune.config` (its dataclass and validation)."""

from __future__ import annotations

import difflib
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from fedtune import yaml_safe
from fedtune.errors import ConfigError, shown

_INT64 = 1 << 63
# mlp_hidden: what a model may hold before it is built (a width of 100000 is 10**10 weights per layer).
MAX_MLP_LAYERS = 64
MAX_MLP_WIDTH = 1 << 16
MAX_MLP_WEIGHTS = 1 << 28  # between hidden layers: 1 GiB as float32, per copy of the model


def int64(name: str, value: int, given: Any = None) -> int:
    """``value``, or a ConfigError (showing ``given``, else ``value``) when it does not fit the
    int64 of the results tables and of torch."""
    if not -_INT64 <= value < _INT64:
        raise ConfigError(f"field '{name}': {shown(value if given is None else given, 40)} is out of range; allowed: an integer "
                          f"between -2**63 and 2**63 - 1")
    return value


def check_mlp_hidden(widths: list[int]) -> None:
    """``mlp_hidden``'s widths, refused before any model is built when they cannot be (a width
    below 1) or would allocate more than the limits above."""
    bad = [w for w in widths if not 1 <= w <= MAX_MLP_WIDTH]
    if bad:
        raise ConfigError(f"field 'mlp_hidden': width {shown(bad[0], 40)} is out of range; allowed: widths from 1 "
                          f"to {MAX_MLP_WIDTH}")
    if len(widths) > MAX_MLP_LAYERS:
        raise ConfigError(f"field 'mlp_hidden': {len(widths)} hidden layers; allowed: at most {MAX_MLP_LAYERS}")
    weights = sum(a * b for a, b in zip(widths, widths[1:]))
    if weights > MAX_MLP_WEIGHTS:
        raise ConfigError(f"field 'mlp_hidden': {shown(widths, 80)} holds {weights} weights between hidden layers "
                          f"({weights * 4 / 2**30:.1f} GiB as float32); allowed: at most {MAX_MLP_WEIGHTS}")


def unknown_key_message(key: str, known: list[str], source: str) -> str:
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6) if isinstance(key, str) and len(key) < 100 else []
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `fedtune fields` for all fields"
    return f"{source}: unknown field {shown(key, 80)}{hint}"


def coerce(name: str, value: Any, hint: Any) -> Any:
    """Convert YAML/CLI values to the field's type, or raise a ConfigError naming the field."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Union or (origin is not None and type(None) in args):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        inner = [a for a in args if a is not type(None)]
        hint = inner[0]
        origin = get_origin(hint)
    if value is None:
        raise ConfigError(f"field '{name}': a value is required")
    if origin is list:
        if isinstance(value, str):
            try:
                value = yaml_safe.load(value, f"field '{name}'")
            except yaml.YAMLError:
                raise ConfigError(f"field '{name}': expected a list such as [64, 64], got {shown(value)}") from None
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"field '{name}': expected a list such as [64, 64], got {shown(value)}")
        (elem,) = get_args(hint)
        return [coerce(name, v, elem) for v in value]
    if origin is Literal:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"field '{name}': expected true or false, got {shown(value)}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"field '{name}': expected an integer, got {shown(value)}")
        if isinstance(value, float) and value.is_integer():
            return int64(name, int(value))
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:  # not an integer, or more digits than int() converts
                if value.strip().lstrip("+-").isdigit():
                    int64(name, 1 << 64, value)
        if isinstance(value, int):
            return int64(name, value)
        raise ConfigError(f"field '{name}': expected an integer, got {shown(value)}")
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"field '{name}': expected a number, got {shown(value)}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"field '{name}': expected a number, got {shown(value)}") from None
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"field '{name}': expected a string, got {shown(value)}")
        return str(value)
    return value
