"""Routed experts' slots: the expert stream beside the weight ring.

After ``expert_streams``: each MoE node of each stack has an ``ExpertStream``,
its selected experts fetched as ``chunks`` intermediate slices (gate/up
columns + down rows, legal slices of a quantized weight's scales) through
K expert slots, with the slots' bytes and the DMA bytes of a layer;
``chunk_options`` gives the legal slice counts. compiler/tile_weights.py
re-exports them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel.compiler.layout import LANES, padded_bytes, word_rows
from megakernel import dtypes, formats
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.quantized_tiles import slice_ok
from megakernel.compiler.shard import ShardPlan


@dataclass(frozen=True)
class ExpertStream:
    """Expert-slot plan of one MoE node of stack ``stack``: slot k holds
    gate [hidden, chunk], up [hidden, chunk], down [chunk, hidden] of one slice
    of one expert; each expert is ``chunks`` slices of ``chunk`` columns."""

    stack: int
    node: str
    slots: int
    chunk: int
    chunks: int
    hidden: int
    experts_local: int
    max_distinct: int    # worst case distinct experts per layer per core
    dtype: str
    # quantized experts (megakernel/formats.py): codes as 32-bit words in the
    # slots, f32 scales in slots of their own
    format: str = dataclasses.field(default="plain", metadata={OMIT_DEFAULT: True})

    def scale_rows(self, rows: int) -> int:
        """Scale rows of a [rows, N] slice of one expert matrix."""
        fmt = formats.get(self.format)
        return 1 if fmt.group_rows == formats.WHOLE else rows // fmt.group_rows

    @property
    def slot_bytes(self) -> int:
        h, c = self.hidden, self.chunk
        if self.format == "plain":
            return 3 * padded_bytes((h, c), self.dtype)
        words = (2 * padded_bytes((word_rows(h, self.dtype), c), "int32")
                 + padded_bytes((word_rows(c, self.dtype), h), "int32"))
        return words + 2 * padded_bytes((self.scale_rows(h), c), "float32") + padded_bytes(
            (self.scale_rows(c), h), "float32")

    @property
    def chunk_dma_bytes(self) -> int:
        h, c = self.hidden, self.chunk
        codes = 3 * h * c * dtypes.of(self.dtype).bits // 8
        if self.format == "plain":
            return codes
        return codes + 4 * (2 * self.scale_rows(h) * c + self.scale_rows(c) * h)

    @property
    def bytes_per_layer(self) -> int:
        return self.max_distinct * self.chunks * self.chunk_dma_bytes


def expert_streams(shard: ShardPlan, rows: int, top_k: dict[str, int], slots: int,
                   chunks: int | None) -> tuple[ExpertStream, ...]:
    """Slot plans for every MoE node. ``chunks`` slices per expert (rounded to a
    divisor of the 128-lane groups of the per-core intermediate; None = 1)."""
    out = []
    for st in shard.stacks:
        for node, _ep, _tp, local, width in st.experts:
            p = st.param(f"{node}.experts_gate")
            groups = width // LANES
            # a slice of a quantized down matrix brings a legal slice of scale rows
            c = max(d for d in range(1, groups + 1) if groups % d == 0 and d <= (chunks or 1)
                    and (p.format == "plain" or slice_ok(p.format, width, width // d)))
            out.append(ExpertStream(st.stack, node, slots, width // c, c, p.shape[1], local,
                                    min(local, rows * top_k[node]), p.dtype, p.format))
    return tuple(out)


def chunk_options(width: int) -> list[int]:
    """Legal slices-per-expert counts for a per-core intermediate ``width``."""
    groups = width // LANES
    return [d for d in range(1, groups + 1) if groups % d == 0]
