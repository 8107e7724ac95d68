"""Plan the memory of one decode step: every buffer's space, shape, size, lifetime.

After ``plan_memory``: every buffer the kernel declares (weight ring, expert
slots, per-layer vectors, KV tiles, op-library buffers, collective slots,
SMEM scalars, semaphores), every operand and output of the kernel call (in
call order, ``operands``), and the HBM weights and caches, has a space, a
declared shape and dtype, a tile-padded size and a lifetime over the compact
step program; each op library's geometry and the buffers bound to its
arguments are recorded. The kernel declares exactly these buffers, so the
VMEM it declares is ``vmem_declared``; with Mosaic's own use for the values
the kernel computes on (``values_bytes``, estimated) that is ``vmem_total``,
which fits the target's VMEM budget. Buffers of the same name in several
stacks are one allocation, live over the union of their uses.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from megakernel.compiler.buffers import Binding, Buffer, Kind, OpGeometry, Operand, Point, Space
from megakernel.compiler.layout import (LANES, RUN_LOOP_VALUES, itemsize, mib, round_up, sublanes,
                                       values_bytes)
from megakernel.compiler.plan_buffers import BufferTable, layer_buffers, layer_table, sized
from megakernel.compiler.plan_operands import operand_table
from megakernel.compiler.ring_layout import RingLayout
from megakernel.compiler.request import PlanRequest
from megakernel.compiler.schedule_collectives import CollectiveSpec
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.target import Target
from megakernel.compiler.tile_weights import (ExpertStream, WeightStream, expert_streams,
                                              ring_stream)
from megakernel.errors import PlanningError
from megakernel.ir.graph import Model
from megakernel.ir.types import APPEND, WHOLE


@dataclass(frozen=True)
class Geometry:
    """The tunable sizes: ring banks, expert slots (and slices per expert), KV tile."""

    bank_bytes: int
    num_banks: int
    expert_slots: int
    slot_chunks: int
    kv_tile: int


@dataclass(frozen=True)
class KVStream:
    """The appended states (``parts``, e.g. K and V) of one node of stack
    ``stack``: each in HBM as ``cache_shape`` = [repetitions, batch,
    max_seq_len, width] (the core's slice, heads merged into lanes), read in
    tiles of ``kv_tile`` rows into VMEM. ``read_tokens``: valid rows per
    sequence one step reads (``Op.rows_read``)."""

    stack: int
    node: str
    parts: tuple[str, ...]
    kv_tile: int
    width: int
    cache_shape: tuple[int, ...]
    read_tokens: int
    tiles_per_seq: int
    batch: int
    dtype: str

    @property
    def bytes_per_layer(self) -> int:
        """Modeled HBM bytes (whole tiles, every part)."""
        return (len(self.parts) * self.batch * self.tiles_per_seq * self.kv_tile * self.width
                * itemsize(self.dtype))

    @property
    def valid_bytes_per_layer(self) -> int:
        return len(self.parts) * self.batch * self.read_tokens * self.width * itemsize(self.dtype)


@dataclass(frozen=True)
class StateStream:
    """The whole-access states (``parts``, e.g. a conv history and a recurrent
    state) of one node of stack ``stack``, read only in the kernel: every step
    reads each repetition's slice from HBM into VMEM and stores the window of
    the call's updates to its output (``new.<state>``), which a later step of
    a multi-step call reads back; after the call the same jit commits the
    updates into the state (backends/pallas_tpu/kernels/state_commit.py). ``part_bytes``:
    bytes of one repetition's slice of each part (a core's, as the kernel
    holds it); ``update_bytes``: one repetition's update windows, all parts."""

    stack: int
    node: str
    parts: tuple[str, ...]
    part_bytes: tuple[int, ...]
    count: int
    update_bytes: int = 0
    steps: int = 1

    @property
    def bytes_per_layer(self) -> int:
        """HBM bytes one repetition moves in the kernel per step (on average over
        the call's steps): every part read, the update windows stored, and read
        back on every step but the first."""
        back = self.update_bytes * (self.steps - 1) // self.steps
        return sum(self.part_bytes) + self.update_bytes + back

    @property
    def bytes_per_step(self) -> int:
        return self.count * self.bytes_per_layer

    @property
    def commit_bytes(self) -> int:
        """HBM bytes of the commit after the call, once per call: every layer's
        state read and written, and its update windows read."""
        return self.count * (2 * sum(self.part_bytes) + self.update_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    geometry: Geometry
    rows: int
    rows_padded: int
    points: tuple[Point, ...]
    stack_nodes: tuple[tuple[str, ...], ...]
    buffers: tuple[Buffer, ...]
    operands: tuple[Operand, ...]
    bindings: tuple[Binding, ...]
    geometries: tuple[OpGeometry, ...]
    ring: RingLayout
    stream: WeightStream
    experts: tuple[ExpertStream, ...]
    kv: tuple[KVStream, ...]
    values_bytes: int
    vmem_budget: int
    smem_capacity: int
    hbm_capacity: int
    states: tuple[StateStream, ...] = ()

    def _total(self, space: Space) -> int:
        return sum(b.nbytes for b in self.buffers if b.space == space)

    @property
    def vmem_declared(self) -> int:
        """VMEM the generated kernel declares: scratch, operands and outputs."""
        return self._total(Space.VMEM)

    @property
    def vmem_total(self) -> int:
        """Declared VMEM plus Mosaic's own use for the kernel's values."""
        return self.vmem_declared + self.values_bytes

    def scratch(self) -> tuple[Buffer, ...]:
        """The kernel's scratch buffers, in declaration order."""
        return tuple(b for b in self.buffers if b.role == "scratch" and b.space != Space.HBM)

    def bound(self, stack: int, node: str) -> dict[str, str]:
        """Library argument -> plan buffer name, for one op of one stack."""
        return {b.arg: b.buffer for b in self.bindings if (b.stack, b.node) == (stack, node)}

    def geometry_of(self, stack: int, node: str):
        return self._at[OpGeometry, stack, node]

    def kv_of(self, stack: int, node: str) -> KVStream:
        return self._at[KVStream, stack, node]

    def experts_of(self, stack: int, node: str) -> ExpertStream:
        return self._at[ExpertStream, stack, node]

    @functools.cached_property
    def _at(self) -> dict:
        """(record type, stack, node) -> the op geometry, KV or expert stream
        of that node (the cost rules look one up for every node of every
        geometry the planner tries: a scan was quadratic in the stacks)."""
        out = {}
        for x in (*self.geometries, *self.kv, *self.experts):
            out.setdefault((type(x), x.stack, x.node), x)
        return out

    @property
    def smem_total(self) -> int:
        return self._total(Space.SMEM)

    @property
    def hbm_total(self) -> int:
        return self._total(Space.HBM)

    @property
    def semaphore_count(self) -> int:
        return sum(b.count for b in self.buffers if b.space == Space.SEMAPHORE)

    def live_vmem(self, point: int) -> int:
        return self.values_bytes + sum(b.nbytes for b in self.buffers
                                       if b.space == Space.VMEM and b.live_at(point))

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def point_index(self, label: str) -> int:
        return next(p.index for p in self.points if p.label == label)

    def point_of(self, stack: int, node: str) -> int:
        return self.point_index(f"s{stack}.{node}")

    def first_point(self, stack: int) -> int:
        return next(p.index for p in self.points if p.stack == stack)


def program_points(model: Model, shard: ShardPlan) -> tuple[Point, ...]:
    labels: list[tuple[str, int | None, str | None]] = [("prologue", None, None), ("embed", None, None)]
    if shard.cores > 1 and shard.embed == "vocab":
        labels.append(("allreduce.embed", None, None))
    for st, ss in zip(model.stacks, shard.stacks):
        for node in st.layer.nodes:
            labels.append((f"s{ss.stack}.{node.name}", ss.stack, node.name))
            labels += [(f"s{ss.stack}.allreduce.{r.tensor}", ss.stack, None)
                       for r in ss.reductions if r.producer == node.name]
    labels += [("final_norm", None, None), ("lm_head", None, None), ("logits", None, None),
               ("epilogue", None, None)]
    return tuple(Point(i, label, s, n) for i, (label, s, n) in enumerate(labels))


def _run_loop_values(model: Model) -> int:
    """What the op kinds of the runs a stack loops over add to the values
    (layout.RUN_LOOP_VALUES: the largest rule of any of them, once)."""
    looped = {n.op.kind for st in model.stacks for first, c in st.runs if c > 1
              for n in st.layer.nodes if n.name.startswith(f"l{first}_")}
    return max((RUN_LOOP_VALUES[k] for k in looped if k in RUN_LOOP_VALUES), default=0)


def kv_streams(model: Model, shard: ShardPlan, request: PlanRequest, kv_tile: int):
    """One KVStream per node with appended state (``StateShard.access``)."""
    out = []
    for st, ss in zip(model.stacks, shard.stacks):
        nodes = dict.fromkeys(s.node for s in ss.states if s.access == APPEND)
        for name in nodes:
            op = st.layer.node(name).op
            specs = op.state(request.batch, model.max_seq_len, model.dtype)
            mine = [s for s in ss.states if s.node == name and s.access == APPEND]
            layouts = {s.layout(specs[s.name].shape) for s in mine}
            dtypes = {specs[s.name].dtype.value for s in mine}
            if len(layouts) != 1 or len(dtypes) != 1:
                raise PlanningError(f"appended states {[s.name for s in mine]} differ in "
                                    "layout or dtype; one stream reads them together",
                                    path=f"plan.layers[{ss.stack}].{name}")
            (layout,), (dtype,) = layouts, dtypes
            valid = request.context + request.tokens
            n = op.rows_read(valid, request.tokens)
            tiles = -(-valid // kv_tile)
            if n < valid:
                tiles = min(tiles, -(-n // kv_tile) + 1)   # the window may straddle a tile edge
            out.append(KVStream(ss.stack, name, tuple(s.name for s in mine), kv_tile,
                                layout[-1], (ss.reps(name), *layout), n, tiles, request.batch,
                                dtype))
    return tuple(out)


def state_streams(model: Model, shard: ShardPlan, request: PlanRequest, buffers=()):
    """One StateStream per node with whole-access state (``StateShard.access``);
    ``buffers``: the plan's, whose ``new.<state>`` outputs size the updates."""
    outputs = {b.name: b for b in buffers}
    out = []
    for st, ss in zip(model.stacks, shard.stacks):
        for name in dict.fromkeys(s.node for s in ss.states if s.access == WHOLE):
            specs = st.layer.node(name).op.state(request.batch, model.max_seq_len, model.dtype)
            mine = [s for s in ss.states if s.node == name and s.access == WHOLE]
            sizes = tuple(math.prod(s.layout(specs[s.name].shape)) * specs[s.name].dtype.itemsize
                          for s in mine)
            news = [outputs.get(f"new.s{ss.stack}.{name}.{s.name}") for s in mine]
            updates = sum(math.prod(b.shape[1:]) * itemsize(b.dtype) for b in news if b)
            out.append(StateStream(ss.stack, name, tuple(s.name for s in mine), sizes, ss.reps(name),
                                   updates, request.steps))
    return tuple(out)


def kv_tile_options(model: Model) -> list[int]:
    """KV tile sizes (tokens) that divide max_seq_len, 16..2048; the whole
    cache when none does."""
    seq = model.max_seq_len
    opts = [t for t in (16, 32, 64, 128, 256, 512, 1024, 2048) if t <= seq and seq % t == 0]
    return opts or [seq]


def _kept(memo: dict | None, key, make):
    """``make()``, kept in ``memo`` under ``key`` (None: not kept)."""
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


def plan_memory(model: Model, shard: ShardPlan, target: Target, request: PlanRequest,
                geometry: Geometry, specs: tuple[CollectiveSpec, ...], *,
                check: bool = True, memo: dict | None = None) -> MemoryPlan:
    """``memo``: a dict the caller keeps for plans of the same model, shard,
    target, request and specs (the geometry search's): the parts that do not
    depend on the geometry, or on only some of its fields, are made once. A
    model of hundreds of stacks has thousands of buffers, made again for each
    geometry tried without it."""
    g = geometry
    dt = model.dtype.value
    quantum = LANES * itemsize(dt) * sublanes(dt)     # one native tile
    if g.bank_bytes % quantum or g.num_banks < 2:
        raise PlanningError(f"bank_bytes={g.bank_bytes} must be a multiple of {quantum} "
                            f"and num_banks={g.num_banks} at least 2", path="plan.ring")
    points = _kept(memo, "points", lambda: program_points(model, shard))
    rows = request.rows
    rows_p = round_up(rows, 8)
    stream, ring = _kept(memo, ("stream", g.bank_bytes),
                         lambda: ring_stream(shard, target, g.bank_bytes, g.num_banks))
    if stream.num_banks != g.num_banks:       # the tiles do not depend on the count
        stream = dataclasses.replace(stream, num_banks=g.num_banks)
        ring = dataclasses.replace(ring, num_banks=g.num_banks)
    top_k = {name: st.layer.node(name).op.top_k for st, ss in zip(model.stacks, shard.stacks)
             for name, *_ in ss.experts}
    routed = min(rows, request.overrides.expert_rows or rows)   # rows of distinct experts
    experts = _kept(memo, ("experts", g.expert_slots, g.slot_chunks), lambda: expert_streams(
        shard, routed, top_k, g.expert_slots, g.slot_chunks))
    kv = _kept(memo, ("kv", g.kv_tile), lambda: kv_streams(model, shard, request, g.kv_tile))
    index = {p.label: p.index for p in points}
    last = len(points) - 1
    # The call's operands and outputs first (their order is the call's).
    first, operands = _kept(memo, "operands",
                            lambda: operand_table(model, shard, request, rows_p, last))
    table = BufferTable(first)
    # Step-wide scratch: the ring, the embedding gather, the residual stream.
    table.add(sized("ring.banks", Space.VMEM, Kind.WEIGHT_RING, ring.shape, ring.dtype, 0, last,
                    "tile t in bank t % R, at its top-left corner; wide tiles folded"))
    for i in range(len(ring.aux)):
        table.add(sized(f"ring.aux{i}", Space.VMEM, Kind.WEIGHT_RING, ring.aux_shape(i),
                        ring.dtype, 0, last, "ring of one unaligned tile shape"))
    table.add(sized("ring.sems", Space.SEMAPHORE, Kind.SEMAPHORES,
                    (g.num_banks, ring.sems_per_bank), "dma_semaphore", 0, last,
                    "[bank, piece]: each piece of a folded tile waited for on its own"))
    # A DMA along the tiled row axis must start on a tile: each token's row
    # arrives inside its aligned block of `sublanes` rows.
    table.add(sized("embed.rows", Space.VMEM, Kind.ACTIVATION,
                    (rows, sublanes(dt), model.hidden_size), dt, 0, index["embed"],
                    "per token, the aligned block of rows holding its embedding row"))
    table.add(sized("embed.sems", Space.SEMAPHORE, Kind.SEMAPHORES, (1,), "dma_semaphore",
                    0, index["embed"], "row gathers"))
    if shard.cores > 1:
        table.add(sized("barrier", Space.SEMAPHORE, Kind.SEMAPHORES, (1,), "barrier_semaphore",
                        0, 0, "start handshake before the first remote copy", role="builtin"))
    part, *layers = _kept(memo, ("layers", g.kv_tile, g.expert_slots, g.slot_chunks),
                          lambda: layer_table(model, shard, request, points, kv, experts,
                                               rows_p, target))
    if not table.merge(part):          # a layer buffer's name is taken: add them in order here
        layers = layer_buffers(table, model, shard, request, points, kv, experts, rows_p, target)
    bindings, geometries, layer_peak = layers
    # The head holds the normed hidden state and a few logits blocks as values.
    head_peak = 4 * rows_p * (model.hidden_size + 3 * stream.head_block)
    values = values_bytes(ring.bank_rows * ring.bank_cols * itemsize(ring.dtype), ring.max_pieces,
                          max(layer_peak, head_peak),
                          run_loop_values=_run_loop_values(model))
    _collective_buffers(table, specs, points)
    buffers = table.buffers()
    plan = MemoryPlan(g, rows, rows_p, points,
                      tuple(tuple(n.name for n in st.layer.nodes) for st in model.stacks),
                      buffers, operands, bindings, geometries, ring, stream, experts,
                      kv, values, target.vmem_budget, target.smem_bytes, target.hbm_bytes,
                      _kept(memo, "states", lambda: state_streams(model, shard, request, buffers)))
    if check:
        _check_capacity(plan, target)
    return plan


def _collective_buffers(table: BufferTable, specs, points) -> None:
    ar = [p.index for p in points if "allreduce" in p.label]
    logits = next(p.index for p in points if p.label == "logits")
    for spec in specs:
        first, last = (ar[0], ar[-1]) if spec.kind == "all_reduce" else (logits, logits)
        for b in spec.buffers:
            table.add(Buffer(b.name, b.space, b.kind, b.shape, b.dtype, b.nbytes, first, last,
                             b.note))


def _check_capacity(plan: MemoryPlan, target: Target) -> None:
    if plan.vmem_total > plan.vmem_budget:
        big = sorted((b for b in plan.buffers if b.space == Space.VMEM),
                     key=lambda b: -b.nbytes)[:4]
        listing = ", ".join(f"{b.name} {mib(b.nbytes)}" for b in big)
        raise PlanningError(
            f"VMEM buffers need {mib(plan.vmem_total)} but the budget is "
            f"{mib(plan.vmem_budget)} ({mib(target.vmem_bytes)} minus "
            f"{mib(target.vmem_reserve)} reserve); largest: {listing}", path="plan.vmem",
            hint="use fewer or smaller ring banks / expert slots, a smaller batch, "
                 "or more TensorCores")
    if plan.smem_total > plan.smem_capacity:
        raise PlanningError(f"SMEM scalars need {plan.smem_total} bytes, capacity "
                            f"{plan.smem_capacity}", path="plan.smem",
                            hint="lower batch x tokens per step")
    if plan.hbm_total > plan.hbm_capacity:
        raise PlanningError(f"weights, caches and outputs need {plan.hbm_total / 1e9:.1f} GB "
                            f"of HBM per core, capacity {plan.hbm_capacity / 1e9:.1f} GB",
                            path="plan.hbm", hint="use more TensorCores or a shorter max_seq_len")
