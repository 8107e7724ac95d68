"""Quantized weights inside the kernel: x @ W where W arrives as packed codes
(32-bit words, megakernel/quantize.py's units) and f32 scales, dequantised in
VMEM a row chunk at a time right before its dot.

Used by the weight ring (``runtime.ring_linear``) and the expert slots
(``moe.moe_routed``). A chunk is whole units and whole scale groups of about
``WEIGHT_CHUNK_BYTES`` of the dequantised dtype, so the values Mosaic holds
stay those of a plain weight chunk (``MemoryPlan.values_bytes``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import formats, quantize
from megakernel.compiler.layout import WEIGHT_CHUNK_BYTES


def matmul(x, words, scales, fmt: str, dtype, dot, mxu: str | None = None):
    """``dot(x, W)`` summed over row chunks, W = ``words`` (a ref [rows / per,
    cols] of packed codes) dequantised with ``scales`` (a value [rows / g,
    cols] f32, or [1, cols] per channel) to ``dtype``; ``dot`` is the caller's
    matmul (the reference's arithmetic for its operands). A format whose
    codes the MXU takes as they are (``Format.mxu``) goes through
    ``_scaled_fp8``; ``mxu`` overrides the format's path (the calibration
    compares both)."""
    f = formats.get(fmt)
    if (mxu or f.mxu) == "fp8":
        return _scaled_fp8(x, words, scales, fmt, dtype)
    per = 32 // f.code_bits
    rows, cols = words.shape[0] * per, words.shape[1]
    quantum = f.row_quantum(rows)
    item = jnp.dtype(dtype).itemsize
    step = max(min(rows, WEIGHT_CHUNK_BYTES // (cols * item)) // quantum * quantum, quantum)
    g = rows // scales.shape[0]
    acc = None
    for r in range(0, rows, step):
        n = min(step, rows - r)
        s = scales if scales.shape[0] == 1 else scales[r // g:(r + n) // g]
        w = quantize.dequantize(f, words[pl.ds(r // per, n // per), :], s, dtype)
        part = dot(x[:, r:r + n], w)
        acc = part if acc is None else acc + part
    return acc


def _scaled_fp8(x, words, scales, fmt, dtype):
    """sum_g (x_g @ codes_g) * scales_g over the groups of a format whose codes
    go to the MXU as float8 (``words``: a ref of their plain bitcast): each
    chunk of whole groups is bitcast to float8 (e2m1 first to e4m3 bits,
    value x 2^-6, so its scales are taken x 2^6), and each group's dot, with
    x in the model dtype (TPU7x runs a bf16 x float8 dot at the fp8 weight
    rate, platform-facts.md), is scaled on its f32 output columns. The
    products are exact, as in the reference's ``ScaledCodes``. An f32 model's
    x has no float8 dot: its codes are widened to f32 (exactly) first."""
    f = formats.get(fmt)
    per = 32 // f.code_bits
    rows, groups = words.shape[0] * per, scales.shape[0]
    g = rows // groups
    chunk = max(g, 32 * per)             # whole groups, 32 word rows
    unit = 64.0 if f.code_bits == 4 else 1.0
    acc = None
    for r in range(0, rows, chunk):
        n = min(chunk, rows - r)
        codes = _float8(words[pl.ds(r // per, n // per), :], f.code_bits)
        if jnp.dtype(dtype) == jnp.float32:
            codes = codes.astype(jnp.float32)
        for c in range(0, n, g):
            i = (r + c) // g
            part = jax.lax.dot_general(x[:, r + c:r + c + g].astype(dtype), codes[c:c + g],
                                       (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)
            scale = scales[i:i + 1, :]
            part = part * (scale * unit if unit != 1.0 else scale)
            acc = part if acc is None else acc + part
    return acc


def _float8(words, bits):
    """32-bit words of codes -> float8 e4m3 [rows, cols]: e4m3 codes by bitcast;
    e2m1 nibbles sign-extended to int8, then (c << 2) & 0x9C moves sign,
    exponent and mantissa to their e4m3 places (value x 2^-6, exact)."""
    if bits == 8:
        return pltpu.bitcast(words, jnp.float8_e4m3fn)
    c8 = pltpu.bitcast(words, jnp.int4).astype(jnp.int8)
    e4m3 = jnp.bitwise_and(jnp.left_shift(c8, 2), jnp.int8(-100))       # 0x9C
    return pltpu.bitcast(e4m3, jnp.float8_e4m3fn)
