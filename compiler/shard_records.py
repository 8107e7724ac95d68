"""The records of a sharding: how a tensor, a weight or a state is cut over cores.

After import: a tensor's state is ``REP``, ``PARTIAL`` or a ``Split`` (an
axis cut into slices, possibly replicated on neighbouring cores); a weight's
cut is a ``ParamShard`` (with the channel that brings it to VMEM), an op
state's a ``StateShard``, and an all-reduce site a ``Reduction``. The
sharding pass (compiler/shard_pass.py) and the per-kind rules
(compiler/shard_rules.py, compiler/kind_*.py) build them; shard_rules.py
re-exports them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.layout import itemsize, padded_bytes


REP, PARTIAL = "rep", "partial"


@dataclass(frozen=True)
class Split:
    """``axis`` cut into ``parts`` slices of ``stride`` entries (the last may be
    short), zero-padded to ``padded``; core c holds slice (c // div) % parts, so
    ``div`` > 1 means neighbouring cores hold the same slice (replication)."""

    axis: int
    parts: int
    div: int
    stride: int
    padded: int

    def part(self, core: int) -> int:
        return (core // self.div) % self.parts


@dataclass(frozen=True)
class ParamShard:
    """How one weight is cut. ``name`` is layer-local (``q_proj.weight``) for
    layer weights, global (``embed.weight``) otherwise. ``channel`` says how it
    reaches VMEM: ring (streamed tiles), vector (parity double buffer), experts
    (expert slots), gather (rows by token id), resident."""

    name: str
    full_shape: tuple[int, ...]
    dtype: str
    splits: tuple[Split, ...]
    channel: str
    role: str
    # megakernel/formats.py: "plain", or a quantized format (``dtype`` is then
    # its code dtype); ``scale_of`` names the weight a scale companion serves
    # (compiler/shard_formats.py).
    format: str = field(default="plain", metadata={OMIT_DEFAULT: True})
    scale_of: str = field(default="", metadata={OMIT_DEFAULT: True})

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-core shape, padding included."""
        out = list(self.full_shape)
        for s in self.splits:
            out[s.axis] = s.padded
        return tuple(out)

    @property
    def nbytes(self) -> int:
        return padded_bytes(self.shape, self.dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def item(self) -> int:
        return itemsize(self.dtype)

    def source(self, core: int) -> tuple[slice, ...]:
        """The region of the full weight core ``core`` holds (before padding)."""
        return _source(self.full_shape, self.splits, core)


@dataclass(frozen=True)
class StateShard:
    """How one op's state (``Op.state``) is cut: ``splits`` on its axes (the
    batch axis is never split); the kernel holds a core's slice with the axes
    from ``merge`` on flattened into one (e.g. K/V heads merged into lanes)."""

    node: str
    name: str
    access: str
    splits: tuple[Split, ...]
    merge: int | None = None

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        """A core's slice of a state of shape ``full`` (padding included)."""
        out = list(full)
        for s in self.splits:
            out[s.axis] = s.padded
        return tuple(out)

    def layout(self, full: tuple[int, ...]) -> tuple[int, ...]:
        """The slice as the kernel holds it."""
        shape = self.shape(full)
        if self.merge is None:
            return shape
        return (*shape[:self.merge], math.prod(shape[self.merge:]))

    def source(self, full: tuple[int, ...], core: int) -> tuple[slice, ...]:
        return _source(full, self.splits, core)


def _source(full, splits, core) -> tuple[slice, ...]:
    """The region of an array of shape ``full`` core ``core`` holds (before padding)."""
    region = [slice(0, d) for d in full]
    for s in splits:
        lo = min(s.part(core) * s.stride, full[s.axis])   # trailing parts may be all padding
        region[s.axis] = slice(lo, min(lo + s.stride, full[s.axis]))
    return tuple(region)


@dataclass(frozen=True)
class Reduction:
    """A partial sum ``tensor`` from ``producer`` that must be all-reduced
    before ``consumer`` (its first reader that needs the full value) reads it."""

    tensor: str
    producer: str
    consumer: str
