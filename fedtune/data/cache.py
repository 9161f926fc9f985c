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
* **Key** (``cache_key``). SHA-256 of the format version, the decoder, the dataset name, the
  domain, the image size and every file's relative path and, with ``stat`` (the default), its
  size in bytes and modification time (ns); with ``content``, a BLAKE2b digest of its bytes. A
  changed, added or removed image is a new key, so a changed dataset is decoded again; the
  absolute data root is not part of the key (the same files mounted elsewhere share the cache).
  ``stat`` costs one ``stat`` per file; it misses an image rewritten in place with its size and
  modification time kept (``touch -r``, some sync tools), which ``content`` sees, at the price of
  reading every image file once in every process that opens the dataset.
* **Atomic build.** Under a file lock (``<key>.lock``; the OS releases it when its holder dies,
  so a killed builder never leaves it stuck), one process decodes into a temporary file,
  flushes it, then renames it into place, writes the per-image checksums (``<key>.crc``) and
  the ``<key>.json`` record last. Other processes wait on the lock (saying whom they wait for,
  and giving up when the builder makes no progress for ``cache_wait_s`` seconds: see
  :mod:`fedtune.data.cache_lock`) and then find the finished cache. Temporary files a killed
  builder left are removed by the next build in the folder. Every build appends one JSON line
  to ``builds.log`` (images decoded, seconds, pid, host): that is how a sweep is seen to decode
  every image once.
* **Validation of every byte read.** Before use: the record must exist and match (format
  version, key, shape), the file's size must equal its header plus ``N·S·S·3`` bytes, and the
  checksum file must hold ``N`` CRC-32s whose own CRC is in the record. Then every image's bytes
  are checked against its CRC-32: all at once when the array is at most ``FULL_CHECK_BYTES``
  (64 MiB: PACS at 64 px, a digits folder), else each image the first time this process reads
  it (:meth:`ImageMap.read`), so a large cache is never read whole at start and no byte is used
  unchecked. A truncated or corrupt cache (the usual damage: an interrupted copy, a full disk)
  found before use is rebuilt; damage found while reading is one :class:`DataError` line, and
  the record is removed so the next run decodes the domain again. Cost: zlib's CRC-32, 0.5-0.7
  GB/s on one core (25 us an image at 64 px, 0.22 ms at 224 px), once per image per process.

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
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
import mmap

import numpy as np

from fedtune.errors import DataError
from fedtune.results.atomic import atomic_write, atomic_write_text

from .cache_bytes import first_bad_row, npy_size
from .cache_lock import DEFAULT_WAIT_S, BuildProgress, acquire_build_lock, read_owner, remove_stale_temporaries

CACHE_ENV = "FEDTUNE_CACHE_DIR"
FORMAT_VERSION = 2  # 2: per-image CRC-32s (1: 64 sampled windows)
DECODER = "pil-draft-rgb-bilinear"  # how pixels are made (ImageFolderDataset.decode_image)
BUILD_LOG = "builds.log"
KEY_MODES = ("stat", "content")  # the run-config field cache_key
FULL_CHECK_BYTES = 64 << 20  # arrays up to this size are checked whole before use


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

    def _file(self, suffix: str) -> Path:
        return self.directory / f"{self.stem}.{suffix}"

    array_path = property(lambda self: self._file("npy"), doc="The images: an ``(N, S, S, 3)`` uint8 array.")
    record_path = property(lambda self: self._file("json"), doc="The record, written last: the cache is complete.")
    crc_path = property(lambda self: self._file("crc"), doc="The images' CRC-32s: ``N`` little-endian uint32.")
    lock_path = property(lambda self: self._file("lock"), doc="The build's file lock.")
    owner_path = property(lambda self: self._file("owner"),
                          doc="Who is building this entry now (:mod:`fedtune.data.cache_lock`).")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_images, self.image_size, self.image_size, 3)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:40] or "_"


def _file_digest(path: Path) -> str:
    """BLAKE2b (128 bits) of ``path``'s bytes (the ``content`` key)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _file_facts(root: Path, files: Sequence[str], key_mode: str) -> list:
    """What the key holds of each file: ``[size, mtime_ns]`` (``stat``) or its digest (``content``)."""
    def facts(rel: str):
        try:
            if key_mode == "content":
                return _file_digest(root / rel)
            st = os.stat(root / rel)
            return [st.st_size, st.st_mtime_ns]
        except OSError as e:
            raise DataError(f"cannot read image {str(root / rel)!r}: {e.strerror or e}") from None

    if key_mode == "stat":
        return [facts(rel) for rel in files]
    with ThreadPoolExecutor(max_workers=decode_threads()) as pool:  # hashlib releases the GIL
        return list(pool.map(facts, files))


def cache_entry(directory: str | os.PathLike, *, dataset: str, domain: str, root: str | os.PathLike,
                files: Sequence[str], image_size: int, key_mode: str = "stat") -> CacheEntry:
    """The cache entry of ``files`` (paths relative to ``root``) decoded at ``image_size``: its key
    covers every file's relative path and, by ``key_mode``, its size and modification time
    (``stat``: cheap, no read) or its bytes (``content``: every file read and hashed).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.jpg").write_bytes(b"x")
    >>> e = cache_entry(d / "cache", dataset="folder", domain="d0", root=d, files=["a.jpg"], image_size=32)
    >>> e.stem.startswith("folder-d0-32px-"), e.shape
    (True, (1, 32, 32, 3))
    """
    if key_mode not in KEY_MODES:
        raise DataError(f"field 'cache_key': {key_mode!r} is unknown; allowed: {', '.join(KEY_MODES)}")
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT_VERSION, DECODER, dataset, domain, int(image_size)]
                        + ([] if key_mode == "stat" else [key_mode])).encode())
    for rel, facts in zip(files, _file_facts(Path(root), files, key_mode)):
        h.update(json.dumps([rel, *facts] if key_mode == "stat" else [rel, facts]).encode())
    key = h.hexdigest()
    stem = f"{_slug(dataset)}-{_slug(domain)}-{int(image_size)}px-{key[:16]}"
    return CacheEntry(Path(directory), key, stem, len(files), int(image_size))


def _read_crcs(entry: CacheEntry, record: dict) -> np.ndarray | None:
    """The entry's per-image CRC-32s, or None when the file is missing or does not match the record."""
    try:
        raw = entry.crc_path.read_bytes()
    except OSError:
        return None
    if len(raw) != 4 * entry.num_images or record.get("crc_file") != zlib.crc32(raw):
        return None
    return np.frombuffer(raw, dtype="<u4")


def check_cache(entry: CacheEntry, *, pixels: bool = True) -> str | None:
    """Why ``entry``'s files are not a valid finished cache, or None when they are (see the module
    docstring: record, header, size, the checksum file, and, with ``pixels``, every image's CRC-32
    when the array is small enough to check whole)."""
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
    size = npy_size(entry.array_path, entry.shape)
    if size is None:
        return "its array header does not match"
    actual = entry.array_path.stat().st_size
    if actual != size:
        return f"it is {actual} bytes, expected {size} (truncated?)"
    crcs = _read_crcs(entry, record)
    if crcs is None:
        return "its checksum file is missing or does not match (corrupt)"
    nbytes = int(np.prod(entry.shape))
    if pixels and nbytes <= FULL_CHECK_BYTES:
        bad = first_bad_row(entry.array_path, size - nbytes, int(np.prod(entry.shape[1:])), crcs)
        if bad is not None:
            return f"image {bad} does not match its checksum (corrupt)"
    return None


class ImageMap:
    """A finished cache mapped read-only: :attr:`array` is the ``(N, S, S, 3)`` uint8 view;
    :meth:`read` is how images are taken from it (checked against their CRC-32 on first read).

    :meth:`release` drops this process's mapping of some rows' pages (``madvise(MADV_DONTNEED)``
    on a shared read-only file mapping): the bytes stay in the node's page cache, shared by every
    process, and the next read maps them again (a minor fault, no disk read). A client calls it
    after copying a batch out, so its resident memory counts its own data (indices, the batch),
    not every page of the dataset it has ever read.
    """

    def __init__(self, path: Path, shape: tuple[int, ...], crcs: np.ndarray | None = None,
                 record_path: Path | None = None):

        size = npy_size(path, shape)
        if size is None:
            raise DataError(f"{str(path)!r} is not a uint8 array of shape {shape}")
        self.path, self.record_path = path, record_path
        self.offset = size - int(np.prod(shape))
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.array = np.ndarray(shape, dtype=np.uint8, buffer=self._map, offset=self.offset)
        self.row_bytes = int(np.prod(shape[1:]))
        # per image: its CRC-32 (None: not checked) and whether this process has checked it yet
        self.crcs = crcs
        self.checked = np.zeros(shape[0], dtype=bool) if crcs is not None else None
        self._page = mmap.PAGESIZE
        # Linux maps up to 64 KiB of cached pages around each fault (fault_around_bytes, aligned in
        # virtual addresses): release that much on either side too, so they go as well.
        self._margin = 1 << 16
        self._dontneed = getattr(mmap, "MADV_DONTNEED", None)

    def __len__(self) -> int:
        return len(self.array)

    def read(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of ``rows`` (into ``out`` when given), each image checked against its CRC-32 the
        first time this process reads it; the pages read are then released (:meth:`release`).
        A mismatch is a :class:`DataError` and removes the cache's record (the next run rebuilds it)."""
        rows = np.asarray(rows, dtype=np.int64)
        if out is None:
            out = np.empty((len(rows), *self.array.shape[1:]), np.uint8)
        np.take(self.array, rows, axis=0, out=out)
        if self.checked is not None and len(rows):
            for j in np.nonzero(~self.checked[rows])[0].tolist():
                if zlib.crc32(out[j]) != int(self.crcs[rows[j]]):
                    self._damaged(int(rows[j]))
            self.checked[rows] = True
        self.release(rows)
        return out

    def _damaged(self, row: int):
        if self.record_path is not None:
            self.record_path.unlink(missing_ok=True)
        raise DataError(f"the image cache {str(self.path)!r} is damaged: image {row} does not match its "
                        f"checksum (a disk or copy error); its record was removed, so the next run decodes "
                        f"this domain again")

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
    """The finished cache, mapped read-only (call after :func:`check_cache` says it is valid):
    an array small enough for :func:`check_cache` to have checked whole is not checked again; a
    larger one has each image checked the first time this process reads it."""
    try:
        record = json.loads(entry.record_path.read_text())
    except (OSError, ValueError):
        record = {}
    crcs = _read_crcs(entry, record) if isinstance(record, dict) else None
    if crcs is None:
        raise DataError(f"the image cache {str(entry.array_path)!r} changed while it was opened (its checksum file "
                        f"does not match); run again")
    if int(np.prod(entry.shape)) <= FULL_CHECK_BYTES:  # every image was checked by check_cache
        return ImageMap(entry.array_path, entry.shape)
    return ImageMap(entry.array_path, entry.shape, crcs, entry.record_path)


def decode_threads() -> int:
    """Threads that decode a cache: the machine's cores, at most 16."""
    return max(1, min(16, os.cpu_count() or 1))


def _decode_into(fd: int, entry: CacheEntry, decode, offset: int, crcs: np.ndarray, threads: int,
                 progress: BuildProgress) -> None:
    """Decode every image of ``entry`` into the open file ``fd`` (pixels at ``offset``) and its
    CRC-32 into ``crcs``, 64 images a task on ``threads`` threads."""
    row = int(np.prod(entry.shape[1:]))
    n, chunk = entry.num_images, 64
    failed = threading.Event()  # set by the first failure: every thread stops at its next image

    def work(start: int) -> None:
        stop = min(start + chunk, n)
        buf = np.empty((stop - start, *entry.shape[1:]), np.uint8)
        try:
            for i in range(start, stop):
                if failed.is_set():
                    return
                decode(i, buf[i - start])
                crcs[i] = zlib.crc32(buf[i - start])
        except BaseException:
            failed.set()
            raise
        view, at = memoryview(buf).cast("B"), offset + start * row
        while len(view):  # pwrite may write less than asked
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done
        progress.add(stop - start)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(work, s) for s in range(0, n, chunk)]
        try:
            for fut in futures:
                fut.result()
        except BaseException:  # a bad image (or Ctrl-C): stop now, not after decoding the rest
            failed.set()  # the running chunks stop at their next image, whenever this thread gets the CPU
            for fut in futures:
                fut.cancel()
            raise


def build_cache(entry: CacheEntry, decode, *, threads: int | None = None) -> None:
    """Decode every image into ``entry``'s files. ``decode(i, out)`` writes image ``i`` into the
    ``(S, S, 3)`` uint8 view ``out`` (raising :class:`DataError` for an undecodable file).
    Call under the entry's lock (:func:`cached_images` does)."""
    entry.directory.mkdir(parents=True, exist_ok=True)
    _check_room(entry)
    remove_stale_temporaries(entry.directory, holding=entry.stem)
    tmp = entry.directory / f".{entry.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp.npy"
    t0 = time.time()
    crcs = np.zeros(entry.num_images, dtype="<u4")
    progress = BuildProgress(entry.owner_path, entry.num_images)
    try:
        # The header (and the file's full size) from numpy; pixels are written with pwrite from a
        # per-chunk buffer, so the builder never maps (and never holds resident) the whole array.
        header_only = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=entry.shape)
        del header_only
        offset = npy_size(tmp, entry.shape) - int(np.prod(entry.shape))
        fd = os.open(tmp, os.O_WRONLY)
        try:
            _decode_into(fd, entry, decode, offset, crcs, threads or decode_threads(), progress)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, entry.array_path)
        atomic_write(entry.crc_path, lambda t: Path(t).write_bytes(crcs.tobytes()))
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise DataError(f"field 'cache_dir': the image cache {str(entry.array_path)!r} could not be written "
                            f"({exc.strerror}); free space there, set cache_dir to a larger disk or lower "
                            f"image_size") from None
        raise
    finally:
        progress.close()
    seconds = time.time() - t0
    record = {"format": FORMAT_VERSION, "key": entry.key, "shape": list(entry.shape),
              "crc_file": zlib.crc32(crcs.tobytes()), "decoder": DECODER, "built": time.time(),
              "seconds": round(seconds, 3)}
    atomic_write_text(entry.record_path, json.dumps(record))
    line = json.dumps({"stem": entry.stem, "images": entry.num_images, "seconds": round(seconds, 3),
                       "pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    with open(entry.directory / BUILD_LOG, "a") as f:  # appended under the entry's lock
        f.write(line + "\n")


def _check_room(entry: CacheEntry) -> None:
    """A DataError, before anything is written, when ``entry``'s array cannot fit the free space
    of its directory (a large ``image_size`` grows it with the square: 100000 px is 30 GB per image)."""
    need = int(np.prod(entry.shape, dtype=np.float64)) + 4 * entry.num_images + (1 << 16)  # pixels, CRCs, header
    free = shutil.disk_usage(entry.directory).free
    if need > free:
        raise DataError(f"field 'image_size': the image cache of {entry.num_images} images at {entry.image_size} px "
                        f"needs {_size(need)} but {str(entry.directory)!r} has {_size(free)} free; "
                        f"allowed: a smaller image_size, or cache_dir on a larger disk")


def _size(nbytes: float) -> str:
    """``2.3 MiB``, ``30.0 GiB``: a size in a message."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _check_directory(directory: Path) -> None:
    """A DataError naming ``cache_dir`` when the cache folder is an existing file."""
    if directory.exists() and not directory.is_dir():
        raise DataError(f"field 'cache_dir': {str(directory)!r} is a file, not a folder; allowed: a writable "
                        f"folder (set cache_dir, or ${CACHE_ENV}, elsewhere)")


def cached_images(entry: CacheEntry, decode, *, threads: int | None = None,
                  wait_s: float = DEFAULT_WAIT_S) -> ImageMap:
    """``entry``'s images as a read-only memory map (:class:`ImageMap`), decoding them first if no valid cache exists
    (once per node: other processes wait on the lock, see :func:`~fedtune.data.cache_lock.acquire_build_lock`,
    and then read what it built)."""
    if check_cache(entry) is None:
        return open_cache(entry)
    _check_directory(entry.directory)
    try:
        entry.directory.mkdir(parents=True, exist_ok=True)
        lock = acquire_build_lock(entry.lock_path, entry.owner_path, wait_s=wait_s,
                                  what=f"the image cache {str(entry.array_path)!r}")
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


def cache_state(entry: CacheEntry) -> tuple[str, dict]:
    """``("reused", record)`` for a cache :func:`cached_images` will open as it is (the same check,
    pixels included), ``("building", owner)`` while another process holds its lock, else
    ``("to build", {"why": ...})``: what a run will do with ``entry``, and why it decodes
    (``"not built"``, or what :func:`check_cache` found wrong with the files there)."""
    from filelock import FileLock, Timeout  # lazy: keeps filelock out of this module's import

    problem = check_cache(entry)
    if problem is None:
        try:
            return "reused", json.loads(entry.record_path.read_text())
        except (OSError, ValueError):
            problem = "its record is unreadable"
    if entry.lock_path.exists():
        lock = FileLock(str(entry.lock_path))
        try:
            lock.acquire(timeout=0)
            lock.release()
        except Timeout:
            return "building", read_owner(entry.owner_path) or {}
        except OSError:
            pass
    return "to build", {"why": problem}


def build_log(directory: str | os.PathLike) -> list[dict]:
    """The records of every build in ``directory`` (``builds.log``), oldest first."""
    path = Path(directory) / BUILD_LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
