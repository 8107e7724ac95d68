"""TPU memory-layout arithmetic shared by every planning stage.

Mosaic lays the last two dimensions of a VMEM (and HBM) array out in tiles of
[sublanes, 128 lanes]; the sublane count depends on the element width: 8 rows
for 32-bit types, 16 for bf16 (two rows packed per 32-bit sublane). A buffer's
*padded* size is its size after rounding those two dimensions up to the tile,
which is what it really occupies.
"""

from __future__ import annotations

import functools
import math

from megakernel.ir.types import DType

LANES = 128

# Element dtypes a plan can name. Semaphores have no bytes of their own in
# VMEM; they are counted, not sized.
ITEMSIZE = {"float32": 4, "bfloat16": 2, "int32": 4, "dma_semaphore": 0,
            "semaphore": 0, "barrier_semaphore": 0}
SUBLANES = {"float32": 8, "bfloat16": 16, "int32": 8}


def dtype_name(dtype: "DType | str") -> str:
    return dtype.value if isinstance(dtype, DType) else str(dtype)


@functools.lru_cache(maxsize=None)
def itemsize(dtype: "DType | str") -> int:
    return ITEMSIZE[dtype_name(dtype)]


@functools.lru_cache(maxsize=None)
def sublanes(dtype: "DType | str") -> int:
    """Rows of one native [sublanes, 128] tile for this element width."""
    return SUBLANES[dtype_name(dtype)]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_shape(shape: tuple[int, ...], dtype: "DType | str") -> tuple[int, ...]:
    """``shape`` with its last dim rounded to 128 lanes and its second-to-last
    to the dtype's sublane count (a 1-D shape is laid out as one row)."""
    if not shape:
        return (sublanes(dtype), LANES)
    if len(shape) == 1:
        return (sublanes(dtype), round_up(shape[0], LANES))
    *lead, rows, cols = shape
    return (*lead, round_up(rows, sublanes(dtype)), round_up(cols, LANES))


@functools.lru_cache(maxsize=65536)
def padded_bytes(shape: tuple[int, ...], dtype: "DType | str") -> int:
    """Bytes a VMEM/HBM array of ``shape`` occupies once tiled."""
    return math.prod(padded_shape(shape, dtype)) * itemsize(dtype)


def smem_bytes(shape: tuple[int, ...], dtype: "DType | str" = "int32") -> int:
    """SMEM holds 32-bit words; we round each array up to 128 words so the
    count is conservative whatever padding Mosaic applies."""
    return round_up(max(math.prod(shape), 1), LANES) * max(itemsize(dtype), 4)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"
