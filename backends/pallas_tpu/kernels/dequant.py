"""Quantized weights inside the kernel: x @ W where W arrives as packed codes
(32-bit words, megakernel/quantize.py's units) and f32 scales, dequantised in
VMEM a row chunk at a time right before its dot.

Used by the weight ring (``runtime.ring_linear``) and the expert slots
(``moe.moe_routed``). A chunk is whole units and whole scale groups of about
``DEQUANT_CHUNK_BYTES`` of the dequantised dtype, so the values Mosaic holds
stay within those of a plain weight chunk (``MemoryPlan.values_bytes``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import formats, quantize
from megakernel.compiler.layout import DEQUANT_CHUNK_BYTES


def matmul(x, words, scales, fmt: str, dtype, dot, mxu: str | None = None):
    """``dot(x, W)`` summed over row chunks, W = ``words`` (a ref [rows / per,
    cols] of packed codes) dequantised with ``scales`` (a value [rows / g,
    cols] f32, or [1, cols] per channel) to ``dtype``; ``dot`` is the caller's
    matmul (the reference's arithmetic for its operands). A format whose
    codes the MXU takes as they are (``Format.mxu``) goes through
    ``_scaled_fp8``; ``mxu`` overrides the format's path and the word layout
    it reads (the calibration measures every path of a format, each on the
    layout ``quantize.to_words`` would give it). ``"scaled"`` (int8, one
    scale per output column): the chunks' codes go to the dot decoded but
    unscaled, and the scales multiply the summed [B, N] output."""
    f = formats.get(fmt)
    path = mxu or f.mxu
    if path == "fp8":
        return _scaled_fp8(x, words, scales, fmt, dtype)
    per = 32 // f.code_bits
    rows, cols = words.shape[0] * per, words.shape[1]
    quantum = f.row_quantum(rows)
    item = jnp.dtype(dtype).itemsize
    step = max(min(rows, DEQUANT_CHUNK_BYTES // (cols * item)) // quantum * quantum, quantum)
    g = rows // scales.shape[0]
    acc = None
    for r in range(0, rows, step):
        n = min(step, rows - r)
        block = words[pl.ds(r // per, n // per), :]
        if path == "scaled":         # the codes alone, exact in the model dtype
            # (their words a plain bitcast, ``quantize.to_words``: libtpu
            # 0.0.51 charges this convert 2,080 weights/cycle, the shift
            # decode of the unit layout 1,280; x[8, 2048], N 1,024 -> 2,048)
            w = pltpu.bitcast(block, jnp.int8).astype(dtype)
        else:
            s = scales if scales.shape[0] == 1 else scales[r // g:(r + n) // g]
            w = quantize.dequantize(f, block, s, dtype, path)
        part = dot(x[:, r:r + n], w)
        acc = part if acc is None else acc + part
    if path == "scaled":
        # x @ (q s) = (x @ q) s per output column: one [B, N] multiply after
        # the K sweep, where "dequant" multiplies all [K, N] weights before
        # it; as the reference's ``ScaledCodes`` (one group), up to the order
        # of f32 sums
        acc = acc * scales.astype(jnp.float32)
    return acc


def _scaled_fp8(x, words, scales, fmt, dtype):
    """sum_g (x_g @ codes_g) * scales_g over the groups of a format whose codes
    go to the MXU as float8 (``words``: a ref of their plain bitcast): each
    chunk of whole groups is bitcast to float8 (``_float8``: e2m1 to e4m3 bits,
    value x 2^-6; int4 c as u = c + 8, value u x 2^-9), and each group's dot,
    with x in the model dtype (TPU7x runs a bf16 x float8 dot at the fp8 weight
    rate, platform-facts.md), is scaled on its f32 output columns (the scales
    taken x 2^6 or x 2^9). int4's offset comes off before the scale:
    x_g @ c_g = 2^9 (x_g @ u_g 2^-9 - rowsum(x_g) / 64), the row sum over the
    same rounded x the dot saw. The products are exact, as in the reference's
    ``ScaledCodes``. An f32 model's x has no float8 dot: its codes are widened
    to f32 (exactly, int4's offset taken off there) first."""
    f = formats.get(fmt)
    per = 32 // f.code_bits
    rows, groups = words.shape[0] * per, scales.shape[0]
    g = rows // groups
    chunk = max(g, 32 * per)             # whole groups, 32 word rows
    unit, offset = _FP8_UNIT[f.code]     # code value = (float8 value) x unit - offset
    wide = jnp.dtype(dtype) == jnp.float32
    cols = words.shape[1]
    lanes = 128 if cols % 128 == 0 else cols
    # rowsum(x_g) for int4's offset: a lane reduction where a group is whole
    # 128-lane vregs; else on the MXU, x_g @ ones [g, 128], which puts it in
    # every lane (lane reductions of 32 or 64 lanes cost libtpu's schedule
    # more than the fp8 dots themselves; docs/formats.md)
    ones = jnp.ones((g, lanes), dtype) if offset and not wide and g % 128 else None
    band_chunk = _block_diagonal_chunk(x.shape[0], g, f.code_rows)
    if band_chunk and not wide:
        return _block_diagonal(x, words, scales, f, dtype, band_chunk)
    acc = None
    for r in range(0, rows, chunk):
        n = min(chunk, rows - r)
        codes = _float8(words[pl.ds(r // per, n // per), :], f.code)
        if wide:
            codes = codes.astype(jnp.float32)
            if offset:                   # u 2^-9 - 8 2^-9 = c 2^-9, exact in f32
                codes = codes - offset / unit
        for c in range(0, n, g):
            i = (r + c) // g
            xg = x[:, r + c:r + c + g].astype(dtype)
            part = jax.lax.dot_general(xg, codes[c:c + g], (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)
            if offset and not wide:
                if ones is None:
                    rs = jnp.sum(xg.astype(jnp.float32), axis=1, keepdims=True)
                else:
                    rs = jax.lax.dot_general(xg, ones, (((1,), (0,)), ((), ())),
                                             preferred_element_type=jnp.float32)
                    if lanes != cols:
                        rs = jnp.tile(rs, (1, cols // lanes))
                part = part - rs * (offset / unit)
            scale = scales[i:i + 1, :]
            part = part * (scale * unit if unit != 1.0 else scale)
            acc = part if acc is None else acc + part
    return acc


# The block-diagonal LHS of ``_block_diagonal`` has (chunk / g) x B rows; up to
# one MXU's 256 rows it costs the weights' pushes little (libtpu 0.0.51,
# x[8, 2048], weights per cycle: nvfp4 1,040 -> 2,196, mxfp4 2,114 -> 4,539,
# int4_g32 2,081 -> 4,681, int4_g64 4,228 -> 4,681; chunks of 128 rows measured
# the same, of 512 slower). Past it the chunk shrinks, down to one code tile.
BAND_ROWS, BAND_CHUNK = 256, 256


def _block_diagonal_chunk(rows: int, g: int, code_rows: int) -> int:
    """Rows of x @ W per block-diagonal dot (whole code tiles and groups), or 0
    where one dot per group is the path: groups of a whole chunk (already
    full depth), x rows not whole sublane tiles, or too many rows to band."""
    if g >= BAND_CHUNK or rows % 8:
        return 0
    chunk = min(BAND_CHUNK, BAND_ROWS * g // rows) // code_rows * code_rows
    return chunk if chunk >= max(g, code_rows) else 0


def _block_diagonal(x, words, scales, f, dtype, chunk):
    """The float8 path for groups smaller than a chunk, one dot per chunk:
    the chunk's x [B, n] repeated once per group down the rows, each copy zero
    outside its group's columns (a block-diagonal LHS [n / g x B, n]), so one
    full-depth dot gives every group's partial x_g @ codes_g as a band of B
    rows; each band is scaled by its group's scales and the bands summed.
    The zeros add exact zeros: the products and the partial sums are those of
    one dot per group (int4's offset: each band's row sum, over the same x)."""
    per = 32 // f.code_bits
    rows, groups = words.shape[0] * per, scales.shape[0]
    g, b = rows // groups, x.shape[0]
    unit, offset = _FP8_UNIT[f.code]
    acc = None
    for r in range(0, rows, chunk):
        n = min(chunk, rows - r)
        q = n // g
        band = jax.lax.broadcasted_iota(jnp.int32, (q * b, n), 0) // b
        col = jax.lax.broadcasted_iota(jnp.int32, (q * b, n), 1) // g
        codes = _float8(words[pl.ds(r // per, n // per), :], f.code)
        xc = x[:, r:r + n].astype(dtype)
        lhs = jnp.where(band == col, jnp.concatenate([xc] * q, axis=0), jnp.zeros((), dtype))
        z = jax.lax.dot_general(lhs, codes, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
        if offset:
            z = z - jnp.sum(lhs.astype(jnp.float32), axis=1, keepdims=True) * (offset / unit)
        for i in range(q):
            scale = scales[r // g + i:r // g + i + 1, :]
            part = z[i * b:(i + 1) * b, :] * (scale * unit if unit != 1.0 else scale)
            acc = part if acc is None else acc + part
    return acc


# Per code type on the float8 path: (unit, offset), code value = float8 value
# x unit - offset (``_float8``): e4m3 as it is, e2m1 moved to e4m3 bits
# (x 2^-6), int4 c as the byte u = c + 8 (u x 2^-9: subnormals 0-7, then the
# first normal binade 8-15).
_FP8_UNIT = {"float8_e4m3fn": (1.0, 0.0), "float4_e2m1fn": (64.0, 0.0), "int4": (512.0, 8.0)}
_NIBBLE_TOP_BITS = -0x77777778           # 0x88888888 as an int32


def _float8(words, code):
    """32-bit words of codes -> float8 e4m3 [rows, cols], exactly, bitwise
    ops only (Mosaic has no int8 vector add; ``int4.astype(float8)`` trips
    libtpu's type check): e4m3 codes by bitcast; e2m1 nibbles sign-extended
    to int8, then (c << 2) & 0x9C moves sign, exponent and mantissa to their
    e4m3 places (value x 2^-6); int4 nibbles with their top bit flipped
    (u = c + 8 in [0, 15]), sign-extended and masked to the byte u, which
    e4m3 reads as u x 2^-9."""
    if code == "float8_e4m3fn":
        return pltpu.bitcast(words, jnp.float8_e4m3fn)
    if code == "int4":
        c8 = pltpu.bitcast(jnp.bitwise_xor(words, jnp.int32(_NIBBLE_TOP_BITS)),
                           jnp.int4).astype(jnp.int8)
        return pltpu.bitcast(jnp.bitwise_and(c8, jnp.int8(0x0F)), jnp.float8_e4m3fn)
    c8 = pltpu.bitcast(words, jnp.int4).astype(jnp.int8)
    e4m3 = jnp.bitwise_and(jnp.left_shift(c8, 2), jnp.int8(-100))       # 0x9C
    return pltpu.bitcast(e4m3, jnp.float8_e4m3fn)
