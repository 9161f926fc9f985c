"""The decoded-image cache: every (dataset, domain file list, image size) decoded once per node.

An image-folder domain is decoded into one uint8 array ``(N, S, S, 3)`` (RGB, the same
resize as :meth:`fedtune.data.folder.ImageFolderDataset.load`), stored as a ``.npy`` file in
the cache directory, and read by every client actor and every trial through a read-only
memory map: only the pages a process touches are resident, and they are shared page cache,
not private memory, so a dataset larger than RAM (DomainNet at 224 px is 88 GB of uint8) works.

* **Where.** ``cache_dir`` (a run-config field), else ``$FEDTUNE_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/fedtune/images`` (``~/.cache/fedtune/images``). A shared file system
  (NFS) may be given so a cluster decodes once instead of once per node: it needs working
  POSIX locks (``flock``), and it pays off when decoding costs more than reading the cache over
  the network (large JPEGs, many nodes); a fast local disk is the better default.
* **Key.** SHA-256 of the format version, the decoder, the dataset name, the domain, the image
  size and every file's relative path, size in bytes and modification time (ns). A changed,
  added or removed image is a new key, so a changed dataset is decoded again; the absolute
  data root is not part of the key (the same files mounted elsewhere share the cache).
* **Atomic build.** Under a file lock (``<key>.lock``; the OS releases it when its holder dies,
  so a killed builder never leaves it stuck), one process decodes into a temporary file,
  flushes it, then renames it into place, and writes the ``<key>.json`` record last. Other
  processes wait on the lock and then find the finished cache. Every build appends one JSON
  line to ``builds.log`` (images decoded, seconds, pid, host): that is how a sweep is seen to
  decode every image once.
* **Validation before every use.** The record must exist and match (format version, key,
  shape), the file's size must equal its header plus ``N·S·S·3`` bytes, and a CRC-32 of 64
  evenly spread 64 KiB windows (plus the first and last) must match the record. A truncated
  or corrupt cache (the usual damage: an interrupted copy, a full disk) is rebuilt, never read.
  A byte flipped between the sampled windows is not detected: a full check would read all of
  DomainNet's 88 GB at every start.

Decoding runs on a thread pool (PIL releases the GIL while it decodes and resizes); the bytes
do not depend on the number of threads. This module imports neither torch nor (until a build)
PIL: a user-space image cache shared through memory maps by many processes is not something
torchvision, Ray or PyArrow provide, hence hand-written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from fedtune.errors import DataError

CACHE_ENV = "FEDTUNE_CACHE_DIR"
FORMAT_VERSION = 1
DECODER = "pil-draft-rgb-bilinear"  # how pixels are made (ImageFolderDataset.decode_image)
BUILD_LOG = "builds.log"
_WINDOWS, _WINDOW = 64, 1 << 16


def default_cache_dir() -> Path:
    """``$FEDTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedtune/images`` (``~/.cache/...``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedtune" / "images"


def resolve_cache_dir(configured: str | os.PathLike | None) -> Path:
    """The cache directory a run uses: the ``cache_dir`` field, else :func:`default_cache_dir`."""
    return Path(configured).expanduser() if configured else default_cache_dir()


@dataclass(frozen=True)
class CacheEntry:
    """Where one domain's cache lives and what it must hold."""

    directory: Path
    key: str  # hex SHA-256
    stem: str  # "<dataset>-<domain>-<S>px-<key[:16]>"
    num_images: int
    image_size: int

    @property
    def array_path(self) -> Path:
        return self.directory / f"{self.stem}.npy"

    @property
    def record_path(self) -> Path:
        return self.directory / f"{self.stem}.json"

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.stem}.lock"

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_images, self.image_size, self.image_size, 3)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:40] or "_"


def cache_entry(directory: str | os.PathLike, *, dataset: str, domain: str, root: str | os.PathLike,
                files: Sequence[str], image_size: int) -> CacheEntry:
    """The cache entry of ``files`` (paths relative to ``root``) decoded at ``image_size``: its key
    covers every file's relative path, size and modification time (``os.stat``: cheap, no decode).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.jpg").write_bytes(b"x")
    >>> e = cache_entry(d / "cache", dataset="folder", domain="d0", root=d, files=["a.jpg"], image_size=32)
    >>> e.stem.startswith("folder-d0-32px-"), e.shape
    (True, (1, 32, 32, 3))
    """
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT_VERSION, DECODER, dataset, domain, int(image_size)]).encode())
    root = Path(root)
    for rel in files:
        try:
            st = os.stat(root / rel)
        except OSError as e:
            raise DataError(f"cannot read image {str(root / rel)!r}: {e.strerror or e}") from None
        h.update(json.dumps([rel, st.st_size, st.st_mtime_ns]).encode())
    key = h.hexdigest()
    stem = f"{_slug(dataset)}-{_slug(domain)}-{int(image_size)}px-{key[:16]}"
    return CacheEntry(Path(directory), key, stem, len(files), int(image_size))


def _sample_crc(path: Path) -> int:
    """CRC-32 of the first and last 64 KiB and of 64 evenly spread 64 KiB windows of ``path``."""
    size = path.stat().st_size
    starts = sorted({0, max(0, size - _WINDOW), *(int(i * max(0, size - _WINDOW) / (_WINDOWS - 1))
                                                   for i in range(_WINDOWS))})
    crc = 0
    with open(path, "rb") as f:
        for s in starts:
            f.seek(s)
            crc = zlib.crc32(f.read(_WINDOW), crc)
    return crc


def _expected_size(path: Path, shape: tuple[int, ...]) -> int | None:
    """The byte size a ``.npy`` with ``path``'s header must have, or None if the header is not a
    uint8 array of ``shape``."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                hdr_shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                hdr_shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                return None
            offset = f.tell()
    except (OSError, ValueError):
        return None
    if tuple(hdr_shape) != tuple(shape) or fortran or dtype != np.uint8:
        return None
    return offset + int(np.prod(shape))


def check_cache(entry: CacheEntry) -> str | None:
    """Why ``entry``'s files are not a valid finished cache, or None when they are (see the
    module docstring: record, header, size, sampled CRC)."""
    if not entry.record_path.is_file() or not entry.array_path.is_file():
        return "not built"
    try:
        record = json.loads(entry.record_path.read_text())
    except (OSError, ValueError):
        return "its record is unreadable"
    if not isinstance(record, dict) or record.get("format") != FORMAT_VERSION or record.get("key") != entry.key:
        return "its record is not this cache's"
    if list(record.get("shape", [])) != list(entry.shape):
        return "its record has another shape"
    size = _expected_size(entry.array_path, entry.shape)
    if size is None:
        return "its array header does not match"
    actual = entry.array_path.stat().st_size
    if actual != size:
        return f"it is {actual} bytes, expected {size} (truncated?)"
    if record.get("crc") != _sample_crc(entry.array_path):
        return "its checksum does not match (corrupt)"
    return None


class ImageMap:
    """A finished cache mapped read-only: :attr:`array` is the ``(N, S, S, 3)`` uint8 view.

    :meth:`release` drops this process's mapping of some rows' pages (``madvise(MADV_DONTNEED)``
    on a shared read-only file mapping): the bytes stay in the node's page cache, shared by every
    process, and the next read maps them again (a minor fault, no disk read). A client calls it
    after copying a batch out, so its resident memory counts its own data (indices, the batch),
    not every page of the dataset it has ever read.
    """

    def __init__(self, path: Path, shape: tuple[int, ...]):
        import mmap

        size = _expected_size(path, shape)
        if size is None:
            raise DataError(f"{str(path)!r} is not a uint8 array of shape {shape}")
        self.offset = size - int(np.prod(shape))
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.array = np.ndarray(shape, dtype=np.uint8, buffer=self._map, offset=self.offset)
        self.row_bytes = int(np.prod(shape[1:]))
        self._page = mmap.PAGESIZE
        # Linux maps up to 64 KiB of cached pages around each fault (fault_around_bytes, aligned in
        # virtual addresses): release that much on either side too, so they go as well.
        self._margin = 1 << 16
        self._dontneed = getattr(mmap, "MADV_DONTNEED", None)

    def __len__(self) -> int:
        return len(self.array)

    def release(self, rows: np.ndarray) -> None:
        """Unmap (from this process only) the pages holding ``rows``."""
        if self._dontneed is None or len(rows) == 0:
            return
        page, margin = self._page, self._margin
        starts = self.offset + np.sort(np.asarray(rows, dtype=np.int64)) * self.row_bytes
        lo = (np.maximum(starts - margin, 0) // page) * page
        hi = -(-(starts + self.row_bytes + margin) // page) * page
        begin, end = int(lo[0]), int(hi[0])
        for a, b in zip(lo[1:].tolist(), hi[1:].tolist()):
            if a <= end:  # contiguous or overlapping: one call
                end = max(end, b)
                continue
            self._map.madvise(self._dontneed, begin, min(end, len(self._map)) - begin)
            begin, end = a, b
        self._map.madvise(self._dontneed, begin, min(end, len(self._map)) - begin)


def open_cache(entry: CacheEntry) -> ImageMap:
    """The finished cache, mapped read-only (call after :func:`check_cache` says it is valid)."""
    return ImageMap(entry.array_path, entry.shape)


def decode_threads() -> int:
    """Threads that decode a cache: the machine's cores, at most 16."""
    return max(1, min(16, os.cpu_count() or 1))


def build_cache(entry: CacheEntry, decode, *, threads: int | None = None) -> None:
    """Decode every image into ``entry``'s files. ``decode(i, out)`` writes image ``i`` into the
    ``(S, S, 3)`` uint8 view ``out`` (raising :class:`DataError` for an undecodable file).
    Call under the entry's lock (:func:`cached_images` does)."""
    entry.directory.mkdir(parents=True, exist_ok=True)
    _check_room(entry)
    tmp = entry.directory / f".{entry.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp.npy"
    t0 = time.time()
    try:
        # The header (and the file's full size) from numpy; pixels are written with pwrite from a
        # per-chunk buffer, so the builder never maps (and never holds resident) the whole array.
        header_only = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=entry.shape)
        del header_only
        offset = _expected_size(tmp, entry.shape) - int(np.prod(entry.shape))
        row = int(np.prod(entry.shape[1:]))
        n, chunk = entry.num_images, 64
        fd = os.open(tmp, os.O_WRONLY)
        try:
            with ThreadPoolExecutor(max_workers=threads or decode_threads()) as pool:
                def work(start: int) -> None:
                    stop = min(start + chunk, n)
                    buf = np.empty((stop - start, *entry.shape[1:]), np.uint8)
                    for i in range(start, stop):
                        decode(i, buf[i - start])
                    view, at = memoryview(buf).cast("B"), offset + start * row
                    while len(view):  # pwrite may write less than asked
                        done = os.pwrite(fd, view, at)
                        view, at = view[done:], at + done
                for fut in [pool.submit(work, s) for s in range(0, n, chunk)]:
                    fut.result()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, entry.array_path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise DataError(f"field 'cache_dir': the image cache {str(entry.array_path)!r} could not be written "
                            f"({exc.strerror}); free space there, set cache_dir to a larger disk or lower "
                            f"image_size") from None
        raise
    seconds = time.time() - t0
    record = {"format": FORMAT_VERSION, "key": entry.key, "shape": list(entry.shape),
              "crc": _sample_crc(entry.array_path), "decoder": DECODER, "built": time.time(),
              "seconds": round(seconds, 3)}
    tmp_rec = entry.record_path.with_suffix(f".{os.getpid()}.tmp")
    tmp_rec.write_text(json.dumps(record))
    os.replace(tmp_rec, entry.record_path)
    line = json.dumps({"stem": entry.stem, "images": entry.num_images, "seconds": round(seconds, 3),
                       "pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    with open(entry.directory / BUILD_LOG, "a") as f:  # appended under the entry's lock
        f.write(line + "\n")


def _check_room(entry: CacheEntry) -> None:
    """A DataError, before anything is written, when ``entry``'s array cannot fit the free space
    of its directory (a large ``image_size`` grows it with the square: 100000 px is 30 GB per image)."""
    need = int(np.prod(entry.shape, dtype=np.float64)) + (1 << 16)  # pixels and the .npy header
    free = shutil.disk_usage(entry.directory).free
    if need > free:
        raise DataError(f"field 'image_size': the image cache of {entry.num_images} images at {entry.image_size} px "
                        f"needs {_size(need)} but {str(entry.directory)!r} has {_size(free)} free; "
                        f"allowed: a smaller image_size, or cache_dir on a larger disk")


def _size(nbytes: float) -> str:
    """``2.3 MiB``, ``30.0 GiB``: a size in a message."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def cached_images(entry: CacheEntry, decode, *, threads: int | None = None) -> ImageMap:
    """``entry``'s images as a read-only memory map (:class:`ImageMap`), decoding them first if no valid cache exists
    (once per node: other processes wait on the lock and then read what it built)."""
    if check_cache(entry) is None:
        return open_cache(entry)
    from filelock import FileLock

    try:
        entry.directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(entry.lock_path))
        lock.acquire()
    except OSError as e:
        raise DataError(f"field 'cache_dir': cannot write the image cache in {str(entry.directory)!r} "
                        f"({e.strerror or e}); set cache_dir (or ${CACHE_ENV}) to a writable folder") from None
    try:
        if check_cache(entry) is not None:  # still missing or damaged: this process builds it
            build_cache(entry, decode, threads=threads)
            problem = check_cache(entry)
            if problem is not None:
                raise DataError(f"the image cache {str(entry.array_path)!r} could not be built: {problem}")
    finally:
        lock.release()
    return open_cache(entry)


def build_log(directory: str | os.PathLike) -> list[dict]:
    """The records of every build in ``directory`` (``builds.log``), oldest first."""
    path = Path(directory) / BUILD_LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
