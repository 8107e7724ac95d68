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
        return _scaled_fp8(x, words, scales, dtype)
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


def _scaled_fp8(x, words, scales, dtype):
    """sum_g (x_g @ codes_g) * scales_g over the 128-row groups of float8 codes
    (``words``: a ref of their plain bitcast, four rows a word): each group's
    codes go to the MXU as float8 beside x in the model dtype (TPU7x runs a
    bf16 x float8 dot at the fp8 weight rate, platform-facts.md), and its
    scales multiply the dot's f32 output columns. The products are exact, as
    in the reference's ``ScaledCodes``. An f32 model's x has no float8 dot:
    its codes are widened to f32 (exactly) first."""
    rows, groups = words.shape[0] * 4, scales.shape[0]
    g = rows // groups
    acc = None
    for i in range(groups):
        codes = pltpu.bitcast(words[pl.ds(i * g // 4, g // 4), :], jnp.float8_e4m3fn)
        if jnp.dtype(dtype) == jnp.float32:
            codes = codes.astype(jnp.float32)
        part = jax.lax.dot_general(x[:, i * g:(i + 1) * g].astype(dtype), codes,
                                   (((1,), (0,)), ((), ())),
                                   preferred_element_type=jnp.float32) * scales[i:i + 1, :]
        acc = part if acc is None else acc + part
    return acc
