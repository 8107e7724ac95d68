"""The latent cache side of the MLA library (backends/pallas_tpu/mla.py):
each sequence's window of this call's latent rows (new_rows.py: loaded from
the read-only cache on the call's first step, the new rows put in, stored to
the kernel's output), then its cache tiles before the window streamed,
double-buffered, in chunks of keys, then the window itself from VMEM."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu import new_rows
from megakernel.backends.pallas_tpu.attention import window_rows, window_start


def write_latent(g, new, cache, out, layer, b, pos, w0, first, live, win, wsem):
    """The sequence's window of latent rows: loaded, rows pos..pos+T-1 put in
    unless the sequence stopped (``live`` false), stored to ``out`` [layers,
    batch, W, L] (DMAs waited)."""
    wr = window_rows(g)
    new_rows.load_window(cache.at[layer, b, pl.ds(w0, wr), :], out.at[layer, b], win,
                         wsem.at[0], first)
    new_rows.when(live, lambda: new_rows.put_rows(new, win, pos - w0, b * g.tokens, g.tokens))
    new_rows.store_window(win, out.at[layer, b], wsem.at[0])


def sequences(g, n, cache, out, layer, start_ref, origin_ref, first, stopped, new, bufs, begin,
              chunk, finish):
    """For each sequence b: put its new rows in its window (not when
    stopped[b] != 0, in a multi-step call; ``stopped`` None otherwise), then
    stream its valid tiles before the window (double-buffered) in chunks of
    ``n`` keys through ``chunk(b, k0, latent [keys, L], pos, end)`` (cache
    dtype; keys at or past ``end`` zeroed, and to be masked; k0: the chunk's
    first key position), then the window as one chunk, with ``begin(b)``
    before and ``finish(b)`` after."""
    St, T = g.kv_tile, g.tokens
    tiles, tsem = bufs["tiles"], bufs["tile_sems"]

    def copy(b, i, slot):
        s0 = pl.multiple_of(i * St, St)
        return pltpu.make_async_copy(cache.at[layer, b, pl.ds(s0, St), :], tiles.at[slot],
                                     tsem.at[slot])

    def seq_body(b, carry):
        pos = start_ref[b]
        w0 = window_start(g, origin_ref[b])
        win = bufs["window"]
        live = True if stopped is None else stopped[b] == 0   # a stopped sequence puts nothing
        write_latent(g, new, cache, out, layer, b, pos, w0, first, live, win,
                     bufs["window_sems"])
        n_valid = pos + T
        below = jnp.minimum(n_valid, w0)    # the cache's keys; the window holds the rest
        hi = (below + St - 1) // St

        @pl.when(hi > 0)
        def _():
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

                @pl.when(k0 < below)
                def _():
                    # rows past the valid end may hold anything (NaN in strict mode)
                    row = jax.lax.broadcasted_iota(jnp.int32, (n, 1), 0)
                    lat = jnp.where(k0 + row < below, tiles[slot, pl.ds(r0, n), :], 0)
                    chunk(b, k0, lat, pos, below)
                return c3

            jax.lax.fori_loop(0, St // n, chunk_body, 0)
            return c2

        jax.lax.fori_loop(0, hi, tile_body, 0)
        row = jax.lax.broadcasted_iota(jnp.int32, (win.shape[0], 1), 0)
        chunk(b, w0, jnp.where(w0 + row < n_valid, win[...], 0), pos, n_valid)
        finish(b)
        return carry

    jax.lax.fori_loop(0, g.batch, seq_body, 0)
