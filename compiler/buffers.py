"""The records a memory plan is made of: memory spaces, program points, buffers.

A *program point* is one step of the compact step program: the prologue, the
embedding, each node (and each all-reduce) of each stack's layer, and the head.
A stack's points stand for every layer of the stack (the kernel loops over
them), so the program stays short however deep the model is. A buffer's
lifetime is the inclusive range of points during which it holds live data;
buffers living inside a stack are reused by every layer of it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Space(enum.Enum):
    VMEM = "vmem"
    SMEM = "smem"
    HBM = "hbm"
    SEMAPHORE = "semaphore"


class Kind(enum.Enum):
    WEIGHT_RING = "weight_ring"
    EXPERT_SLOTS = "expert_slots"
    LAYER_VECTORS = "layer_vectors"      # per-layer norm/bias vectors, [2, n] by parity
    RESIDENT = "resident"                # loaded once per step (final norm)
    KV_TILES = "kv_tiles"
    ACTIVATION = "activation"
    SCRATCH = "scratch"                  # op-internal (accumulators, softmax state)
    ROUTER = "router"
    COLLECTIVE = "collective"
    LOGITS = "logits"
    SCALARS = "scalars"
    SEMAPHORES = "semaphores"
    HBM_WEIGHTS = "hbm_weights"
    HBM_CACHE = "hbm_cache"
    HBM_OUTPUT = "hbm_output"


@dataclass(frozen=True)
class Point:
    """A program point; ``stack``/``node`` are None outside stacks."""

    index: int
    label: str
    stack: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class Buffer:
    """One allocation of the step. ``shape``/``dtype`` are what the code
    generator declares; ``nbytes`` is the tile-padded size it occupies
    (0 for semaphores, which are counted by ``count``)."""

    name: str
    space: Space
    kind: Kind
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    first: int = 0
    last: int = 0
    note: str = ""

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    def live_at(self, point: int) -> bool:
        return self.first <= point <= self.last
