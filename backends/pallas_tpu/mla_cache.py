"""The latent cache side of the MLA library (backends/pallas_tpu/mla.py):
each sequence's new latent rows written into the HBM cache through an aligned
window, then its valid tiles streamed, double-buffered, in chunks of keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.attention import row_align, window_rows


def write_latent(g, new, cache, layer, b, pos, win, wsem):
    """Read-modify-write the aligned window holding rows pos..pos+T-1 of seq b
    (a DMA into tiled HBM must start on a tile row)."""
    wr, a, L = window_rows(g), row_align(g.cache_dtype), g.latent
    if wr == g.max_seq_len:
        w0 = 0
    else:
        w0 = pl.multiple_of(jnp.minimum((pos // a) * a, g.max_seq_len - wr), a)
    read = pltpu.make_async_copy(cache.at[layer, b, pl.ds(w0, wr), :], win, wsem.at[0])
    read.start()
    read.wait()
    wrow = jax.lax.broadcasted_iota(jnp.int32, (wr, L), 0)
    nrow = jax.lax.broadcasted_iota(jnp.int32, (g.rows_padded, L), 0)
    w = win[...].astype(jnp.float32)
    for t in range(g.tokens):      # row b*T+t picked by a masked sum (exact)
        row = jnp.sum(jnp.where(nrow == b * g.tokens + t, new, 0.0), axis=0, keepdims=True)
        w = jnp.where(wrow == pos - w0 + t, row, w)
    win[...] = w.astype(win.dtype)
    back = pltpu.make_async_copy(win, cache.at[layer, b, pl.ds(w0, wr), :], wsem.at[0])
    back.start()
    back.wait()            # the tile reads below must see the new rows


def sequences(g, n, cache, layer, start_ref, new, bufs, begin, chunk, finish, stopped=None):
    """For each sequence b: write its new rows (not when stopped[b] != 0, in a
    multi-step call), then stream its valid tiles
    (double-buffered) in chunks of ``n`` keys through ``chunk(b, k0, latent
    [n, L], pos)``
    (cache dtype, rows past the end zeroed; k0: the chunk's first key
    position), with ``begin(b)`` before and ``finish(b)`` after."""
    St, T = g.kv_tile, g.tokens
    tiles, tsem = bufs["tiles"], bufs["tile_sems"]

    def copy(b, i, slot):
        s0 = pl.multiple_of(i * St, St)
        return pltpu.make_async_copy(cache.at[layer, b, pl.ds(s0, St), :], tiles.at[slot],
                                     tsem.at[slot])

    def seq_body(b, carry):
        pos = start_ref[b]
        if stopped is None:
            write_latent(g, new, cache, layer, b, pos, bufs["window"], bufs["window_sems"])
        else:       # a multi-step call leaves a stopped sequence's cache alone
            @pl.when(stopped[b] == 0)
            def _():
                write_latent(g, new, cache, layer, b, pos, bufs["window"], bufs["window_sems"])
        n_valid = pos + T
        hi = (n_valid + St - 1) // St
        copy(b, 0, 0).start()
        begin(b)

        def tile_body(i, c2):
            slot = i % 2

            @pl.when(i + 1 < hi)
            def _():
                copy(b, i + 1, 1 - slot).start()

            copy(b, i, slot).wait()

            # A rolled loop over the tile's chunks: one copy of the chunk's code
            # whatever the tile size (compile time), and a chunk wholly past
            # the end of the sequence is skipped.
            def chunk_body(c, c3):
                r0 = pl.multiple_of(c * n, n)
                k0 = i * St + r0

                @pl.when(k0 < n_valid)
                def _():
                    # rows past the valid end may hold anything (NaN in strict mode)
                    row = jax.lax.broadcasted_iota(jnp.int32, (n, 1), 0)
                    lat = jnp.where(k0 + row < n_valid, tiles[slot, pl.ds(r0, n), :], 0)
                    chunk(b, k0, lat, pos)
                return c3

            jax.lax.fori_loop(0, St // n, chunk_body, 0)
            return c2

        jax.lax.fori_loop(0, hi, tile_body, 0)
        finish(b)
        return carry

    jax.lax.fori_loop(0, g.batch, seq_body, 0)
