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

from megakernel import dtypes
from megakernel.ir.types import DType

LANES = 128


def dtype_name(dtype: "DType | str") -> str:
    return dtype.value if isinstance(dtype, DType) else str(dtype)


@functools.lru_cache(maxsize=None)
def itemsize(dtype: "DType | str") -> int:
    """Bytes per element in VMEM (megakernel/dtypes.py; 0 for semaphores)."""
    return dtypes.of(dtype_name(dtype)).itemsize


@functools.lru_cache(maxsize=None)
def sublanes(dtype: "DType | str") -> int:
    """Rows of one native [sublanes, 128] tile for this element width (pltpu)."""
    return dtypes.sublanes(dtype_name(dtype))


def per_word(dtype: "DType | str") -> int:
    """Elements of ``dtype`` in one 32-bit word (1 for f32, 2 for bf16, 4 for int8)."""
    bits = dtypes.of(dtype_name(dtype)).bits
    if not bits or 32 % bits:
        raise ValueError(f"{dtype_name(dtype)} does not pack into 32-bit words")
    return 32 // bits


def word_rows(rows: int, dtype: "DType | str") -> int:
    """Rows of 32-bit words holding ``rows`` rows of ``dtype`` packed along rows
    (the weight ring's layout: ``pltpu.bitcast`` unpacks them)."""
    per = per_word(dtype)
    if rows % per:
        from megakernel.errors import PlanningError

        raise PlanningError(f"{rows} rows of {dtype_name(dtype)} do not fill whole 32-bit "
                            f"words ({per} rows per word)", path="plan.ring",
                            hint="a streamed weight needs a row count divisible by that")
    return rows // per


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


# What Mosaic keeps in VMEM beyond the buffers a kernel declares: the values the
# kernel computes on, when they do not fit the 64 vector registers. The plan
# counts them as MemoryPlan.values_bytes = VALUES_BASE + WEIGHT_CHUNK_BYTES +
# VALUES_SPILLED x the most any op holds with the tensors live around it
# (plan_buffers.layer_buffers, the kernel libraries' value_bytes).
#
# WEIGHT_CHUNK_BYTES: weight bytes one MXU pass loads (runtime.matmul_ref). The
# compiler hoists the loads of a tile's chunks ahead of their dots and keeps
# them in VMEM: measured with libtpu 0.0.51 on qwen3-32b/8 (tiles folded into 25
# pieces), 64 KiB chunks compile to 1.5 MiB above the declared buffers, 128 and
# 256 KiB chunks to 4.2 MiB. VALUES_BASE: the smallest kernels (tiny-dense on 2
# cores, tiny-moe on 4) compile to 0.27 and 0.31 MiB above what they declare.
# VALUES_SPILLED: fitted over the zoo at batch 1 (docs/planner.md has the
# table): the compiled figure is then within 1 MiB of the plan for every model.
WEIGHT_CHUNK_BYTES = 64 * 1024
VALUES_BASE = 320 * 1024
VALUES_SPILLED = 0.5
