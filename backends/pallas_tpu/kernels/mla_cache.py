"""The latent cache side of the MLA library (backends/pallas_tpu/kernels/mla.py):
each sequence's window of this call's latent rows (new_rows.Windows, one
part: loaded from the read-only cache on the call's first step, from the
output on later ones, the new rows put in, stored to the kernel's output),
then its cache tiles before the window streamed, double-buffered, in chunks
of keys, then the window itself from VMEM.

None of these DMAs waits on the critical path (as attention's): the windows
rotate through two VMEM slots across sequences and layers, sequence b + 1's
window loads while b is scored and its first tile starts once b's tiles are
done, a layer's first window and tile are started by ``prefetch`` a layer
ahead, and the stores run on until their slot is needed again (``drain``
after the stack's loop waits the last two). Under ``sync`` (the synchronised
ablation) ``sequences`` starts its own first DMAs and waits every store."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.kernels import appended_state as new_rows
from megakernel.backends.pallas_tpu.kernels.attention import _windows, window_start
from megakernel.compiler.geometry.mla import chunk_rows  # noqa: F401 - re-exported


def _tiles_before(g, start_ref, origin_ref, b):
    """(hi, below): sequence b's cache tiles [0, hi) hold its keys before the
    window (those below ``below``); the window holds the rest."""
    below = jnp.minimum(start_ref[b] + g.tokens, window_start(g, origin_ref[b]))
    return (below + g.kv_tile - 1) // g.kv_tile, below


def _tile(g, cache, layer, b, i, tiles, tile_sems):
    """The DMA of sequence b's latent tile i into slot i % 2."""
    s0, slot = pl.multiple_of(i * g.kv_tile, g.kv_tile), i % 2
    return pltpu.make_async_copy(cache.at[layer, b, pl.ds(s0, g.kv_tile), :], tiles.at[slot],
                                 tile_sems.at[slot])


def _start_first_tile(g, cache, layer, start_ref, origin_ref, b, tiles, tile_sems):
    hi, _ = _tiles_before(g, start_ref, origin_ref, b)

    @pl.when(hi > 0)
    def _():
        _tile(g, cache, layer, b, 0, tiles, tile_sems).start()


def _start_first(g, cache, out, layer, start_ref, origin_ref, first, bufs, sync=False):
    """Start sequence 0's window load and first latent tile of ``layer``."""
    _windows(g, (cache,), (out,), layer, origin_ref, first, bufs.window, bufs.window_sems,
             sync).start_load(0)
    _start_first_tile(g, cache, layer, start_ref, origin_ref, 0, bufs.tiles,
                      bufs.tile_sems)


def prefetch(g, cache, rows_out, layer, start_ref, origin_ref, first, *, bufs, sync=False,
             when=True):
    """Begin ``layer``'s first window load and first latent tile (if ``when``):
    they depend only on the layer and the positions, so the megakernel starts
    them a layer ahead and they stream under the MLP and projections. Under
    ``sync`` nothing: ``attend`` starts its own (starting them here too would
    leave a second DMA on each semaphore that nothing waits)."""
    if not sync:
        new_rows.when(when, lambda: _start_first(g, cache, rows_out, layer, start_ref,
                                                 origin_ref, first, bufs))


def drain(g, cache, rows_out, layers: int, *, bufs, sync=False):
    """After the stack's loop of ``layers`` repetitions: wait the last
    windows' stores (under ``sync`` each ``attend`` waited its own)."""
    if not sync:
        _windows(g, (cache,), (rows_out,), 0, None, True, bufs.window, bufs.window_sems).drain(
            layers * g.batch)


def sequences(g, cache, out, layer, start_ref, origin_ref, first, stopped, sync, new, bufs,
              begin, chunk, finish):
    """For each sequence b: put its new rows in its window (not when
    stopped[b] != 0, in a multi-step call; ``stopped`` None otherwise) and
    start its store, then stream its valid tiles before the window
    (double-buffered) in chunks of ``chunk_rows(g)`` keys through ``chunk(b, k0, latent
    [keys, L], pos, end)`` (cache dtype; keys at or past ``end`` zeroed, and
    to be masked; k0: the chunk's first key position), then the window as one
    chunk, with ``begin(b)`` before and ``finish(b)`` after. Sequence 0's
    window load and first tile are in flight already (``prefetch``) unless
    ``sync``."""
    St, T, n = g.kv_tile, g.tokens, chunk_rows(g)
    tiles, tsem = bufs.tiles, bufs.tile_sems
    if sync:      # the synchronised ablation: no DMA started ahead of this op
        _start_first(g, cache, out, layer, start_ref, origin_ref, first, bufs, sync=True)
    wins = _windows(g, (cache,), (out,), layer, origin_ref, first, bufs.window,
                    bufs.window_sems, sync)

    def seq_body(b, carry):
        # In flight already: b's window load and first tile (``prefetch`` for
        # the first sequence, the previous sequence's body for the others).
        pos, w0, win = start_ref[b], window_start(g, origin_ref[b]), wins.view(b, 0)
        live = True if stopped is None else stopped[b] == 0   # a stopped sequence puts nothing
        wins.wait_load(b)
        new_rows.when(live, lambda: new_rows.put_rows(new, win, pos - w0, b * T, T))
        wins.start_store(b)          # runs on while b's keys are scored, and later

        @pl.when(b + 1 < g.batch)    # the next sequence's window, into the other slot
        def _():
            wins.start_load(b + 1)

        n_valid = pos + T
        hi, below = _tiles_before(g, start_ref, origin_ref, b)
        begin(b)

        def tile_body(i, c2):
            slot = i % 2

            @pl.when(i + 1 < hi)
            def _():
                _tile(g, cache, layer, b, i + 1, tiles, tsem).start()

            _tile(g, cache, layer, b, i, tiles, tsem).wait()

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

        @pl.when(b + 1 < g.batch)    # both tile slots are free: the next sequence's first
        def _():
            _start_first_tile(g, cache, layer, start_ref, origin_ref, b + 1, tiles, tsem)

        row = jax.lax.broadcasted_iota(jnp.int32, (win.shape[0], 1), 0)
        chunk(b, w0, jnp.where(w0 + row < n_valid, win[...], 0), pos, n_valid)
        finish(b)
        return carry

    jax.lax.fori_loop(0, g.batch, seq_body, 0)
    if sync:
        wins.drain(g.batch)
