"""The records a memory plan is made of: memory spaces, program points, buffers,
the operands of the kernel call, and what each kernel library asks for.

A *program point* is one step of the compact step program: the prologue, the
embedding, each node (and each all-reduce) of each stack's layer, and the head.
A stack's points stand for every layer of the stack (the kernel loops over
them), so the program stays short however deep the model is. A buffer's
lifetime is the inclusive range of points during which it holds live data;
buffers living inside a stack are reused by every layer of it.

A buffer's ``role`` says how the kernel gets it: ``scratch`` (declared in the
pallas_call's scratch list, by this name), ``operand`` / ``output`` (an input
or output of the call, in ``MemoryPlan.operands`` order), or ``builtin`` (made
by Mosaic itself, such as the barrier semaphore). The generated kernel declares
exactly the plan's scratch, operands and outputs; nothing else.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from megakernel.compiler.plan_json import BY_LIBRARY, OMIT_DEFAULT


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
    STATE = "state"                      # per-op state windows / staging
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
    role: str = "scratch"

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def ident(self) -> str:
        """The buffer's variable name in the generated kernel."""
        return self.name.removeprefix("hbm.").replace(".", "_")

    def live_at(self, point: int) -> bool:
        return self.first <= point <= self.last


@dataclass(frozen=True)
class Need:
    """One buffer a kernel library asks for, named as the library's argument."""

    name: str
    space: Space
    shape: tuple[int, ...]
    dtype: str
    note: str = ""


@dataclass(frozen=True)
class Binding:
    """Op ``node`` of stack ``stack`` gets plan buffer ``buffer`` as its kernel
    library's argument ``arg`` (buffers may be shared across stacks)."""

    stack: int
    node: str
    arg: str
    buffer: str


@dataclass(frozen=True)
class OpGeometry:
    """The static geometry an op's kernel library runs with on one core; the
    emitter renders it as the library's geometry record, field by field."""

    stack: int
    node: str
    library: str
    geometry: object = field(metadata={BY_LIBRARY: True})


@dataclass(frozen=True)
class Operand:
    """One operand of the kernel call, in call order: plan buffer ``buffer``,
    filled from ``source`` (a weight, a cache, a step input); ``sharded``: the
    global array is the cores' arrays concatenated on axis 0."""

    buffer: str
    source: str
    sharded: bool
    role: str            # step | gather | vector | ring | experts | constant | cache
    stack: int | None = None
    # The weight ring's operands hold 32-bit words, rows packed (ring_layout);
    # ``element`` is the dtype the words carry.
    element: str | None = None
    # An appended state's operand is read only: the plan output holding the
    # call's new rows (written into the cache after the call); None otherwise.
    new_rows: str | None = None
    # A whole-access state's operand is read only too: the plan output holding
    # the call's updates (committed into the state after the call by its op
    # kind's rule, backends/pallas_tpu/kernels/state_commit.py); None otherwise.
    updates: str | None = field(default=None, metadata={OMIT_DEFAULT: True})
