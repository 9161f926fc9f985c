"""Where a model's starting weights come from, and the checks on those files.

torchvision's published weight files (``$TORCH_HOME/hub/checkpoints/<name>-<sha256 prefix>.pth``:
found, hash checked against the name, else fetched by torch.hub) and a user's local checkpoint
(``pretrained_path``: a file, read with ``torch.load(..., weights_only=True)``, wrappers and a
``module.`` prefix removed). Which tensors of a model a checkpoint may fill is
:func:`fedtune.models.load_checkpoint`'s business.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch.hub
from torch.hub import HASH_REGEX

from fedtune.errors import ConfigError, shown


def weights_file(member) -> Path:
    """Where torchvision reads ``member``'s file: ``$TORCH_HOME/hub/checkpoints/<file name>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(member.url).path).name


def published_file(member, model: str, download_timeout_s: float = 20.0) -> Path:
    """The local file of torchvision's weight set ``member`` (of ``model``): found in
    ``$TORCH_HOME/hub/checkpoints`` and SHA-256 checked against its name, else downloaded there
    (torch.hub, hash checked), else one ConfigError line naming the file, the folder and
    ``pretrained_path``."""
    path = weights_file(member)
    if path.is_file():
        check_published_hash(path, model, member.name)
        return path
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(download_timeout_s)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # torch.hub's "Downloading: ..." line
            torch.hub.load_state_dict_from_url(member.url, progress=False, check_hash=True, weights_only=True)
    except Exception as exc:  # offline, a proxy, a bad hash: say what to do instead
        reason = str(getattr(exc, "reason", "") or exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"field 'weights': {model} {member.name} needs the file {path.name} in {path.parent} (not there, and "
            f"downloading {member.url} failed: {reason}); copy the file there (or set TORCH_HOME), or give a local "
            "checkpoint as pretrained_path") from None
    finally:
        socket.setdefaulttimeout(old)
    return path


_HASH_CHECKED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hex, per process


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes (read in 1 MiB blocks), remembered per (path, size, mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_CHECKED:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _HASH_CHECKED[key] = digest.hexdigest()
    return _HASH_CHECKED[key]


def check_published_hash(path: Path, model: str, weights: str) -> None:
    """torchvision's file names carry the first hex digits of the file's SHA-256
    (``resnet18-f37072fd.pth``; torch.hub's ``HASH_REGEX``, as ``check_hash`` reads it): a file
    under that name whose content does not hash to that prefix is not torchvision's published file,
    and is refused in one ConfigError line. A name without such a prefix is not checked."""
    match = HASH_REGEX.search(path.name)
    prefix = match.group(1) if match else ""
    if not prefix:
        return
    digest = file_sha256(path)
    if not digest.startswith(prefix):
        raise ConfigError(
            f"field 'weights': {path} is not torchvision's published {model} {weights} file (its SHA-256 starts "
            f"{digest[:len(prefix)]}, the name says {prefix}); delete it to fetch torchvision's file again, or give "
            "it as pretrained_path (weights none) to start from it anyway")


def check_pretrained_file(path: str | Path) -> None:
    """A ConfigError line unless ``pretrained_path`` names a readable file (a folder or a missing
    path said as such)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"field 'pretrained_path': {shown(str(path))} is a directory; allowed: a checkpoint file "
                          "(torch.save of a state dict)")
    if not path.is_file():
        raise ConfigError(f"field 'pretrained_path': {shown(str(path))} does not exist")


def _unwrap_checkpoint(state: object, path: Path) -> dict:
    """A checkpoint's state dict: ``{"state_dict": ...}`` / ``{"model": ...}`` wrappers removed (any
    depth), then a ``module.`` prefix (DataParallel / DDP) on every key removed."""
    for _ in range(4):
        if isinstance(state, dict) and not any(isinstance(v, torch.Tensor) for v in state.values()):
            inner = next((state[k] for k in ("state_dict", "model") if isinstance(state.get(k), dict)), None)
            if inner is None:
                break
            state = inner
    if not isinstance(state, dict) or not state:
        raise ConfigError(f"field 'pretrained_path': '{path}' holds a {type(state).__name__}, not a state_dict "
                          "(nor one wrapped as {'state_dict': ...} or {'model': ...})")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if len(tensors) != len(state):
        other = [k for k in state if k not in tensors][:5]
        raise ConfigError(f"field 'pretrained_path': '{path}' is not a state_dict: entries {', '.join(map(str, other))} "
                          "are not tensors")
    if all(str(k).startswith("module.") for k in tensors):
        tensors = {k[len("module."):]: v for k, v in tensors.items()}
    return tensors


def checkpoint_state_dict(path: Path) -> dict:
    """``pretrained_path``'s state dict (:func:`check_pretrained_file`, then ``torch.load`` with
    ``weights_only=True``, then :func:`_unwrap_checkpoint`), or one ConfigError line."""
    check_pretrained_file(path)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, or it holds objects weights_only refuses
        raise ConfigError(f"field 'pretrained_path': '{path}' is not a loadable state_dict "
                          f"(torch.load with weights_only=True): {type(exc).__name__}") from None
    return _unwrap_checkpoint(raw, path)
