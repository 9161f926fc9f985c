"""A study folder is not a way to run code on whoever resumes it: Ray Tune's pickles signed and checked.

Ray Tune 2.60 restores an experiment with :mod:`pickle`: ``tuner.pkl`` (``Tuner.restore``), the
trials embedded as cloudpickle hex in ``experiment_state-*.json``, the searcher's state
(``search_gen_state-*.json`` and ``searcher-state-*.pkl``, both pickles), the callbacks' state
(``callback-states-*.pkl``), a skipped errored trial's ``error.pkl`` (read when the fit's results
are gathered) and a dict checkpoint's ``_dict_checkpoint.pkl`` (read by the trial that restores
it). Optuna's CMA-ES sampler keeps a pickle too, in the Optuna storage (:func:`check_cma_trials`).
Unpickling runs whatever the file says, so a study folder someone handed over could run code
on the user who resumes it.

The driver therefore signs every such file of each Tune experiment with a per-user key
(HMAC-SHA256 over the file's path in the experiment and its bytes), in the experiment's
:data:`MANIFEST`, and ``--resume`` checks them all before anything is unpickled (before Ray even
starts). A file whose signature is missing or does not match is refused, in one line naming it;
``--trust-study-files`` lets a folder the user trusts through (and signs it with their key, so the
next resume needs no flag). The key (:func:`state_key`) lives outside every study folder, in
``$XDG_CONFIG_HOME/fedtune/state-key`` (else ``~/.config/fedtune/state-key``), created 0600 on
first use; a key file readable by others, or not a regular file, is refused.

Which files: at an experiment's top level every ``*.pkl`` and ``*.json`` (Tune copies exactly those
to the driver before it restores), below it every ``*.pkl``; Tune's own ``tmp-*`` files, which it
never reads, are left out. Each file keeps its last :data:`KEPT_VERSIONS` signatures: Tune copies
its state from the driver's staging folder to the experiment in the background, so the copy on disk
may be one or two versions behind the newest signed one when a driver is killed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from fedtune.errors import ConfigError
from fedtune.results.atomic import atomic_write_text

__all__ = ["KEPT_VERSIONS", "MANIFEST", "TRUST_FLAG", "ExperimentSignatures", "bears_pickle", "check_cma_trials",
           "check_experiment", "key_path", "sign_cma_trial", "state_key"]

MANIFEST = ".fedtune-signatures"
"""The signatures of an experiment's pickle-bearing files, in the experiment folder (JSON, never a pickle)."""
KEPT_VERSIONS = 16
"""Signatures kept per file: its newest versions (Tune's background copy may lag behind the newest)."""
TRUST_FLAG = "--trust-study-files"
_KEY_BYTES = 32
_DOMAIN = b"fedtune study file v1\0"
_KEYS: dict[str, bytes] = {}  # key file -> key, read once per process


# -- the key ------------------------------------------------------------------------------------
def key_path() -> Path:
    """``$XDG_CONFIG_HOME/fedtune/state-key`` (an absolute ``XDG_CONFIG_HOME`` only, as the XDG
    specification says), else ``~/.config/fedtune/state-key``."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "fedtune" / "state-key"


def state_key() -> bytes:
    """This user's signing key, created (0600, 32 random bytes as hex) on first use. Refused in one
    line: a key file that is not a regular file (a symbolic link, a directory, a FIFO), that group or
    others may read or write, that another user owns, or that does not hold a key."""
    path = key_path()
    cached = _KEYS.get(str(path))
    if cached is not None:
        return cached
    if not os.path.lexists(path):
        _create_key(path)
    key = _read_key(path)
    _KEYS[str(path)] = key
    return key


def _create_key(path: Path) -> None:
    """Write a new key to ``path`` atomically (a temporary 0600 file hard-linked into place, so a
    concurrent driver never reads half a key, and the first of two creators wins)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.parent / f".state-key.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(_KEY_BYTES) + "\n")
            os.link(tmp, path)
        except FileExistsError:
            pass  # another driver created it first: use theirs
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create fedtune's key for signing study files at {path}: "
                          f"{exc.strerror or exc}") from None


def _read_key(path: Path) -> bytes:
    fix = f"remove it to have a new one made (studies it signed then need {TRUST_FLAG} once)"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(f"fedtune's key for signing study files, {path}, is a symbolic link, not a regular "
                              f"file; {fix}") from None
        raise ConfigError(f"cannot read fedtune's key for signing study files, {path}: "
                          f"{exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"fedtune's key for signing study files, {path}, is not a regular file; {fix}")
        if st.st_mode & 0o077:
            raise ConfigError(f"fedtune's key for signing study files, {path}, may be read or written by group or "
                              f"others (mode {stat.S_IMODE(st.st_mode):04o}); make it private with: chmod 600 {path}")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise ConfigError(f"fedtune's key for signing study files, {path}, belongs to another user "
                              f"(uid {st.st_uid}); {fix}")
        text = os.read(fd, 4 * _KEY_BYTES).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ConfigError(f"fedtune's key for signing study files, {path}, does not hold a key "
                          f"({2 * _KEY_BYTES} hex digits); {fix}")
    return key


# -- which files, and their signatures ------------------------------------------------------------
def bears_pickle(rel: str) -> bool:
    """Whether Ray Tune may unpickle the experiment file at ``rel`` (a path inside the experiment,
    ``/``-separated) when it restores: a top-level ``*.pkl`` or ``*.json``, or a ``*.pkl`` below.

    >>> [bears_pickle(p) for p in ("tuner.pkl", "experiment_state-2024.json", "tmp-searcher-state-1.pkl",
    ...                            "trial_1/error.pkl", "trial_1/result.json", MANIFEST)]
    [True, True, False, True, False, False]
    """
    parts = PurePosixPath(rel).parts
    name = parts[-1] if parts else ""
    if name.startswith("tmp-"):
        return False
    return name.endswith(".pkl") or (len(parts) == 1 and name.endswith(".json"))


def _digest(key: bytes, rel: str, chunks: Iterable[bytes]) -> str:
    mac = hmac.new(key, _DOMAIN + rel.encode("utf-8") + b"\0", hashlib.sha256)
    for chunk in chunks:
        mac.update(chunk)
    return mac.hexdigest()


def _local_chunks(path: str | Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


class ExperimentSignatures:
    """The signatures of one Tune experiment (a local folder, or a folder of a pyarrow file system
    such as S3 for ``--storage-path``): read from its :data:`MANIFEST`, extended, written back."""

    def __init__(self, location: str | Path, fs: Any = None):
        import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

        if fs is None:
            text = str(location)
            if "://" in text:
                fs, path = pyarrow.fs.FileSystem.from_uri(text)
            else:
                fs, path = pyarrow.fs.LocalFileSystem(), str(Path(text).resolve())
        else:
            path = str(location)
        self.fs, self.path = fs, path.rstrip("/") or "/"
        self.local = isinstance(fs, pyarrow.fs.LocalFileSystem)
        self.shown = self.path if self.local or "://" not in str(location) else str(location).rstrip("/")
        self.key = state_key()
        self.dirty = False
        self.seen: dict[str, tuple[int, int, int]] = {}  # staging file -> (mtime, size, inode) last signed
        self.entries, self.manifest_error = self._read_manifest()

    def where(self, rel: str) -> str:
        return f"{self.shown}/{rel}"

    def _read_manifest(self) -> tuple[dict[str, list[str]] | None, str | None]:
        """The manifest's entries; None when there is none (and why, when it is unreadable)."""
        import pyarrow  # lazy: keeps pyarrow, numpy out of this module's import

        try:
            with self.fs.open_input_stream(f"{self.path}/{MANIFEST}") as f:
                raw = f.read(64 << 20)
        except FileNotFoundError:
            return None, None
        except (OSError, pyarrow.ArrowException) as exc:
            return None, f"unreadable ({exc})"
        try:
            data = json.loads(raw)
            files = data["files"]
            ok = isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, list)
                                                 and all(isinstance(d, str) for d in v) for k, v in files.items())
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            return None, "not a signature file fedtune wrote"
        return {k: list(v) for k, v in files.items()}, None

    # -- signing ------------------------------------------------------------------------------
    def add(self, rel: str, digest: str) -> None:
        entries = self.entries if self.entries is not None else {}
        self.entries = entries
        kept = entries.setdefault(rel, [])
        if digest in kept:
            return
        kept.append(digest)
        del kept[:-KEPT_VERSIONS]
        self.dirty = True

    def sign_stored(self, rel: str) -> None:
        """Sign the experiment's file ``rel`` as it is now."""
        with self.fs.open_input_stream(f"{self.path}/{rel}") as f:
            self.add(rel, _digest(self.key, rel, iter(lambda: f.read(1 << 20), b"")))

    def sign_local(self, rel: str, local: str | Path) -> None:
        """Sign the local file ``local`` (Tune's staging copy) as the experiment's file ``rel``,
        unless it has not changed since it was last signed."""
        try:
            st = os.stat(local)
        except FileNotFoundError:
            return
        mark = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self.seen.get(str(local)) == mark:
            return
        try:
            self.add(rel, _digest(self.key, rel, _local_chunks(local)))
        except FileNotFoundError:
            return
        self.seen[str(local)] = mark

    def sign_staging(self, staging: str | Path) -> None:
        """Sign the top-level state files in Tune's staging folder (what Tune copies to the experiment)."""
        try:
            entries = list(os.scandir(staging))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and bears_pickle(entry.name):
                self.sign_local(entry.name, entry.path)

    def stored(self, under: str = "") -> list[str]:
        """The pickle-bearing files of the experiment (below ``under``, a relative folder), relative paths."""
        import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

        base = f"{self.path}/{under}".rstrip("/")
        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(base, recursive=True, allow_not_found=True))
        out = []
        for info in infos:
            if info.type != pyarrow.fs.FileType.File:
                continue
            rel = PurePosixPath(info.path).relative_to(PurePosixPath(self.path)).as_posix()
            if bears_pickle(rel):
                out.append(rel)
        return sorted(out)

    def sign_tree(self, under: str = "") -> None:
        for rel in self.stored(under):
            try:
                self.sign_stored(rel)
            except FileNotFoundError:
                continue

    def save(self) -> None:
        if not self.dirty:
            return
        text = json.dumps({"fedtune_signatures": 1, "files": self.entries or {}}, sort_keys=True, indent=0)
        target = f"{self.path}/{MANIFEST}"
        if self.local:
            atomic_write_text(target, text)
        else:
            with self.fs.open_output_stream(target) as f:
                f.write(text.encode("utf-8"))
        self.dirty = False

    # -- checking -----------------------------------------------------------------------------
    def first_unsigned(self, ignore: tuple[str, ...] = ()) -> tuple[str, str] | None:
        """The first pickle-bearing file (but ``ignore``) without a valid signature and why, or None
        when all are signed."""
        for rel in self.stored():
            if rel in ignore:
                continue
            if self.entries is None:
                why = (f"its signature file {self.where(MANIFEST)} is {self.manifest_error}" if self.manifest_error
                       else "the folder carries no fedtune signatures (a study from before fedtune signed its Ray "
                            "Tune state, or from someone else)")
                return rel, why
            kept = self.entries.get(rel)
            if not kept:
                return rel, "it is not signed by your fedtune key"
            with self.fs.open_input_stream(f"{self.path}/{rel}") as f:
                digest = _digest(self.key, rel, iter(lambda: f.read(1 << 20), b""))
            if not any(hmac.compare_digest(digest, d) for d in kept):
                return rel, ("it changed after your fedtune signed it (replaced by someone, or its driver was killed "
                             "(SIGKILL) while Ray Tune wrote it)")
        return None


def check_experiment(location: str | Path, *, study: str, trust: bool = False, ignore: tuple[str, ...] = ()) -> None:
    """Refuse, in one line naming the file, a Tune experiment at ``location`` with a pickle-bearing
    file (but ``ignore``) this user's key did not sign; with ``trust``, sign them all instead (the
    user vouches for the folder). Nothing is unpickled here."""
    book = ExperimentSignatures(location)
    if trust:
        book.sign_tree()
        book.save()
        return
    bad = book.first_unsigned(ignore)
    if bad is None:
        return
    rel, why = bad
    raise ConfigError(f"--resume: study '{study}': {book.where(rel)} holds pickled Ray Tune state that resuming would "
                      f"unpickle, which runs any code in it, and {why}; nothing was run. If this folder is yours, or "
                      f"you trust whoever gave it to you, resume with {TRUST_FLAG} (it then signs the folder with your "
                      f"key, {key_path()})")


# -- CMA-ES's optimizer in the Optuna storage -------------------------------------------------------
# Optuna's CmaEsSampler pickles its optimizer into a trial's system attributes (``cma:optimizer:<i>``,
# ``sepcma:``, ``cmawm:``) and unpickles the last finished trial's when it samples: an Optuna
# storage handed over with a study could run code too. The driver signs those attributes before it
# tells a trial finished (the sampler reads finished trials only) and checks them before it asks.
_CMA_KEY = re.compile(r"^[a-z]*cma[a-z]*:optimizer")


def _cma_state(system_attrs: dict[str, Any]) -> bytes | None:
    found = {k: v for k, v in system_attrs.items() if _CMA_KEY.match(k)}
    return json.dumps(found, sort_keys=True).encode() if found else None


def sign_cma_trial(study_dir: str | Path, optuna_study: str, number: int, system_attrs: dict[str, Any]) -> None:
    """Sign the CMA-ES optimizer pickled into a trial's system attributes (none: nothing to sign),
    in the study folder's :data:`MANIFEST`, as ``optuna/<study>/<number>``."""
    content = _cma_state(system_attrs)
    if content is None:
        return
    book = ExperimentSignatures(study_dir)
    rel = f"optuna/{optuna_study}/{number}"
    book.add(rel, _digest(book.key, rel, [content]))
    book.save()


def check_cma_trials(study_dir: str | Path, optuna_study: str, trials: Iterable[Any], *, trust: bool) -> None:
    """Before CMA-ES reads its optimizer back from the finished ``trials`` (Optuna's ``FrozenTrial``):
    one this user's key did not sign is refused in one line naming it; with ``trust`` (the user's
    ``--trust-study-files``) they are signed instead."""
    book = ExperimentSignatures(study_dir)
    for t in trials:
        content = _cma_state(t.system_attrs)
        if content is None:
            continue
        rel = f"optuna/{optuna_study}/{t.number}"
        digest = _digest(book.key, rel, [content])
        if trust:
            book.add(rel, digest)
            continue
        if not any(hmac.compare_digest(digest, d) for d in (book.entries or {}).get(rel, [])):
            raise ConfigError(f"--resume: the Optuna study '{optuna_study}' holds CMA-ES state pickled in its trial "
                              f"{t.number} that sampling would unpickle, which runs any code in it, and your fedtune "
                              f"key did not sign it; nothing was run. If this study and its Optuna storage are yours, "
                              f"or you trust whoever gave them to you, resume with {TRUST_FLAG}")
    book.save()
