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


class Windows:
    """Sequences' windows rotating through two VMEM slots, so that their DMAs
    leave the critical path: a window loads into one slot while the previous
    one is read from the other, and its store to the output runs on while
    later windows are used. Windows are numbered across a stack's layers,
    n = layer * batch + b (``n0`` the number of sequence 0 in this layer), and
    window n takes slot n % 2.

    ``caches`` / ``news``: one HBM ref per part (attention's k and v, MLA's
    latent), [reps, batch, seq, width] read-only and the output [reps, batch,
    W, width]; ``win`` VMEM (2, parts, W, width) and ``sem`` DMA (2, parts),
    [slot, part]; ``w0(b)`` the first cache row of sequence b's window. Each
    semaphore has at most one DMA outstanding: loading window n first waits the
    store of window n - 2 (the slot's previous use), and ``drain`` waits the
    stores no later load waits."""

    def __init__(self, caches, news, layer, w0, first, win, sem, n0=0):
        self.caches, self.news, self.layer, self.w0 = caches, news, layer, w0
        self.first, self.win, self.sem, self.n0 = first, win, sem, n0
        self.rows = win.shape[2]

    def slot(self, b):
        return (self.n0 + b) % 2

    def view(self, b, part: int):
        """Sequence b's window of ``part`` (a VMEM ref [W, width])."""
        return self.win.at[self.slot(b), part]

    def _load(self, b, j, src):
        return pltpu.make_async_copy(src, self.view(b, j), self.sem.at[self.slot(b), j])

    def _from_cache(self, b, j):
        return self._load(b, j, self.caches[j].at[self.layer, b, pl.ds(self.w0(b), self.rows), :])

    def _store(self, b, j):
        return pltpu.make_async_copy(self.view(b, j), self.news[j].at[self.layer, b],
                                     self.sem.at[self.slot(b), j])

    def start_load(self, b):
        """Start loading sequence b's window: from the cache on the call's first
        step, else from the output the previous step stored it to."""
        when(self.n0 + b >= 2, lambda: self.wait_store(b))   # window n - 2's, same slot
        for j in range(len(self.caches)):
            when(self.first, lambda j=j: self._from_cache(b, j).start())
            if not (isinstance(self.first, bool) and self.first):
                when(jnp.logical_not(self.first),
                     lambda j=j: self._load(b, j, self.news[j].at[self.layer, b]).start())

    def wait_load(self, b):
        for j in range(len(self.caches)):
            self._from_cache(b, j).wait()   # the same bytes, whichever source

    def start_store(self, b):
        for j in range(len(self.caches)):
            self._store(b, j).start()

    def wait_store(self, b):
        """Wait the store outstanding in sequence b's slot (a window's bytes)."""
        self._wait_slot(self.slot(b))

    def drain(self, end: int):
        """Wait the stores of windows end - 2 and end - 1 (``end`` static: the
        windows numbered so far), which no later load waits."""
        for n in range(max(end - 2, 0), end):
            self._wait_slot(n % 2)

    def _wait_slot(self, slot):
        """Wait one window's store on ``slot``'s semaphores. A wait needs only
        the semaphore and a window's size, so the descriptor names sequence
        0's output (the stored window's sequence may be any)."""
        for j in range(len(self.caches)):
            pltpu.make_async_copy(self.win.at[slot, j], self.news[j].at[self.layer, 0],
                                  self.sem.at[slot, j]).wait()


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
