"""The weight ring and the per-layer vector double buffers of the megakernel.

The weight ring (``Stream``): every streamed tile has a flat index t in one
step; it lives in bank ``t % R``. Banks hold 32-bit words and every streamed
weight is packed in HBM as words along its rows (compiler/ring_layout.py), so
a tile's DMA moves words and its consumer reads it through ``Words``, a view
in the tile's own dtype (``pltpu.bitcast`` of the loaded words). The prologue starts tiles 0..R-1; after tile
t is consumed, tile t+R is started into the bank just freed, which may belong
to a later op, the next layer, the next stack or the LM head.

A call of ``steps`` > 1 decode steps runs the ring on across the step
boundary: flat index t of step i is ``i * total + t`` for the bank, so the
head's refills start the next step's first R tiles (``step`` is the traced
step index, set by the kernel's step loop) and the next step's layers find
them arriving.

``static_sems=True`` (libtpu's profile only; such a kernel is never run):
each layer tile's DMA signals the semaphore of its place in the layer
rather than its bank's. libtpu's profile pass cannot pair a wait with its
start when the semaphore is computed from the layer index in some ring
loops ("No DMA issue node found for sync flag"), and serialises DMAs whose
semaphore it cannot resolve; the bank each tile lands in is still computed.

``sync=True`` builds the synchronised-ops ablation from the same kernel: no
DMA runs ahead across an op boundary. Each ring op starts its own first R
tiles when it begins (``begin``) and refills only with its own tiles; the
per-layer vectors are fetched when their layer starts.

The tiles, segments and views are in backends/pallas_tpu/kernels/ring_tiles.py and
the vector double buffer in backends/pallas_tpu/kernels/layer_vectors.py; both are
re-exported here.
"""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.kernels.layer_vectors import Vectors  # noqa: F401
from megakernel.backends.pallas_tpu.kernels.ring_runs import quotient, refill_run
from megakernel.backends.pallas_tpu.kernels.ring_tiles import (Segment, Tile, Words,  # noqa: F401
                                                       _run_offsets, tile_pieces)
from megakernel.compiler.ring_layout import run_banks_static, run_of
from megakernel.errors import EmitError


class Stream:
    """The weight ring over ``segments`` (stacks in order, then the head)."""

    def __init__(self, banks, sems, num_banks, segments, refs, aux=(), sync=False, steps=1,
                 static_sems=False):
        self.banks, self.sems, self.R = banks, sems, num_banks
        self.sync, self._op_end = sync, None
        # Profile builds only (never run): a layer tile's DMA signals a
        # semaphore fixed by its place in the layer, not its bank's.
        self.static_sems = static_sems
        self.segments, self.refs = segments, refs      # refs[s][i]: HBM weight
        # aux[i]: [R, rows, cols] ring of one tile shape that is not tile
        # aligned (a DMA into a corner of the main banks must be aligned).
        self.aux = aux
        self.steps, self.step = steps, 0
        if steps > 1 and (num_banks > self.total() or sync):
            raise EmitError(f"a {steps}-step call needs at least as many ring tiles per step "
                            f"({self.total()}) as banks ({num_banks}), and no synchronised "
                            "ablation", path="ring.steps", hint="plan with fewer banks")

    def _slot(self, flat):
        """Bank of flat tile ``flat`` of the current step (flat >= total: the
        next step's tile flat - total)."""
        if self.steps == 1 or self.total() % self.R == 0:
            return flat % self.R
        return (self.step * (self.total() % self.R) + flat) % self.R

    def _bank(self, s, j, flat):
        """Bank of tile ``j`` of segment ``s`` at flat index ``flat``: a
        constant where every layer finds tile j in the same bank (its run's
        ``ring_layout.run_banks_static``; the plan's ``static_banks`` where
        every run's does)."""
        const = None if isinstance(flat, int) else self.constant_bank(s, j)
        return self._slot(flat) if const is None else const

    def constant_bank(self, s, j):
        """The bank tile ``j`` of layered segment ``s`` lands in at every layer
        and step, or None where it depends on the layer
        (``ring_layout.run_banks_static``: decided per run of equal layers)."""
        seg = self.segments[s]
        runs = seg.runs or ((0, len(seg.tiles), 1),)
        if not run_banks_static(runs, j, self.R, self.steps, self.total()):
            return None
        t0, _, _, off = run_of(runs, j)
        return (seg.offset + off + j - t0) % self.R

    def _pieces(self, tile):
        """(col offset, width) of the column pieces of a main-ring tile: a
        tile wider than the bank is folded, piece i in bank rows
        [i*rows, (i+1)*rows), so every bank holds bank_bytes whatever the
        tile's orientation."""
        return tile_pieces(tile, self.banks.shape[2])

    def _dsts(self, tile, slot):
        if tile.bank:
            return [self.aux[tile.bank - 1].at[slot]]
        return [self.banks.at[slot, pl.ds(i * tile.rows_w, tile.rows_w), pl.ds(0, w)]
                for i, (_, w) in enumerate(self._pieces(tile))]

    def _copy(self, s, layer, j, flat):
        seg, tile = self.segments[s], self.segments[s].tiles[j]
        src = self.refs[s][tile.ref]
        if seg.layered:
            src = src.at[layer]
        slot = self._bank(s, j, flat)
        sem = slot
        if self.static_sems and seg.layered and not isinstance(slot, int):
            sem = (seg.offset + j) % self.R
        srcs = [src.at[pl.ds(tile.r0_w, tile.rows_w), pl.ds(tile.c0 + c, w)]
                for c, w in self._pieces(tile)]
        copies = [pltpu.make_async_copy(a, b, self.sems.at[sem, i])
                  for i, (a, b) in enumerate(zip(srcs, self._dsts(tile, slot)))]
        if tile.fmt:           # its scales ride under the same flat index
            scales = self.refs[s][tile.sref]
            if seg.layered:
                scales = scales.at[layer]
            copies.append(pltpu.make_async_copy(
                scales.at[pl.ds(tile.sr0, tile.srows), pl.ds(tile.c0, tile.cols)],
                self._scale_dst(tile, slot), self.sems.at[sem, len(copies)]))
        return _Copies(copies)

    def _scale_dst(self, tile, slot):
        return self.aux[tile.sbank - 1].at[slot]

    def _static(self, flat):
        """(segment, layer, tile) of a static flat index (of the next step past
        the total); a run's layer is its run-layer index."""
        flat = flat % self.total()
        for s, seg in enumerate(self.segments):
            if flat < seg.end:
                if not seg.runs:
                    k, j = divmod(flat - seg.offset, len(seg.tiles))
                    return s, k, j
                rep, place = divmod(flat - seg.offset, seg.per_rep)
                c, i, j = seg.at(place)
                return s, rep * c + i, j
        raise IndexError(flat)

    def _start_static(self, flat):
        s, k, j = self._static(flat)
        if flat < self.total():
            self._copy(s, k, j, flat).start()
            return
        if self.steps == 1:          # past the last step: nothing to fetch
            return

        @pl.when(self.step + 1 < self.steps)
        def _():
            self._copy(s, k, j, flat).start()

    def total(self):
        return self.segments[-1].end

    def prologue(self):
        if self.sync:
            return
        for flat in range(min(self.R, self.total())):
            self._start_static(flat)

    def begin(self, s, k, first, count):
        """An op consumes tiles first..first+count-1 of layer k of segment s.
        Only in the synchronised ablation does this start DMAs: the op's first
        R tiles, nothing earlier having fetched them."""
        if not self.sync:
            return
        self._op_end = first + count
        for j in range(first, first + min(self.R, count)):
            self._copy(s, k, j, self.flat(s, k, j)).start()

    def flat(self, s, k, j):
        """Flat index of tile j of layer k of segment s (of a run's layer:
        k is its run-layer index)."""
        seg = self.segments[s]
        if not seg.runs:
            return seg.offset + k * len(seg.tiles) + j
        t0, n, c, off = seg.run_at(j)
        if c == 1:
            return seg.offset + k * seg.per_rep + off + j - t0
        # (k // c) * per_rep + (k % c) * n, with one division (k >= 0)
        return seg.offset + k * n + quotient(k, c) * (seg.per_rep - c * n) + off + j - t0

    def consume(self, s, k, j, fn):
        """Tile j of layer k of segment s: return ``fn(pieces)`` with pieces
        yielding (col offset in the tile, bank ref view), then start the tile R
        places ahead into the same bank. ``fn`` reads the bank through refs
        (bounded loads), and each piece is waited for (its own semaphore) just
        before ``fn`` reaches it: no load of a later piece can be hoisted
        above its wait and held, spilled, while earlier pieces compute."""
        tile = self.segments[s].tiles[j]
        flat = self.flat(s, k, j)
        copies = self._copy(s, k, j, flat)
        slot = self._bank(s, j, flat)
        dsts = self._dsts(tile, slot)
        if tile.fmt:
            pieces = _arriving_quantized(copies, self._pieces(tile), dsts, tile.dtype,
                                         self._scale_dst(tile, slot))
        else:
            pieces = _arriving(copies, self._pieces(tile), dsts, tile.dtype)
        out = fn(pieces)
        for _ in pieces:         # every DMA is waited for, whatever fn read
            pass
        self._refill(s, k, j)
        return out

    def consume_run(self, s, j, group, i, step, fn):
        """``consume`` for a traced index ``j`` of the (unlayered) head, inside
        a run of groups of tiles shaped like ``group`` (the row tiles of one
        column block) whose column offsets advance by ``step`` = (rows, cols)
        per group: tile i of group j is ``group[i]`` moved by j * step, at
        flat index len(group) * j + i. ``fn(pieces, r0, c0)`` gets its row and
        column offsets too. Starts the tile R flat places on, which the
        caller guarantees lies in the same run. Looping over such a run emits
        its DMA and matmul code once instead of once per tile (the LM head is
        most of a model's tiles)."""
        if self.segments[s].layered:
            raise EmitError(f"a run of tiles is only rolled in the unlayered head, not in "
                            f"segment {s}", path="ring.consume_run")
        g, tile = len(group), group[i]
        flat = self.segments[s].offset + g * j + i
        copies = self._run_copy(s, tile, step, j, flat)
        slot = self._slot(flat)
        dsts = self._dsts(tile, slot)
        if tile.fmt:
            pieces = _arriving_quantized(copies, self._pieces(tile), dsts, tile.dtype,
                                         self._scale_dst(tile, slot))
        else:
            pieces = _arriving(copies, self._pieces(tile), dsts, tile.dtype)
        out = fn(pieces, *_run_offsets(tile.r0, tile.c0, step, j))
        for _ in pieces:         # every DMA is waited for, whatever fn read
            pass
        ahead, later = divmod(i + self.R, g)
        self._run_copy(s, group[later], step, j + ahead, flat + self.R).start()
        return out

    def _run_copy(self, s, tile, step, j, flat):
        src = self.refs[s][tile.ref]
        r0, c0 = _run_offsets(tile.r0_w, tile.c0, (step[0] // tile.per, step[1]), j)
        slot = self._slot(flat)
        srcs = [src.at[pl.ds(r0, tile.rows_w), pl.ds(c0 + c, w)] for c, w in self._pieces(tile)]
        copies = [pltpu.make_async_copy(a, b, self.sems.at[slot, i])
                  for i, (a, b) in enumerate(zip(srcs, self._dsts(tile, slot)))]
        if tile.fmt:           # its scales: the same columns, the tile's scale rows
            if step[0]:
                raise EmitError("a rolled run of quantized tiles steps by columns only, found "
                                f"a row step of {step[0]}", path="ring.consume_run")
            scales = self.refs[s][tile.sref].at[pl.ds(tile.sr0, tile.srows), pl.ds(c0, tile.cols)]
            copies.append(pltpu.make_async_copy(scales, self._scale_dst(tile, slot),
                                                self.sems.at[slot, len(copies)]))
        return _Copies(copies)

    def _refill(self, s, k, j):
        if self.sync:
            if j + self.R < self._op_end:       # the op's own next tile only
                self._copy(s, k, j + self.R, self.flat(s, k, j) + self.R).start()
            return
        seg, n = self.segments[s], len(self.segments[s].tiles)
        ahead, j2 = divmod(j + self.R, n)
        if not seg.layered:          # head: k is static
            self._start_static(seg.offset + j + self.R)
            return
        if seg.runs:             # a body with runs of equal layers
            refill_run(self, s, k, j)
            return
        flat = self.flat(s, k, j) + self.R
        if ahead == 0:
            self._copy(s, k, j2, flat).start()
            return

        @pl.when(k + ahead < seg.count)
        def _():
            self._copy(s, k + ahead, j2, flat).start()

        # Past this stack: the first R flat tiles after its end are static
        # (of the next step, past the total). Tile j2 of repetition
        # count + m (m < ahead) is flat seg.end + m * n + j2, reached from
        # layer k = count - ahead + m: one guarded start per m, where a guard
        # per candidate flat index would emit R of them for each of R tiles.
        after = self.R if self.steps > 1 else min(self.R, self.total() - seg.end)
        for m in range(ahead):
            e = m * n + j2
            if e >= after:
                break
            if seg.count - ahead + m < 0:
                continue

            @pl.when(k == seg.count - ahead + m)
            def _():
                self._start_static(seg.end + e)


def _arriving(copies, pieces, dsts, dtype):
    """(col offset, typed view of its bank words) of each piece, after waiting
    for its DMA."""
    for copy, (c, _), d in zip(copies.copies, pieces, dsts):
        copy.wait()
        yield c, Words(d, dtype)


def _arriving_quantized(copies, pieces, dsts, dtype, scales):
    """(col offset, view of its code words, its scales' words [srows, width])
    of each piece of a quantized tile, after waiting for the scales' DMA (the
    last) and then the piece's."""
    *codes, scale_copy = copies.copies
    scale_copy.wait()
    for copy, (c, w), d in zip(codes, pieces, dsts):
        copy.wait()
        yield c, Words(d, dtype), scales.at[:, pl.ds(c, w)]


class _Copies:
    """Several DMAs (the pieces of one tile) started and waited together."""

    def __init__(self, copies):
        self.copies = copies

    def start(self):
        for c in self.copies:
            c.start()

    def wait(self):
        for c in self.copies:
            c.wait()
