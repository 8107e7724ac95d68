"""Quantized weights inside the kernel: x @ W where W arrives as packed codes
(32-bit words, megakernel/quantize.py's units) and f32 scales, dequantised in
VMEM a row chunk at a time right before its dot.

Used by the weight ring (``runtime.ring_linear``) and the expert slots
(``moe.moe_routed``). A chunk is whole units and whole scale groups of about
``WEIGHT_CHUNK_BYTES`` of the dequantised dtype, so the values Mosaic holds
stay those of a plain weight chunk (``MemoryPlan.values_bytes``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

from megakernel import formats, quantize
from megakernel.compiler.layout import WEIGHT_CHUNK_BYTES


def matmul(x, words, scales, fmt: str, dtype, dot):
    """``dot(x, W)`` summed over row chunks, W = ``words`` (a ref [rows / per,
    cols] of packed codes) dequantised with ``scales`` (a value [rows / g,
    cols] f32, or [1, cols] per channel) to ``dtype``; ``dot`` is the caller's
    matmul (the reference's arithmetic for its operands)."""
    f = formats.get(fmt)
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
