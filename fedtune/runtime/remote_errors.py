"""fedtune's bad-input errors raised inside a Ray actor, given back as themselves.

A :class:`~fedtune.errors.ConfigError` or :class:`~fedtune.errors.DataError` raised in a client
actor or the coordinator actor reaches the caller wrapped by Ray (a ``RayTaskError``, or an
``ActorDiedError`` when the actor's ``__init__`` raised). :func:`input_error_of` finds the
original error, so it is re-raised as itself: one line (exit 2 in the CLI), as on the local backend.

>>> from fedtune.errors import DataError
>>> input_error_of(RuntimeError("The actor died.\\nfedtune.errors.DataError: image 3 is not a PNG"))
DataError('image 3 is not a PNG')
>>> input_error_of(RuntimeError("out of memory")) is None
True
"""

from __future__ import annotations

from typing import Any

from fedtune.errors import INPUT_ERRORS

# fedtune's bad-input errors (fedtune.errors.INPUT_ERRORS), by the name Ray prints in a remote traceback.
_INPUT_ERRORS = {f"{cls.__module__}.{cls.__qualname__}": cls for cls in INPUT_ERRORS}


def input_error_of(exc: BaseException) -> BaseException | None:
    """The fedtune ConfigError/DataError behind a Ray error, or None.

    A ``RayTaskError`` (a method raised) carries the original exception as ``cause`` (walked
    through nested actors). An ``ActorDiedError`` from a failed ``__init__`` carries only the
    creation task's traceback as text (Ray keeps no cause object): its last line
    ``fedtune.errors.DataError: <message>`` is parsed and the error rebuilt with that message.
    """
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        seen += 1
        if type(e) in INPUT_ERRORS:
            return e
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException) and cause is not e:
            e = cause
            continue
        break
    text = str(exc)
    best: tuple[int, str, str] | None = None
    for qualname in _INPUT_ERRORS:
        i = text.rfind(qualname + ": ")
        if i >= 0 and (best is None or i > best[0]):
            best = (i, qualname, text[i + len(qualname) + 2:])
    if best is None:
        return None
    message = best[2].strip().split("\n\nThe above exception", 1)[0].strip()
    return _INPUT_ERRORS[best[1]](message)


def ray_get(ref: Any) -> Any:
    """``ray.get`` that re-raises a fedtune ConfigError/DataError raised inside an actor as itself
    (one line, exit 2 in the CLI, as on the local backend) instead of Ray's wrapper traceback."""
    # lazy: keeps ray out of this module's import
    import ray
    from ray.exceptions import RayError

    try:
        return ray.get(ref)
    except RayError as exc:
        err = input_error_of(exc)
        if err is not None:
            raise err from None
        raise
