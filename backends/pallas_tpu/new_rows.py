"""Appended-row state outside the kernel: where a call's new rows go, and
their write into the caches after the call, in the same jit.

A kernel with remote DMAs gets every aliased operand copied in and every
output copied out by XLA (docs/verification.md, "Copies around the call"), so
an appended cache (attention K/V, the MLA latent cache) is passed to the
megakernel read-only and the kernel returns, per layer and sequence, the
aligned window of ``rows`` cache rows that holds the call's new rows
(``compiler.layout.append_window``): loaded from the cache on the call's first
step, the new rows written into it in VMEM, stored to the output. After the
call, ``write_back`` puts each sequence's window into the donated cache with
``lax.dynamic_update_slice``, which XLA does in place. Rows of the window a
sequence did not write this call (before its start, or after it stopped) hold
the cache's own values, so writing them back changes nothing.

After ``write_back``: cache[k, b, w0_b : w0_b + rows] == window[k, b] for
every repetition k and sequence b, with w0_b = ``window_start(start[b])``;
every other row is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def window_start(start, rows: int, align: int, seq: int):
    """First row of the window of ``rows`` rows holding position ``start``
    (the call's first position of the sequence): aligned down to ``align``,
    kept inside the sequence, 0 when the window is the whole sequence. The
    kernel (traced scalars) and ``write_back`` place the window with this."""
    if rows >= seq:
        return start * 0
    return jnp.minimum((start // align) * align, seq - rows)


# ---- in the kernel ----

def when(cond, fn):
    """``fn()`` if ``cond``: statically for a Python bool, else under pl.when."""
    if isinstance(cond, bool):
        if cond:
            fn()
    else:
        pl.when(cond)(fn)


def load_window(src_first, src_later, win, sem, first):
    """win <- the sequence's window: from the cache on the call's first step,
    else from the output the previous step stored it to (DMA, waited)."""
    def copy(src):
        def go():
            c = pltpu.make_async_copy(src, win, sem)
            c.start()
            c.wait()
        return go

    when(first, copy(src_first))
    if not (isinstance(first, bool) and first):
        when(jnp.logical_not(first), copy(src_later))


def store_window(win, dst, sem):
    c = pltpu.make_async_copy(win, dst, sem)
    c.start()
    c.wait()


def put_rows(new, win_ref, at, first_row: int, tokens: int):
    """Window rows at..at+tokens-1 <- rows first_row.. of ``new`` [RP, width]
    (a traced ``at``: vector masks, no dynamic sublane slicing)."""
    wr, width = win_ref.shape
    wrow = jax.lax.broadcasted_iota(jnp.int32, (wr, width), 0)
    nrow = jax.lax.broadcasted_iota(jnp.int32, new.shape, 0)
    w = win_ref[...].astype(jnp.float32)
    for t in range(tokens):     # few rows; each picked by a masked sum (exact)
        row = jnp.sum(jnp.where(nrow == first_row + t, new, 0.0), axis=0, keepdims=True)
        w = jnp.where(wrow == at + t, row, w)
    win_ref[...] = w.astype(win_ref.dtype)



# ---- after the call, in the same jit ----


def write_back(cache, window, start, *, rows: int, align: int, seq: int):
    """cache [reps, batch, seq, width] with each sequence's window [reps,
    batch, rows, width] written at ``window_start(start[b])``; one in-place
    update per sequence (the batch is static and small)."""
    for b in range(cache.shape[1]):
        w0 = window_start(start[b], rows, align, seq).astype(jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        cache = jax.lax.dynamic_update_slice(cache, window[:, b:b + 1],
                                             (zero, jnp.int32(b), w0, zero))
    return cache
