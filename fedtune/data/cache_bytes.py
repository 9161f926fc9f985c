"""The bytes of a decoded-image cache file: the size a uint8 ``.npy`` of a shape must have, and the
first of its rows (images) whose CRC-32 is not the recorded one (:mod:`fedtune.data.cache`).

NumPy's ``.npy`` header reader and zlib's CRC-32 do the work; what is written here is reading
the rows in 8 MiB blocks, so a check never holds a large array in memory.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np


def npy_size(path: Path, shape: tuple[int, ...]) -> int | None:
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


def first_bad_row(path: Path, offset: int, row_bytes: int, crcs: np.ndarray) -> int | None:
    """The first row of the array at ``offset`` in ``path`` whose CRC-32 is not ``crcs[row]``."""
    per_block = max(1, (8 << 20) // max(row_bytes, 1))
    with open(path, "rb") as f:
        f.seek(offset)
        for start in range(0, len(crcs), per_block):
            block = f.read(row_bytes * min(per_block, len(crcs) - start))
            view = memoryview(block)
            for j in range(len(block) // row_bytes):
                if zlib.crc32(view[j * row_bytes:(j + 1) * row_bytes]) != int(crcs[start + j]):
                    return start + j
    return None
