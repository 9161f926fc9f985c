"""One pass over a ``[rows, M]`` float32 matrix in fixed column blocks: the server's kernels.

Every server rule reads the round's ``[U, M]`` updates (``M`` up to tens of millions) through
the functions here, and only here:

* :func:`weighted_rows` — ``out = base + scale · (offset + Σ_u w_u x_u)``: FedAvg's step, every
  weighted sum and the last step of FedOMG; :class:`RowSum`, the same sum fed one row at a time;
* :func:`gram_pass` — the Gram matrix ``X Xᵀ`` *and* the weighted sum ``wᵀX`` in one read
  (FedOMG's step 1 and ``g_FL``);
* :func:`cross_pass` — user-defined per-block products reduced over the blocks (auto-β's
  estimators: :mod:`fedtune.algorithms.server.fedgp_auto_beta`);
* :func:`subtract_rows` — the coordinator's updates ``Δ_u = θ_u − θ`` from the clients' states.

How. Columns are cut into blocks of a fixed width (:func:`column_blocks`, from the row count
only); each block is copied to a float64 scratch and handed to BLAS with **one BLAS thread**
(``dsyrk``/``dgemm`` for products). Products are accumulated in float64 block by block. Weighted
sums over the rows take no BLAS: each column's float64 accumulator adds the rows one after
another (:func:`accumulate_row`), so a sum of rows that arrive one at a time is the same bits.

Threads. With ``threads > 1`` (the coordinator's ``coordinator_cpus``) the blocks are dealt out
in fixed *chunks* of consecutive blocks, one chunk per task, and the chunks' partial results
are added in chunk order — so results are **bit-identical for every thread count** (and
every backend, actor count and process): they depend only on the shapes. BLAS itself never
runs multi-threaded: threaded ``dsyrk`` splits the inner sums differently from one thread
(different bits). What the threads buy: ``benchmarks/fedomg_server.py``.

Memory: a float64 scratch of about :data:`SCRATCH_ELEMS` elements (8 MiB) per thread; the
``[rows, M]`` input is never copied whole.
"""

from __future__ import annotations

import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

F64 = np.float64
SCRATCH_ELEMS = 1 << 20  # float64 elements per block scratch (8 MiB: L3, not L2; long rows beat call overhead)
CHUNK_COLS = 1 << 18  # about this many columns per chunk, the unit of work of one thread (45 for M = 11.7M)
MIN_WIDTH = 256  # narrowest block (U > 4096 rows): BLAS needs some depth to be efficient

_blas_controller: Any = None


def one_blas_thread() -> contextlib.AbstractContextManager:
    """NumPy's BLAS limited to one thread for a ``with`` block (threadpoolctl). The passes here
    run BLAS on blocks, several blocks at once when they have threads: a multi-threaded BLAS
    would oversubscribe the cores (OpenBLAS threads spin: 10–30× slower on a busy 2-core
    machine) and change the bits of ``dsyrk``."""
    global _blas_controller
    try:
        if _blas_controller is None:
            from threadpoolctl import ThreadpoolController  # lazy: keeps threadpoolctl out of this module's import

            _blas_controller = ThreadpoolController()
        return _blas_controller.limit(limits=1, user_api="blas")
    except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - threadpoolctl unusable
        return contextlib.nullcontext()


# ============================================================================== blocks and chunks
@dataclass(frozen=True)
class ColumnBlocks:
    """Columns ``[0, size)`` cut into blocks of ``width`` (the last one shorter), grouped in
    chunks of ``per_chunk`` consecutive blocks. A pure function of the shapes: the results of the
    passes depend on it, never on how many threads ran the chunks."""

    size: int
    width: int
    per_chunk: int

    @property
    def num_chunks(self) -> int:
        return max(1, math.ceil(self.size / (self.width * self.per_chunk)))

    def blocks(self, chunk: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of the blocks of ``chunk``."""
        first = chunk * self.per_chunk * self.width
        last = min(self.size, first + self.per_chunk * self.width)
        for s in range(first, last, self.width):
            yield s, min(s + self.width, last)


def column_blocks(size: int, rows: int, scratch_elems: int | None = None) -> ColumnBlocks:
    """Blocks of ``rows × width`` float64 about ``scratch_elems`` elements (width a multiple of
    64, at least :data:`MIN_WIDTH`), chunks of about :data:`CHUNK_COLS` columns.

    >>> column_blocks(10_000_000, 100)
    ColumnBlocks(size=10000000, width=10432, per_chunk=25)
    """
    elems = SCRATCH_ELEMS if scratch_elems is None else int(scratch_elems)
    width = max(MIN_WIDTH, (elems // max(int(rows), 1)) // 64 * 64)
    return ColumnBlocks(int(size), width, max(1, CHUNK_COLS // width))


class Scratch:
    """Float64 scratch arrays kept per thread for the length of one pass (allocated once per
    thread, not once per chunk: an 8 MiB array is 2,048 fresh pages)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        arrays = self._local.__dict__.setdefault("arrays", {})
        buf = arrays.get(name)
        if buf is None or buf.shape != shape:
            buf = arrays[name] = np.empty(shape, F64)
        return buf


def map_chunks(plan: ColumnBlocks, work: Callable[[int], Any], threads: int = 1) -> Iterator[Any]:
    """``work(chunk)`` for every chunk, yielded in chunk order, run on up to ``threads`` threads
    (NumPy and BLAS release the GIL). The caller reduces in the order yielded."""
    n = plan.num_chunks
    threads = max(1, min(int(threads), n))
    if threads == 1:
        yield from (work(c) for c in range(n))
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="fedtune-server") as pool:
        yield from pool.map(work, range(n))


def _check_rows(matrix: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"expected a [rows, M] matrix, got shape {matrix.shape}")
    if weights is not None:
        weights = np.asarray(weights, dtype=F64)
        if weights.shape != (matrix.shape[0],):
            raise ValueError(f"matrix {matrix.shape} and weights {weights.shape} disagree on the row count")
    return matrix, weights


# ============================================================================== weighted sums
# Weighted sums read each element once and do 1 multiply and 1 add with it: memory-bound.
# Their order is the streamed order: row after row, each column's float64 accumulator taking
# ``w_u · x_u`` (NumPy's elementwise multiply and add, each exactly rounded), so a sum made on
# the whole matrix and one made as rows arrive (:class:`RowSum`, the coordinator's streamed
# FedAvg) are the same bits, for any block width, thread count, backend or actor count.
SUM_WIDTH = 32768  # columns per block (a float64 accumulator of 256 KiB: L2)


def sum_blocks(size: int, rows: int) -> ColumnBlocks:
    """Column blocks of :func:`weighted_rows` (``rows`` no longer matters: the order is row after
    row in any block).

    >>> sum_blocks(10_000_000, 100)
    ColumnBlocks(size=10000000, width=32768, per_chunk=8)
    """
    return ColumnBlocks(int(size), SUM_WIDTH, max(1, CHUNK_COLS // SUM_WIDTH))


def accumulate_row(acc: np.ndarray, row: np.ndarray, weight: float, tmp: np.ndarray) -> None:
    """``acc += weight · float64(row)`` (the one step of every weighted sum; ``tmp`` float64 like
    ``acc``): the multiply rounds, then the add. The weight is made a float64 scalar: a Python
    float times a float32 array would multiply in float32 (NumPy 2's promotion)."""
    np.multiply(row, F64(weight), out=tmp)
    acc += tmp


def weighted_rows(matrix: np.ndarray, weights: np.ndarray, out: np.ndarray, *, base: np.ndarray | None = None,
                  scale: float = 1.0, offset: np.ndarray | None = None, rows: Sequence[int] | None = None,
                  threads: int = 1) -> np.ndarray:
    """``out = base + scale · (offset + Σ_k weights[k] · matrix[rows[k]])`` (terms left out when
    None; ``rows=None``: every row, ``weights`` one per row), into ``out`` (float32 or float64).

    The sum is float64, row after row in the order given (:func:`accumulate_row`, from ``offset``
    or 0): the bits of :class:`RowSum` fed the same rows, and the same for any ``threads`` (they
    only split columns).

    >>> weighted_rows(np.array([[1., 2.], [3., 4.]], np.float32), np.array([.25, .75]), np.empty(2))
    array([2.5, 3.5])
    >>> weighted_rows(np.array([[1., 2.]], np.float32), np.array([2.0]), np.empty(2), base=np.ones(2), scale=0.5)
    array([2., 3.])
    """
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"expected a [rows, M] matrix, got shape {matrix.shape}")
    weights = np.asarray(weights, dtype=F64)
    idx = list(range(matrix.shape[0])) if rows is None else [int(r) for r in rows]
    count = len(idx)
    if weights.shape != (count,):
        raise ValueError(f"{count} rows to sum but {weights.shape} weights")
    m = matrix.shape[1]
    if out.shape != (m,):
        raise ValueError(f"out has shape {out.shape}, the rows {m} entries")
    plan = sum_blocks(m, count)
    scale = float(scale)
    scratch = Scratch()

    def work(chunk: int) -> None:
        acc_buf = scratch.get("acc", (plan.width,))
        tmp_buf = scratch.get("tmp", (plan.width,))
        for s, e in plan.blocks(chunk):
            w = e - s
            acc, tmp = acc_buf[:w], tmp_buf[:w]
            if offset is not None:
                acc[:] = offset[s:e]
            else:
                acc[:] = 0.0
            for k, r in enumerate(idx):
                accumulate_row(acc, matrix[r, s:e], weights[k], tmp)
            if scale != 1.0:
                acc *= scale
            if base is not None:
                acc += base[s:e]
            out[s:e] = acc

    for _ in map_chunks(plan, work, threads):
        pass
    return out


class RowSum:
    """A weighted sum of rows fed one at a time (the coordinator's streamed aggregation: each
    client's update is added as it arrives and dropped): ``total = Σ_u w_u x_u`` in float64, the
    bits of :func:`weighted_rows` over the same rows in the same order.

    >>> acc = RowSum(2)
    >>> acc.add(np.array([1., 2.], np.float32), 0.25); acc.add(np.array([3., 4.], np.float32), 0.75)
    >>> acc.total
    array([2.5, 3.5])
    """

    BLOCK = 1 << 21  # elements per multiply-add (a 16 MiB scratch at most; fewer calls for small models)

    def __init__(self, size: int):
        self.total = np.zeros(int(size), F64)
        self._block = max(1, min(int(size), self.BLOCK))
        self._tmp = np.empty(self._block, F64)
        self.rows = 0

    def add(self, row: np.ndarray, weight: float) -> None:
        if row.shape != self.total.shape:
            raise ValueError(f"row has shape {row.shape}, the sum {self.total.shape}")
        for s in range(0, len(row), self._block):  # elementwise: any block gives the same bits
            e = min(s + self._block, len(row))
            accumulate_row(self.total[s:e], row[s:e], weight, self._tmp[:e - s])
        self.rows += 1


def subtract_rows(rows: Sequence[np.ndarray], vector: np.ndarray, out: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """``out[u] = rows[u][:len(vector)] − vector`` for every ``u`` (the coordinator's updates
    ``Δ_u = θ_u − θ`` from the clients' states), rows dealt out to ``threads`` threads; elementwise,
    so the same bits for any count.

    >>> subtract_rows([np.array([3., 4., 9.]), np.array([1., 1., 9.])], np.array([1., 2.]), np.empty((2, 2)))
    array([[ 2.,  2.],
           [ 0., -1.]])
    """
    size = len(vector)
    if out.shape != (len(rows), size):
        raise ValueError(f"out has shape {out.shape}, expected {(len(rows), size)}")

    def work(u: int) -> None:
        np.subtract(rows[u][:size], vector, out=out[u])

    threads = max(1, min(int(threads), len(rows)))
    if threads == 1:
        for u in range(len(rows)):
            work(u)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="fedtune-server") as pool:
            list(pool.map(work, range(len(rows))))
    return out


# ============================================================================== products
def gram_pass(matrix: np.ndarray, weights: np.ndarray | None = None, *, threads: int = 1,
              scratch_elems: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(G, g)``: the Gram matrix ``G = X Xᵀ`` (float64 ``[U, U]``, exactly symmetric) and, with
    ``weights``, ``g = Σ_u w_u x_u`` (float64 ``[M]``), in one read of ``X``.

    Each block ``B`` (``U × width`` columns, copied to float64) adds ``B Bᵀ`` (``dsyrk``) to its
    chunk's partial ``G`` and writes ``g``'s block (its rows one after another, the order of
    :func:`weighted_rows`); chunks' partials are added in
    chunk order. Products of float32 numbers are exact in float64, so the only rounding is the
    float64 accumulation (relative error ≲ 1e-13 for M = 10⁷). Cost ``U² M / 2`` multiply-adds.

    >>> G, g = gram_pass(np.array([[1., 2.], [3., 4.]], np.float32), np.array([.5, .5]))
    >>> G, g
    (array([[ 5., 11.],
           [11., 25.]]), array([2., 3.]))
    """
    matrix, weights = _check_rows(matrix, weights)
    num, m = matrix.shape
    gram = np.zeros((num, num), F64)
    g = None if weights is None else np.zeros(m, F64)
    if num == 0 or m == 0:
        return gram, g
    plan = column_blocks(m, num, scratch_elems)
    scratch = Scratch()

    def work(chunk: int) -> np.ndarray:
        part = np.zeros((num, num), F64)
        buf = scratch.get("block", (num, plan.width))
        for s, e in plan.blocks(chunk):
            blk = buf[:, :e - s]
            np.copyto(blk, matrix[:, s:e])
            part += blk @ blk.T
            if g is not None:  # weighted_rows' order: row after row
                acc, tmp = g[s:e], scratch.get("tmp", (plan.width,))[:e - s]
                for u in range(num):
                    accumulate_row(acc, blk[u], weights[u], tmp)
        return part

    with one_blas_thread():
        for part in map_chunks(plan, work, threads):
            gram += part
    return gram, g


def cross_pass(matrices: Sequence[np.ndarray], block_products: Callable[..., tuple[np.ndarray, ...]], *,
               extra_rows: int = 0, threads: int = 1, scratch_elems: int | None = None) -> tuple[np.ndarray, ...]:
    """``Σ_blocks block_products(blocks, scratch)``, added in block order, in one read of ``matrices``.

    ``matrices``: arrays ``[rows_k, M]`` with the same ``M``. For each column block ``[s, e)``,
    ``block_products(blocks, scratch)`` gets the views ``matrix_k[:, s:e]`` and a C-contiguous
    float64 scratch of ``Σ rows_k + extra_rows`` rows and ``e − s`` columns to work in, and returns
    a tuple of float64 arrays (the same shapes for every block); the result is their sums.
    Bit-identical for any ``threads``.

    >>> x = np.array([[1., 2.], [3., 4.]], np.float32)
    >>> cross_pass([x], lambda blocks, z: (blocks[0].astype(float).sum(axis=1),))
    (array([3., 7.]),)
    """
    matrices = [_check_rows(mat)[0] for mat in matrices]
    if not matrices or len({mat.shape[1] for mat in matrices}) != 1:
        raise ValueError(f"cross_pass needs matrices with one column count, got {[mat.shape for mat in matrices]}")
    num = sum(mat.shape[0] for mat in matrices) + int(extra_rows)
    m = matrices[0].shape[1]
    if m == 0:
        raise ValueError("cross_pass needs at least one column")
    plan = column_blocks(m, num, scratch_elems)
    scratch = Scratch()

    def work(chunk: int) -> tuple[np.ndarray, ...] | None:
        buf = scratch.get("block", (num, plan.width))
        total: list[np.ndarray] | None = None
        for s, e in plan.blocks(chunk):
            # a full-width block gets the contiguous scratch; the last one its own contiguous array
            z = buf if e - s == plan.width else np.empty((num, e - s), F64)
            parts = block_products([mat[:, s:e] for mat in matrices], z)
            if total is None:
                total = [np.array(p, dtype=F64) for p in parts]
            else:
                for t, p in zip(total, parts):
                    t += p
        return None if total is None else tuple(total)

    result: list[np.ndarray] | None = None
    with one_blas_thread():
        for part in map_chunks(plan, work, threads):
            if part is None:
                continue
            if result is None:
                result = list(part)
            else:
                for r, p in zip(result, part):
                    r += p
    assert result is not None
    return tuple(result)


__all__ = ["CHUNK_COLS", "ColumnBlocks", "SCRATCH_ELEMS", "Scratch", "column_blocks", "cross_pass", "gram_pass", "map_chunks",
           "one_blas_thread", "RowSum", "subtract_rows", "sum_blocks", "weighted_rows"]
