"""A client's examples, fetched batch by batch onto its device.

A client actor never holds a whole split on its device. :class:`Examples` is one split (train,
validation, a target shard): labels on the host, pixels fetched per batch by
:meth:`Examples.batch` (rows of the split, as a CPU int64 tensor) as a normalised float tensor
on the device, with the training augmentation applied on the device when one is given.

* :class:`CachedImages` (image-folder datasets): indices into the node's decoded-image cache
  (uint8 ``(N, S, S, 3)`` memory maps, :mod:`fedtune.data.cache`). A batch is gathered from the
  memory map into a pinned host buffer, copied to the device (non-blocking on CUDA), turned into
  float there, augmented (:mod:`fedtune.runtime.augment`), then normalised with the ImageNet
  mean/std. Private memory: the indices and labels, 16 bytes an image.
* :class:`TensorExamples` (the embedded and torchvision datasets: small, already normalised
  float arrays): rows gathered from a host tensor and copied to the device.

Both give the same values whatever the batch composition, so evaluation in fixed batches sums
to the same counts on any number of actors.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import torch

from fedtune.data.base import DomainDataset, Pieces
from fedtune.data.folder import IMAGENET_MEAN, IMAGENET_STD
# augment(x in [0, 1], generator) -> augmented x (fedtune.runtime.augment.DomainBedAugment)
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class Examples:
    """One split of a client's examples; see the module docstring."""

    labels: torch.Tensor  # int64, on the host
    # int64 per example, on the host: its domain's position in the dataset's domain list (a
    # client holding several source domains, domain_homogeneity > 0, can group a batch by domain)
    domains: torch.Tensor
    input_shape: tuple[int, ...]
    device: torch.device
    channels_last: bool = False

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, rows: torch.Tensor, augment: Augment | None = None,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` on the device for ``rows`` (positions in this split, a CPU int64 tensor)."""
        raise NotImplementedError

    @property
    def worth_prefetching(self) -> bool:
        """Whether a batch's fetch is work worth overlapping with the step (the local loop stages
        ahead only then): an image cache's gather, or any copy to a CUDA device. A CPU tensor's
        ``index_select`` costs less than the thread's hand-off (measured: the loop 15 % slower)."""
        return self.device.type == "cuda"

    def stage(self, rows: torch.Tensor, augmented: bool = False) -> Any:
        """The part of :meth:`batch` that draws no random number (``augmented``: whether
        :meth:`finish` will be given an augmentation): ``rows`` read from the host and copied to the
        device (on CUDA on a side stream, :func:`on_side_stream`). Safe to call from a background
        thread (:mod:`fedtune.algorithms.client.prefetch`) while the device trains."""
        raise NotImplementedError

    def finish(self, staged: Any, augment: Augment | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` from :meth:`stage`'s result, on the caller's stream: ``finish(stage(rows), a, g)``
        gives the bits of ``batch(rows, a, g)`` and draws the same random numbers from ``g``."""
        raise NotImplementedError

    def batches(self, batch_size: int, max_mib: float | None = None):
        """Every example in order, in batches of ``batch_size`` (evaluation), fewer where a batch's
        float32 inputs would pass ``max_mib`` MiB (:func:`rows_per_batch`)."""
        step = rows_per_batch(self, batch_size, max_mib)
        for start in range(0, len(self), step):
            yield self.batch(torch.arange(start, min(start + step, len(self))))

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel minimum and maximum of the (normalised, un-augmented) inputs, on the host."""
        raise NotImplementedError

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x.contiguous()


class TensorExamples(Examples):
    """Examples held as a float tensor ``x`` (already normalised) and labels ``y``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device | str = "cpu",
                 channels_last: bool = False, domains: torch.Tensor | None = None):
        self.x, self.labels = x, y.to("cpu", torch.int64)
        self.domains = torch.zeros(len(y), dtype=torch.int64) if domains is None else domains.to("cpu", torch.int64)
        self.input_shape = tuple(x.shape[1:])
        self.device, self.channels_last = torch.device(device), channels_last

    def batch(self, rows, augment=None, generator=None):
        if augment is not None:
            raise ValueError("augmentation needs image-folder examples (CachedImages)")
        rows = rows.to(self.x.device)
        return (self._finish(self.x.index_select(0, rows).to(self.device)),
                self.labels.index_select(0, rows.cpu()).to(self.device))

    def stage(self, rows, augmented=False):
        def copy():
            at = rows.to(self.x.device)
            return (self.x.index_select(0, at).to(self.device, non_blocking=True),
                    self.labels.index_select(0, rows.cpu()).to(self.device, non_blocking=True))
        return on_side_stream(self.device, copy)

    def finish(self, staged, augment=None, generator=None):
        if augment is not None:
            raise ValueError("augmentation needs image-folder examples (CachedImages)")
        x, y = arrived(staged)
        return self._finish(x), y

    def value_range(self):
        if len(self.x) == 0:
            return torch.zeros(0), torch.zeros(0)
        dims = [d for d in range(self.x.dim()) if d != 1] if self.x.dim() > 2 else [0]
        return self.x.amin(dim=dims).cpu(), self.x.amax(dim=dims).cpu()


class CachedImages(Examples):
    """Rows of the cache's uint8 ``(N, S, S, 3)`` maps (:class:`fedtune.data.cache.ImageMap`, one
    per domain piece), fetched per batch; the pages read are released from this process's mapping
    once copied (they stay in the node's page cache)."""

    def __init__(self, maps: list[Any], rows: list[np.ndarray], labels: np.ndarray,
                 device: torch.device | str = "cpu", channels_last: bool = False,
                 domains: np.ndarray | None = None):
        self.maps = maps
        self.piece = np.concatenate([np.full(len(r), k, np.int32) for k, r in enumerate(rows)]) \
            if rows else np.zeros(0, np.int32)
        self.row = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        self.domains = (torch.zeros(len(self.labels), dtype=torch.int64) if domains is None else
                        torch.from_numpy(np.asarray(domains, dtype=np.int64)))
        side = maps[0].array.shape[1] if maps else 0
        self.input_shape = (3, side, side)
        self.device, self.channels_last = torch.device(device), channels_last
        self.mean = torch.from_numpy(IMAGENET_MEAN).to(self.device).view(1, 3, 1, 1)
        self.std = torch.from_numpy(IMAGENET_STD).to(self.device).view(1, 3, 1, 1)
        self._pinned = self.device.type == "cuda"

    def gather(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 ``(len(rows), S, S, 3)`` of ``rows`` (positions in this split), read from the maps."""
        pieces, where = self.piece[rows], self.row[rows]
        if out is None:
            out = np.empty((len(rows), *self.maps[0].array.shape[1:]), np.uint8) if self.maps else \
                np.zeros((0, 0, 0, 3), np.uint8)
        for k in np.unique(pieces):
            sel = np.nonzero(pieces == k)[0]
            if len(sel) == len(rows):  # one domain piece: straight into out
                self.maps[k].read(where, out=out)
            else:
                out[sel] = self.maps[k].read(where[sel])  # checked on first read, pages released
        return out

    def _host_buffer(self, n: int) -> torch.Tensor:
        """A pinned staging buffer for ``n`` rows (CUDA devices only)."""
        return _STAGING.buffer((n, *self.maps[0].array.shape[1:]))

    worth_prefetching = True  # the cache map gather and the float conversion: real host work

    def batch(self, rows, augment=None, generator=None):
        """One float32 buffer per batch, filled from uint8 and normalised in place (the batch's only
        float copy; an un-augmented batch is allocated in its final memory format, so ``_finish``
        copies nothing). On the host the uint8 rows are gathered in chunks of :data:`GATHER_ROWS`
        through one reused buffer; on CUDA through the pinned double buffers, a batch at a time.
        An augmented batch keeps the channels-last strides ``permute().float()`` gave it before
        (the augmentation's reductions then add in the same order: the same bits)."""
        r = rows.cpu().numpy()
        n, side = len(r), self.input_shape[1]
        x = self._empty(n, augment is not None)
        if self._pinned:
            host = self._host_buffer(n)
            self.gather(r, host.numpy())
            x.copy_(host.to(self.device, non_blocking=True).permute(0, 3, 1, 2))
            _STAGING.copied()
        else:
            for start in range(0, n, GATHER_ROWS):
                part = r[start:start + GATHER_ROWS]
                chunk = _gather_buffer((len(part), side, side, 3))
                self.gather(part, chunk.numpy())
                x[start:start + len(part)].copy_(chunk.permute(0, 3, 1, 2))
        return self._normalised(x, augment, generator), self.labels.index_select(0, rows.cpu()).to(self.device)

    def stage(self, rows, augmented=False):
        """On the host, the batch as far as no random number is drawn (a fresh array gathered, so
        a background thread never shares a buffer with the loop: float, scaled to [0, 1], and
        normalised too when ``augmented`` is false). On CUDA the uint8 ``(n, S, S, 3)`` rows through
        the prefetch's own pinned buffers (:data:`_PREFETCH_STAGING`), copied on the side stream
        (the float work is the device's, launched by :meth:`finish`). Labels with either."""
        r = rows.cpu().numpy()
        if not self._pinned:
            x = self._empty(len(r), augmented)
            x.copy_(torch.from_numpy(self.gather(r)).permute(0, 3, 1, 2))  # uint8 -> float32: exact
            x.div_(255.0)
            if not augmented:
                x = self._normalised(x, None, None, scaled=True)
            return (x, self.labels.index_select(0, rows.cpu()), "scaled" if augmented else "done"), None

        def copy():
            with _PREFETCH_STAGING.lock:
                host = _PREFETCH_STAGING.buffer((len(r), *self.maps[0].array.shape[1:]))
                self.gather(r, host.numpy())
                pixels = host.to(self.device, non_blocking=True)
                _PREFETCH_STAGING.copied()
            y = self.labels.index_select(0, rows.cpu()).to(self.device, non_blocking=True)
            return pixels, y, "uint8"
        return on_side_stream(self.device, copy)

    def finish(self, staged, augment=None, generator=None):
        x, y, kind = arrived(staged)
        if kind != "uint8" and (kind == "done") != (augment is None):
            raise ValueError("a batch staged for another augmentation setting")
        if kind == "uint8":
            pixels, x = x, self._empty(len(y), augment is not None)
            x.copy_(pixels.permute(0, 3, 1, 2))  # uint8 -> float32 is exact: the bits of batch()
        return (x if kind == "done" else self._normalised(x, augment, generator, scaled=kind == "scaled")), y

    def _empty(self, n: int, augmented: bool) -> torch.Tensor:
        side = self.input_shape[1]
        layout = torch.channels_last if (augmented or self.channels_last) else torch.contiguous_format
        return torch.empty((n, 3, side, side), dtype=torch.float32, device=self.device, memory_format=layout)

    def _normalised(self, x: torch.Tensor, augment: Augment | None, generator: torch.Generator | None,
                    scaled: bool = False) -> torch.Tensor:
        """``x`` (float32 pixel values 0..255, or already divided by 255: ``scaled``) scaled to
        [0, 1], augmented, normalised."""
        if not scaled:
            x.div_(255.0)
        if augment is not None:
            x = augment(x, generator)
        x.sub_(self.mean).div_(self.std)
        return self._finish(x)

    def value_range(self):
        lo = np.full(3, 255, np.uint8)
        hi = np.zeros(3, np.uint8)
        for start in range(0, len(self), 1024):
            chunk = self.gather(np.arange(start, min(start + 1024, len(self))))
            lo = np.minimum(lo, chunk.min(axis=(0, 1, 2)))
            hi = np.maximum(hi, chunk.max(axis=(0, 1, 2)))
        to = lambda v: torch.from_numpy((v.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD)  # noqa: E731
        return to(lo), to(hi)


class _PinnedStaging:
    """The process's two pinned host buffers for batches on their way to a CUDA device, used in
    turn: a batch is gathered into one while the copy of the previous batch from the other may
    still run; before a buffer is reused, the CUDA event recorded after its last copy is waited
    on. One pair per process (a client actor fetches one batch at a time), grown as needed."""

    def __init__(self) -> None:
        self.slots: list[list[Any]] = [[None, None], [None, None]]  # [pinned uint8 buffer, event]
        self.turn = 0
        self.lock = threading.Lock()  # the prefetch's pair: one prefetch thread at a time uses it

    def buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        self.turn ^= 1
        slot = self.slots[self.turn]
        if slot[1] is not None:
            slot[1].synchronize()  # the copy that last read this buffer has finished
        size = int(np.prod(shape))
        if slot[0] is None or slot[0].numel() < size:
            slot[0] = torch.empty(size, dtype=torch.uint8).pin_memory()
        return slot[0][:size].view(shape)

    def copied(self) -> None:
        """Record that the current buffer's copy to the device has been queued."""
        event = torch.cuda.Event()
        event.record()
        self.slots[self.turn][1] = event


_STAGING = _PinnedStaging()
_PREFETCH_STAGING = _PinnedStaging()  # the prefetch threads' pair (the loop's thread keeps _STAGING)
_SIDE_STREAMS: dict[Any, Any] = {}  # device -> the process's copy stream for prefetched batches


def on_side_stream(device: torch.device, copy: Callable[[], Any]) -> tuple[Any, Any]:
    """``(copy(), event)``: on CUDA ``copy`` runs on the process's side stream for ``device`` and
    ``event`` marks its end (:func:`arrived` makes the consumer's stream wait for it); elsewhere
    ``(copy(), None)``."""
    if device.type != "cuda":
        return copy(), None
    with _STREAM_LOCK:
        stream = _SIDE_STREAMS.get(device)
        if stream is None:
            stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        out = copy()
        event = torch.cuda.Event()
        event.record(stream)
    return out, event


def arrived(staged: tuple[Any, Any]) -> Any:
    """The tensors (first) of :func:`on_side_stream`, usable on the current stream: it waits (on the
    device, the host does not block) for the side stream's copy, and each tensor is marked as used
    by it so the allocator does not hand its memory out before the current stream is done with it."""
    tensors, event = staged
    if event is None:
        return tensors
    stream = torch.cuda.current_stream(tensors[0].device)
    stream.wait_event(event)
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.record_stream(stream)
    return tensors


_STREAM_LOCK = threading.Lock()

GATHER_ROWS = 32
"""Rows a host batch gathers from the cache at a time (a few MB of uint8 at 224 px)."""
_GATHER: list[torch.Tensor] = []  # the process's one uint8 gather buffer, grown as needed


def _gather_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    size = int(np.prod(shape))
    if not _GATHER or _GATHER[0].numel() < size:
        _GATHER[:] = [torch.empty(size, dtype=torch.uint8)]
    return _GATHER[0][:size].view(shape)


def rows_per_batch(examples: Examples, batch_size: int, max_mib: float | None) -> int:
    """``batch_size``, lowered so that a batch's float32 inputs hold at most ``max_mib`` MiB (at
    least one example a batch): evaluation's memory then stays flat whatever the image size.

    >>> ex = TensorExamples(torch.zeros(4, 3, 224, 224), torch.zeros(4))
    >>> rows_per_batch(ex, 256, 128.0), rows_per_batch(ex, 64, 128.0), rows_per_batch(ex, 256, None)
    (222, 64, 256)
    >>> rows_per_batch(TensorExamples(torch.zeros(1, 3, 448, 448), torch.zeros(1)), 256, 160.0)
    69
    """
    if max_mib is None:
        return batch_size
    per_example = 4 * int(np.prod(examples.input_shape)) or 1
    return max(1, min(batch_size, int(max_mib * 2**20) // per_example))


def client_examples(dataset: DomainDataset, pieces: Pieces, device: torch.device | str = "cpu",
                    channels_last: bool = False) -> Examples:
    """The examples ``pieces`` of ``dataset``: :class:`CachedImages` for datasets with a
    decoded-image cache (``pixels(domain)``, an :class:`~fedtune.data.cache.ImageMap`), else :class:`TensorExamples` of ``load_pieces``."""
    pixels = getattr(dataset, "pixels", None)
    position = {d: k for k, d in enumerate(dataset.info.domains)}
    domains = np.concatenate([np.full(len(idx), position.get(d, -1), np.int64) for d, idx in pieces.items()]
                             + [np.zeros(0, np.int64)])
    if pixels is None:
        x, y = dataset.load_pieces(pieces)
        return TensorExamples(torch.from_numpy(x), torch.from_numpy(y), device, channels_last, torch.from_numpy(domains))
    maps, rows, labels = [], [], []
    for domain, idx in pieces.items():
        if len(idx) == 0:
            continue
        dataset.check_domain(domain)
        domain_labels = dataset.labels(domain)
        idx = dataset.check_indices(domain, np.asarray(idx, dtype=np.int64), len(domain_labels))
        maps.append(pixels(domain))
        rows.append(idx)
        labels.append(domain_labels[idx])
    if not maps:
        side = dataset.info.input_shape[-1]
        return TensorExamples(torch.zeros((0, 3, side, side)), torch.zeros(0, dtype=torch.int64), device, channels_last)
    return CachedImages(maps, rows, np.concatenate(labels), device, channels_last, domains)
