"""The ``--optuna-storage URL`` of a sweep: the forms it takes, its early check, and how it is shown.

By default a study's Optuna studies live in ``<study>/optuna.db`` (SQLite, on the driver's
disk). ``--optuna-storage`` puts them in a team's shared storage instead; the Optuna study names
stay ``<study>/<search key>``, so one storage holds many fedtune studies. Two families of URL:

* a database URL that Optuna's ``RDBStorage`` (SQLAlchemy) accepts: ``sqlite:///PATH``,
  ``postgresql://USER@HOST/DB``, ``mysql+pymysql://USER@HOST/DB``, ... A relative SQLite path is
  made absolute (``--resume`` from another directory finds the same file); in-memory SQLite is
  refused (it dies with the driver, so nothing could be resumed or reported);
* ``journal:///ABSOLUTE/PATH.log``: Optuna's ``JournalStorage`` on a ``JournalFileBackend`` (an
  append-only log that works on NFS, where SQLite's locking does not).

Everything here is checked before Ray starts, without connecting to a database (the sweep opens
the storage once before the first trial; :func:`fedtune.tune.tuner.optuna_search.optuna_storage`).
No Optuna import. It sits with the study's files because the sweep (:mod:`fedtune.tune`) and the
report (:mod:`fedtune.reports`) both read a study's Optuna storage URL.

>>> check_optuna_storage("journal:///tmp//optuna.log")
'journal:///tmp/optuna.log'
>>> journal_path("journal:///tmp/team/optuna.log"), journal_path("sqlite:////tmp/x.db")
('/tmp/team/optuna.log', None)
>>> shown("postgresql://ana:secret@db.lab/optuna")
'postgresql://ana:***@db.lab/optuna'
"""

from __future__ import annotations

import os
from pathlib import Path

from fedtune.errors import ConfigError

__all__ = ["ALLOWED", "JOURNAL_PREFIX", "check_optuna_storage", "journal_path", "shown"]

JOURNAL_PREFIX = "journal://"

ALLOWED = ("sqlite:///PATH, postgresql://USER@HOST/DB, mysql+pymysql://USER@HOST/DB (any database URL "
           "Optuna's RDBStorage accepts), or journal:///ABSOLUTE/PATH.log (Optuna's JournalStorage on a file)")
"""The allowed forms, as every error says them."""


def _error(url: str, why: str) -> ConfigError:
    return ConfigError(f"option '--optuna-storage': '{shown(url)}' {why}; allowed: {ALLOWED}")


def journal_path(url: str) -> str | None:
    """The log file of a ``journal:///PATH`` URL (None for any other URL)."""
    return url[len(JOURNAL_PREFIX):] if url.startswith(JOURNAL_PREFIX) else None


def shown(url: str) -> str:
    """``url`` as it may be printed: a database password replaced by ``***``."""
    if url.startswith(JOURNAL_PREFIX) or "@" not in url:
        return url
    try:
        # lazy: keeps sqlalchemy out of this module's import
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 -- not a URL at all: hide what could be a password
        return url.split("://", 1)[0] + "://***" if "://" in url else "***"


def _existing_parent(url: str, path: Path) -> None:
    if not path.parent.is_dir():
        raise _error(url, f"names a file in '{path.parent}', which is not a directory (create it first)")


def check_optuna_storage(url: str) -> str:
    """Check ``url`` (see the module docstring) and return it normalised (a relative SQLite path
    made absolute); raise ConfigError naming ``--optuna-storage`` and the allowed forms.

    >>> check_optuna_storage("optuna.db")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--optuna-storage': 'optuna.db' is not a URL; allowed: sqlite:///PATH, ...
    """
    if not isinstance(url, str) or not url.strip():
        raise _error(str(url), "is empty")
    url = url.strip()
    path = journal_path(url)
    if path is not None:
        if not path.startswith("/"):
            raise _error(url, "needs an absolute path after journal:// (three slashes: journal:///dir/file.log)")
        if path.endswith("/"):
            raise _error(url, "names a directory; a journal is a file")
        _existing_parent(url, Path(path))
        return JOURNAL_PREFIX + os.path.normpath(path)
    if "://" not in url:
        raise _error(url, "is not a URL")
    # lazy: keeps sqlalchemy out of this module's import
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except Exception as exc:  # noqa: BLE001 -- unparsable, or no such SQLAlchemy dialect
        hint = " (PostgreSQL's scheme is postgresql://)" if url.startswith("postgres://") else ""
        raise _error(url, f"is not a database URL Optuna can open: {type(exc).__name__}{hint}") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        backend = parsed.get_backend_name()
        raise _error(url, f"needs the database driver '{getattr(exc, 'name', None) or exc}', which is not installed "
                          f"(pip install it, or name another driver: {backend}+DRIVER://...)") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:" or db.startswith("file::memory:"):
            raise _error(url, "is an in-memory database (lost when the driver exits: nothing to resume or report)")
        target = Path(db).expanduser().resolve()
        _existing_parent(url, target)
        return parsed.set(database=str(target)).render_as_string(hide_password=False)
    return url
