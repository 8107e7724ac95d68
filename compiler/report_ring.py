"""The report's account of the weight ring's VMEM, byte for byte from the plan.

``ring_lines(plan)`` gives the main banks and every auxiliary ring with its
shape in 32-bit words, its declared bytes (``MemoryPlan.buffers``, as the
kernel declares them) and why it is that size: ``bank_bytes`` bounds a
tile's bytes, but a bank is as tall as the tallest tile once folded into
column pieces, so it may hold more than ``bank_bytes`` (ring_layout.py); an
unaligned tile shape gets a ring of its own. The ring total is the sum of
the plan's ``ring.*`` VMEM buffers, so it equals what the buffer table lists.
"""

from __future__ import annotations

from megakernel.compiler.buffers import Kind
from megakernel.compiler.layout import LANES, mib, round_up, scratch_rows, size_text


def ring_buffers(memory):
    """The plan's VMEM buffers of the weight ring (banks and auxiliary rings)."""
    return [b for b in memory.buffers if b.kind == Kind.WEIGHT_RING]


def _tiles(stream):
    """(weight name, tile): one tile of each shape of each weight the ring holds."""
    named = [(f"stack{st.stack}.{t.param}", t) for st in stream.stacks for t in st.tiles]
    named += [(t.param, t) for t in stream.head]
    return list({(n, t.rows, t.cols, t.dtype, t.format): (n, t) for n, t in named}.values())


def _words(shape) -> str:
    return "x".join(map(str, shape))


def _tiled(shape) -> str:
    """How a [rows, cols] word ring is laid out where tiling pads it."""
    rows, cols = scratch_rows(shape[0], "int32"), round_up(shape[1], LANES)
    return "" if (rows, cols) == tuple(shape) else f", laid out as {rows}x{cols}"


def ring_lines(plan) -> list[str]:
    m, g = plan.memory, plan.memory.geometry
    ring = m.ring
    bufs = {b.name: b for b in ring_buffers(m)}
    banks = bufs["ring.banks"]
    tiles = _tiles(m.stream)
    main = [(n, t) for n, t in tiles if ring.bank_of(t) == 0] or tiles   # as ring_layout
    # The bank's rows: the tallest tile once folded into bank-wide column pieces.
    name, tall = max(main, key=lambda nt: nt[1].words[0] * ring.pieces(nt[1]))
    pieces = ring.pieces(tall)
    last = ring.piece_widths(tall)[-1]
    fold = (f"{name}'s {_words(tall.words)}-word tile in {pieces} pieces of "
            f"{ring.bank_cols} columns" + (f" (the last {last} wide)" if last != ring.bank_cols
                                           else "") + f" stacks to {ring.bank_rows} rows"
            if pieces > 1 else f"{name}'s {_words(tall.words)}-word tile")
    widest = max(t.nbytes for _, t in tiles)
    out = [f"ring banks (ring.banks): {ring.num_banks} x {_words(ring.shape[1:])} int32 words"
           f"{_tiled(ring.shape[1:])} = {ring.num_banks} x {mib(banks.nbytes // ring.num_banks)} = {mib(banks.nbytes)}; "
           f"bank_bytes {mib(g.bank_bytes)} bounds a tile's bytes (the largest streams "
           f"{mib(widest)}); a bank is as tall as the tallest tile folded into bank-wide "
           f"pieces: {fold}"]
    for i, shape in enumerate(ring.aux):
        b = bufs[f"ring.aux{i}"]
        held = list(dict.fromkeys(n for n, t in tiles if ring.bank_of(t) == i + 1))
        scaled = list(dict.fromkeys(n for n, t in tiles
                                    if t.scale_view and ring.scale_bank(t) == i + 1))
        what = "; ".join(
            ([f"the tiles of {', '.join(held)} (not whole (8, 128) word tiles, which a "
              "DMA into a corner of a bank needs)"] if held else [])
            + ([f"the f32 scales of {', '.join(scaled)}"] if scaled else []))
        out.append(f"auxiliary ring ring.aux{i}: {ring.num_banks} x {_words(shape)} int32 "
                   f"words{_tiled(shape)} = {size_text(b.nbytes)}, for {what}")
    total = sum(b.nbytes for b in bufs.values())
    parts = " + ".join(size_text(b.nbytes) for b in bufs.values())
    out.append(f"ring total: {mib(total)} of VMEM ({total:,} bytes"
               + (f" = {parts}" if len(bufs) > 1 else "") + ")")
    return out
