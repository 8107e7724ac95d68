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
from megakernel.registry import Registry

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


def row_align(dtype: "DType | str") -> int:
    """Token rows per HBM tile of a cache (8 for 32-bit, 16 for bf16, 32 for
    8-bit): a DMA into tiled HBM must start on one."""
    return max(8, 32 // itemsize(dtype))


def append_window(rows: int, dtype: "DType | str", seq: int) -> int:
    """Rows of the aligned window that holds ``rows`` consecutive new cache rows
    starting anywhere in a sequence of ``seq``: round_up(rows + align - 1,
    align), or the whole sequence when it is not tile aligned or no shorter.
    A call's appended rows come back from the kernel as this window per
    sequence and layer (``window_start`` places it)."""
    a = row_align(dtype)
    w = round_up(rows + a - 1, a)
    return seq if seq % a or w >= seq else w


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_shape(shape: tuple[int, ...], dtype: "DType | str") -> tuple[int, ...]:
    """``shape`` with its last dim rounded to 128 lanes and its second-to-last
    to the dtype's sublane count (a 1-D shape is laid out as one row). A
    second-to-last dim of 1 is tiled by one 32-bit sublane instead (Mosaic lays
    a [.., 1, n] bf16 array out in (2, 128) tiles, f32 in (1, 128): seen in its
    lowered memref layouts, libtpu 0.0.51), so one-row vectors are not padded
    to a full native tile."""
    if not shape:
        return (sublanes(dtype), LANES)
    if len(shape) == 1:
        return (sublanes(dtype), round_up(shape[0], LANES))
    *lead, rows, cols = shape
    if rows == 1 and dtypes.of(dtype_name(dtype)).bits:
        return (*lead, max(32 // dtypes.of(dtype_name(dtype)).bits, 1), round_up(cols, LANES))
    return (*lead, round_up(rows, sublanes(dtype)), round_up(cols, LANES))


@functools.lru_cache(maxsize=65536)
def padded_bytes(shape: tuple[int, ...], dtype: "DType | str") -> int:
    """Bytes a VMEM/HBM array of ``shape`` occupies once tiled."""
    return math.prod(padded_shape(shape, dtype)) * itemsize(dtype)


def scratch_rows(rows: int, dtype: "DType | str") -> int:
    """Rows the second-to-last dim of a VMEM *scratch* array takes once Mosaic
    tiles it. Mosaic picks a scratch array's tile by its height
    (infer_memref_layout, getTilingFactor): 8 sublanes once it has that many
    rows, else the smallest power of two times the packing (32 / bits) that
    holds them; so a bf16 array of 3 rows takes 4, one of 8 or 24 rows 8 or
    24, not the 16-row native tile. Measured (AOT, tpu7x, libtpu 0.0.51,
    scratch arrays filled and drained by DMA): [2, 1, 3, 768] bf16 12 KiB,
    [2, 1, 8, 768] bf16 24 KiB, [2, 24, 768] bf16 72 KiB, [2, 3, 768] f32
    24 KiB, [2, 5, 768] int8 12 KiB, [2, 1, 768] bf16 6 KiB."""
    bits = dtypes.of(dtype_name(dtype)).bits
    if bits not in (8, 16, 32):     # not measured (int4 is laid out a byte an element)
        return round_up(rows, sublanes(dtype))
    packing, full = 32 // bits, 8          # full: the sublanes of one vreg
    if rows >= full:
        return round_up(rows, full)
    tile = packing
    while tile < rows:
        tile *= 2
    return tile


@functools.lru_cache(maxsize=65536)
def scratch_bytes(shape: tuple[int, ...], dtype: "DType | str") -> int:
    """Bytes a VMEM scratch array of ``shape`` occupies as Mosaic tiles it
    (``scratch_rows``; lanes padded to 128). The kernel's operands, laid out by
    XLA, keep ``padded_bytes``."""
    if len(shape) < 2:
        return padded_bytes(shape, dtype)
    *lead, rows, cols = shape
    return (math.prod(lead) * scratch_rows(rows, dtype) * round_up(cols, LANES)
            * itemsize(dtype))


def smem_bytes(shape: tuple[int, ...], dtype: "DType | str" = "int32") -> int:
    """SMEM holds 32-bit words; we round each array up to 128 words so the
    count is conservative whatever padding Mosaic applies."""
    return round_up(max(math.prod(shape), 1), LANES) * max(itemsize(dtype), 4)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def size_text(nbytes: int) -> str:
    """MiB from one MiB up, KiB or bytes below it (no "0.02 MiB")."""
    if nbytes >= 2**20:
        return mib(nbytes)
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B"


# What Mosaic keeps in VMEM beyond the buffers a kernel declares: the values the
# kernel computes on, when they do not fit the 64 vector registers. The plan
# counts them as MemoryPlan.values_bytes (values_bytes below) =
#   VALUES_BASE + HOISTED_FRACTION x one ring bank's bytes
#   + PIECE_BYTES x the most pieces one tile is folded into
#   + VALUES_SPILLED x the most any op holds with the tensors live around it
#     (plan_buffers.layer_buffers, the kernel libraries' value_bytes).
#
# Why the bank: libtpu hoists the loads of a ring piece's weight chunks
# (runtime.matmul_ref, WEIGHT_CHUNK_BYTES each) ahead of their dots and holds
# them, so bigger pieces keep more in VMEM. Measured on phi-3-mini-4k/4 with
# its banks forced to 2, 4.5 and 6.75 MiB: 0.94, 1.34 and 1.65 MiB above the
# declared buffers; each folded piece adds its own loads and waits. (Earlier:
# qwen3-32b/8 went from 4.2 MiB above its buffers with 128-256 KiB chunks to
# 1.5 MiB with 64 KiB ones.) Fitted over the 17 zoo cards at the core counts
# of docs/planner.md's table and the three forced-bank phi-3 plans, batch 1,
# libtpu 0.0.51: least squares on (compiled - declared), VALUES_SPILLED held
# at 0.1 (free, it comes out 0.008: at batch 1 the op peaks, 0.5-2.6 MiB,
# explain little - gemma-2-2b's soft-capped scores plan 2.6 MiB of peak and
# compile to 1.3 MiB of values in all - but the term is kept for the batches
# where the MLP's [rows, intermediate] products grow), rounded, the base
# re-centred: every compiled figure is within 0.53 MiB of its plan (gpt-oss-20b/8
# +0.53 the most above, llama-3.2-1b/1 -0.52 the most below; table in
# docs/planner.md). Re-centred once more (2026-12-05, +128 KiB) when the ring's
# pieces became at least 512 columns wide (Target.piece_cols): the plans whose
# pieces widened from 256 hold more values than the fit says (compiled - plan
# before the shift: deepseek-v3/16 fp8 +1.06 MiB, gpt-oss-20b/8 +0.87,
# kimi-k2/32 MXFP4 +0.76, qwen3-32b/8 +0.22; below: llama-3.2-1b/1 -0.52,
# qwen3-8b/4 -0.34, phi-3-mini-4k/4 -0.28, qwen3.5-27b/8 -0.27,
# mistral-7b-v0.1/8 -0.09, gemma-3-1b/1 -0.02). A term for the piece width
# would fit them better; it needs the zoo re-fitted. Hybrid cards hold fewer
# values than the ring alone
# suggests: qwen3.5-27b/8, with the same ring as qwen3-32b/8 (40-piece tiles
# in 3.9 MiB banks), compiles 1.26 MiB of values to its 1.64 (-0.33 against
# the plan); unexplained, inside the fit.
# Plain weights are multiplied in chunks of 128 KiB (128 rows of a 512-column
# piece): libtpu's static schedule of 2-layer cuts (libtpu 0.0.51, 2026-12-05)
# against 64 KiB: qwen3-32b/8 351,693 -> 313,830 cycles, llama-3.2-1b/1
# 902,554 -> 879,349, phi-3-mini-4k/4 -3.5%, qwen3-8b/4 -1.9%, mistral-7b/8
# -1.7%, olmo-2-7b/8 -1.1%; 32 KiB was worse. Compiled VMEM fell by 0.06-0.19
# MiB (qwen3-32b/8, llama, qwen3-8b) and the AOT compile by a third (fewer
# dots). A piece 2,048 wide still gets 32-row chunks. Quantized weights keep
# 64 KiB of the dequantised dtype (DEQUANT_CHUNK_BYTES), the size their paths
# were calibrated and fitted at (docs/formats.md).
WEIGHT_CHUNK_BYTES = 128 * 1024
DEQUANT_CHUNK_BYTES = 64 * 1024
VALUES_BASE = 528 * 1024
HOISTED_FRACTION = 0.13
PIECE_BYTES = 16 * 1024
VALUES_SPILLED = 0.1
# A kernel whose stack loops over a run of equal layers inside its loop over
# repetitions (ir.graph.Stack.runs) holds more values for some kinds in the
# run's layers: op kind -> the bytes charged once when any looped run holds
# one (the largest of them), registered with the kind's other compiler rules
# from what was measured (the dense MLP's in compiler/kind_mlp.py). A kind
# without a rule was measured to add none (MoE) or has no looped run measured.
RUN_LOOP_VALUES: Registry = Registry("run-loop values", "compiler/kind_*.py",
                                     per_op_kind=False)


def values_bytes(bank_bytes: int, max_pieces: int, peak: int, *, run_loop_values: int) -> int:
    """The plan's estimate of Mosaic's values in VMEM (the model above);
    ``run_loop_values``: what the kinds of looped runs add (RUN_LOOP_VALUES)."""
    return int(VALUES_BASE + HOISTED_FRACTION * bank_bytes + PIECE_BYTES * max_pieces
               + VALUES_SPILLED * peak + run_loop_values)
