"""Arrays placed where a test needs them in memory."""

from __future__ import annotations

import numpy as np


def off_line(shape, dtype, offset: int) -> np.ndarray:
    """A zeroed array whose data starts `offset` bytes past a 64-byte line (numpy's own buffers
    often sit 16 or 48 bytes in): for kernels that take another path on rows off a line."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    storage = np.zeros(nbytes + 128, np.uint8)
    start = (-storage.ctypes.data) % 64 + offset
    return storage[start:start + nbytes].view(dtype).reshape(shape)
