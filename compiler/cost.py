"""Model the step time of a plan (a model, labelled as one wherever it is shown).

After ``estimate``: every phase of the step (each node and all-reduce of each
stack's layer, the prologue and the head) has modeled HBM, MXU, collective and
overhead times, and the step has a modeled time, tokens/s per user, the HBM
floor (bytes read per core / per-core peak bandwidth) and efficiency = floor /
modeled. Per phase:

    time = max(HBM bytes / bandwidth, MXU FLOPs / rate + overheads)
           + collective time + exposed latency

refined by the ring: while the compute side waits (a collective, an expert
fetch after routing) or outruns nothing (compute-bound phases), the weight
ring keeps streaming up to its capacity, and later phases find those tiles
already resident ("credit"). A stack's layers are walked one by one until
the carried credit is steady; the steady layer then stands for the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel.compiler import calibration, dma_service, piece_rates
from megakernel.compiler.cost_timeline import Event, timeline as make_timeline
from megakernel.compiler.layout import itemsize
from megakernel.compiler.request import PlanRequest
from megakernel.compiler.schedule_collectives import CollectivePlan
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.target import Target
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.xla_copies import copy_bytes
from megakernel.ir.graph import Model
from megakernel.registry import Registry

LABEL = "modeled (cost model, not a measurement)"


@dataclass(frozen=True)
class Phase:
    """One phase as the cost model sees it (per occurrence)."""

    name: str
    stack: int | None
    per_step: int
    ring_bytes: int = 0
    other_bytes: int = 0       # KV tiles, expert slices, vectors, gathers, writes
    floor_bytes: int = 0       # bytes the HBM floor counts (valid data only)
    flops: float = 0.0
    tiles: int = 0
    outstanding: int = 1       # DMAs in flight (bandwidth share)
    overhead_s: float = 0.0
    stall_s: float = 0.0       # collective or latency the compute side waits out
    kind: str = "compute"      # compute | collective | stall


@dataclass(frozen=True)
class PhaseCost:
    name: str
    stack: int | None
    per_step: int
    kind: str
    hbm_bytes: int
    hbm_s: float
    mxu_s: float
    overhead_s: float
    stall_s: float
    prefetched_s: float        # HBM time already done ahead by the ring (credit used)
    time_s: float              # steady-state time of one occurrence


@dataclass(frozen=True)
class CostReport:
    label: str
    step_ms: float
    tokens_per_s_per_user: float
    floor_ms: float
    efficiency: float
    hbm_bytes_per_core: int
    floor_bytes_per_core: int
    phases: tuple[PhaseCost, ...]
    timeline: tuple[Event, ...]
    steps_per_call: int = 1
    call_ms: float = 0.0        # the whole call: launch once + steps_per_call steps
    launch_ms: float = 0.0      # per call (kernel launch, first DMA latency)
    copy_bytes: int = 0         # per call: XLA's copies around the kernel (compiler/xla_copies.py)
    copy_ms: float = 0.0        # per call: their time (read and written at the DMA bandwidth)
    # per call: the commit of whole-access state after the kernel, in the same
    # jit (every layer's state read and written, its updates read; plan_memory.StateStream)
    commit_bytes: int = dataclasses.field(default=0, metadata={OMIT_DEFAULT: True})
    commit_ms: float = dataclasses.field(default=0.0, metadata={OMIT_DEFAULT: True})
    # Per stack, layers 2.. walked one by one before the credit settled (each a
    # tuple of PhaseCost); the stack's remaining layers cost its steady layer.
    walked: tuple = ()


def _phases(model: Model, shard: ShardPlan, memory, collectives: CollectivePlan,
            target: Target, request: PlanRequest, memo: dict):
    """(prologue phases, per-stack layer phases, head phases); ``memo``: see ``estimate``."""
    c = target.constants
    rate = target.bf16_flops / (c.f32_matmul_slowdown if model.dtype.value == "float32" else 1)
    rows_eff = max(memory.rows_padded, c.mxu_push_rows)
    ring = dma_service.ring_in_flight(memory.stream.num_banks)
    item = itemsize(model.dtype)
    ar = {s.name: s for s in collectives.sites}
    seconds = {s.name: s.seconds for s in collectives.specs}
    embed_bytes = request.rows * model.hidden_size * item
    pre = [Phase("prologue", None, 1, kind="stall", stall_s=c.kernel_launch_s + c.dma_latency_s),
           Phase("embed", None, 1, other_bytes=embed_bytes, floor_bytes=embed_bytes,
                 overhead_s=c.op_overhead_s, stall_s=c.dma_latency_s, outstanding=ring)]
    if "embed.allreduce" in ar:
        pre.append(Phase("allreduce.embed", None, 1, kind="collective",
                         stall_s=seconds["allreduce"] + c.op_overhead_s))
    stacks = []
    for st, ss, stream in zip(model.stacks, shard.stacks, memory.stream.stacks):
        tiles = {n.node: n for n in stream.node_tiles}
        # a repetition's vectors: every run-layer's
        vec = sum(p.nbytes * ss.reps(p.name) // ss.count for p in ss.params
                  if p.channel == "vector")
        out = []
        cx = _NodeCost(model, ss, memory, target, request, rows_eff, ring)
        # A repetition runs each run's layer once per layer of the run: its
        # phases are named after the body position they stand for.
        for i, (node, name) in enumerate(_repetition(st, ss)):
            mine = tiles.get(node.name)
            rb, n_tiles = (mine.nbytes, mine.count) if mine else (0, 0)
            other = vec if i == 0 else 0
            ph = dict(ring_bytes=rb, other_bytes=other, floor_bytes=rb + other,
                      flops=2.0 * rows_eff * (_node_elements(memo, mine, stream, memory)
                                              if mine else 0),
                      tiles=n_tiles, outstanding=ring,
                      overhead_s=n_tiles * c.tile_overhead_s + c.op_overhead_s)
            ph = COST(node.op.kind, f"layers[{ss.stack}].{node.name}")(cx, node, ph)
            out.append(Phase(f"s{ss.stack}.{name}", ss.stack, ss.count, **ph))
            for red in ss.reductions:
                if red.producer == node.name:
                    # a partial wider than hidden moves in more pieces (a per-slot MoE's)
                    site = ar.get(f"s{ss.stack}.allreduce.{red.tensor}")
                    t = (collectives.spec(site.spec).site_seconds(site.fold, target, site.lanes)
                         if site else seconds["allreduce"])
                    out.append(Phase(f"s{ss.stack}.allreduce.{_renamed(red.tensor, node.name, name)}",
                                     ss.stack, ss.count, kind="collective",
                                     stall_s=t + c.op_overhead_s))
        stacks.append(out)
    head_tiles = memory.stream.head
    hb = memory.stream.head_bytes
    fn = model.hidden_size * item
    head = [Phase("final_norm", None, 1, other_bytes=fn, floor_bytes=fn,
                  overhead_s=c.op_overhead_s, outstanding=ring),
            Phase("lm_head", None, 1, ring_bytes=hb, floor_bytes=hb,
                  other_bytes=memory.rows_padded * shard.vocab_local * 4,
                  flops=2.0 * rows_eff * _mxu_elements(head_tiles, memory),
                  tiles=len(head_tiles), outstanding=ring,
                  overhead_s=len(head_tiles) * c.tile_overhead_s + c.op_overhead_s)]
    if collectives.specs:
        head.append(Phase("logits", None, 1, kind="collective",
                          stall_s=collectives.specs[-1].seconds + c.op_overhead_s))
    head.append(Phase("epilogue", None, 1, overhead_s=c.op_overhead_s))
    return pre, stacks, head, rate


def _node_elements(memo: dict, mine, stream, memory) -> float:
    """``_mxu_elements`` of node tiles ``mine`` of stack ``stream``: they and
    the ring's banks depend on the geometry only through the bank size."""
    key = ("mxu", stream.stack, mine.node, memory.stream.bank_bytes)
    if key not in memo:
        memo[key] = _mxu_elements(stream.tiles[mine.first:mine.first + mine.count], memory)
    return memo[key]


def _mxu_elements(tiles, memory) -> float:
    """bf16 one-dot weight elements as costly to the MXU as ``tiles`` (a node's
    or the head's): plain bf16 ones at their pieces' calibrated cycles
    (``piece_rates``), quantized ones at their format's path
    (``format_factor``), other plain ones at the one-dot rate."""
    pieced = [t for t in tiles if t.format == "plain" and t.dtype == "bfloat16"]
    rest = sum(t.elements * format_factor(t.format) for t in tiles
               if not (t.format == "plain" and t.dtype == "bfloat16"))
    return piece_rates.mxu_elements(pieced, memory.ring, memory.rows_padded) + rest


def _repetition(st, ss):
    """(node, name) of every node one repetition of stack ``st`` runs, in
    order: a run's layer once per layer of the run, named for the body
    position it stands for (``l{first + i}_...``); without runs, the body's
    nodes under their own names."""
    if not ss.runs:
        return [(n, n.name) for n in st.layer.nodes]
    out = []
    for first, c in ss.runs:
        mine = [n for n in st.layer.nodes if n.name.startswith(f"l{first}_")]
        out += [(n, _renamed(n.name, n.name, f"l{first + i}_" + n.name.partition("_")[2]))
                for i in range(c) for n in mine]
    return out


def _renamed(what: str, node: str, name: str) -> str:
    """``what`` (a body name with the ``l{j}_`` prefix of ``node``) under the
    prefix of ``name``."""
    if name == node:
        return what
    return name.partition("_")[0] + "_" + what.partition("_")[2]


@dataclass(frozen=True)
class _NodeCost:
    """What a cost rule sees besides its node: the plan around it."""

    model: Model
    ss: object           # the stack's StackShard
    memory: object
    target: Target
    request: PlanRequest
    rows_eff: float      # LHS rows the MXU charges for (weight-push bound)
    ring: int            # DMAs the weight stream keeps in flight (dma_service.ring_in_flight)

    @property
    def rate(self) -> float:
        """Matmul FLOP/s in the model's dtype (f32 takes several bf16 passes)."""
        c = self.target.constants
        return self.target.bf16_flops / (c.f32_matmul_slowdown
                                         if self.model.dtype.value == "float32" else 1)

    def sequence_stall(self, seconds: float) -> float:
        """What an attention-like op whose work over all sequences takes
        ``seconds`` waits for its windows and first tiles: the first
        sequence's were started a layer ahead; each later one's start when the
        previous sequence begins, so their latency shows where one sequence's
        work is shorter (backends/pallas_tpu/kernels/attention.py, mla_cache.py)."""
        batch = self.request.batch
        return (batch - 1) * max(0.0, self.target.constants.dma_latency_s - seconds / batch)


# One rule per op kind: (ctx, node, phase fields of its ring tiles) -> phase fields.
COST: Registry = Registry("cost", "compiler/kind_*.py (linear, add: compiler/cost.py)")


@COST.register("linear", "add")
def vector_op_cost(cx: _NodeCost, node, ph: dict) -> dict:
    """Ring tiles (if any) through the MXU, plus one op's fixed vector cost."""
    return ph


def format_factor(fmt: str) -> float:
    """Core time of a weight in ``fmt`` against a plain bf16 one: the bf16
    weights per cycle over those of the format's own kernel path (decode,
    scales and dot, ``dequant.matmul``), both measured by `megakernel
    calibrate` (compiler/calibration.json)."""
    if fmt == "plain":
        return 1.0
    cal = calibration.load()
    where = f"format {fmt}"
    return (cal.weights_per_cycle("bfloat16", False, where)
            / cal.weights_per_cycle(f"q.{fmt}", False, where))


def _bw(target: Target, outstanding: int) -> float:
    return dma_service.bandwidth(target, target.constants, outstanding)


def _walk(phases, credit: float, cap: float, bw_of, rate: float, scale: float = 1.0):
    """Times of ``phases`` in order, carrying ring credit (seconds of ring
    streaming already done ahead), each phase's compute times ``scale``.
    Returns (costs, credit after)."""
    costs = []
    for ph in phases:
        bw = bw_of(ph.outstanding)
        credit = min(cap, credit + ph.stall_s)        # the ring streams while we wait
        ring_t, other_t = ph.ring_bytes / bw, ph.other_bytes / bw
        used = min(credit, ring_t)
        credit -= used
        hbm = ring_t - used + other_t
        compute = (ph.flops / rate + ph.overhead_s) * scale
        if compute > hbm:                              # HBM idle: the ring runs ahead
            credit = min(cap, credit + compute - hbm)
        time = max(compute, hbm) + ph.stall_s
        costs.append(PhaseCost(ph.name, ph.stack, ph.per_step, ph.kind,
                               ph.ring_bytes + ph.other_bytes, (ph.ring_bytes + ph.other_bytes) / bw,
                               ph.flops / rate * scale, ph.overhead_s * scale, ph.stall_s,
                               used, time))
    return costs, credit


def estimate(model: Model, shard: ShardPlan, memory, collectives: CollectivePlan,
             target: Target, request: PlanRequest, *, timeline: bool = True,
             memo: dict | None = None, compute_scale: float = 1.0) -> CostReport:
    """The modeled call: its launch and XLA's copies around it
    (``compiler/xla_copies.py``) once, then ``request.steps`` steps; steps
    after the first start with the ring credit the previous head left (the
    ring runs on across the step boundary). step_ms is the call over N.
    ``memo``: a dict kept across estimates of the same model, shard, target
    and request (the geometry search's), for what only the bank size changes.
    ``compute_scale``: every phase's compute (MXU and overheads) times it, for
    a step whose core work is known from libtpu's schedule (floors.with_core_work)."""
    memo = {} if memo is None else memo
    pre, stacks, head, rate = _phases(model, shard, memory, collectives, target, request, memo)
    launch, pre = pre[:1], pre[1:]          # per call: launch; per step: the rest
    stream = memory.stream
    n_tiles = sum(s.per_layer for s in stream.stacks) + len(stream.head)
    avg_tile = (sum(s.bytes_per_layer for s in stream.stacks) + stream.head_bytes) / max(n_tiles, 1)
    in_flight = dma_service.ring_in_flight(stream.num_banks)
    tile = min(avg_tile, stream.bank_bytes)

    rates = {}

    def bw_of(outstanding):               # ring-sized DMAs: their latency counts
        bw = rates.get(outstanding)       # (asked for every phase walked)
        if bw is None:
            bw = rates[outstanding] = dma_service.bandwidth(target, target.constants,
                                                            outstanding, tile)
        return bw

    cap = stream.num_banks * tile / bw_of(in_flight)
    # Nothing streams during the launch, and the call's first DMAs (embedding
    # gather and the ring's first tiles, issued together) pay the one latency
    # the prologue charges: the first step starts with no ring credit, and its
    # embedding waits no second latency (a later step's gather does).
    launch_costs, _ = _walk(launch, 0.0, cap, bw_of, rate)
    launch_s = sum(p.time_s for p in launch_costs)
    # Per call, outside the kernel: XLA's copies around it, each read and written.
    copied = copy_bytes(memory, shard.cores)
    copies_s = 2 * copied / _bw(target, memory.stream.num_banks)
    committed = sum(s.commit_bytes for s in memory.states)
    commit_s = committed / _bw(target, memory.stream.num_banks)
    opening = [dataclasses.replace(p, stall_s=0.0) if p.name == "embed" else p for p in pre]
    latency = target.constants.dma_latency_s
    first = _walk_step(opening, stacks, head, 0.0, cap, bw_of, rate, latency, compute_scale)
    call_s = launch_s + copies_s + commit_s + first[0]
    if request.steps > 1:
        call_s += (request.steps - 1) * _walk_step(pre, stacks, head, first[5], cap, bw_of,
                                                   rate, latency, compute_scale)[0]
    total, costs, first_layers, steady_costs, tail, _, walked = first
    every = pre + [p for s in stacks for p in s] + head
    hbm = sum((p.ring_bytes + p.other_bytes) * p.per_step for p in every)
    floor_bytes = sum(p.floor_bytes * p.per_step for p in every)
    floor_s = floor_bytes / target.hbm_bw
    step_s = call_s / request.steps
    costs = launch_costs + costs
    events = make_timeline(costs, first_layers, walked, steady_costs, tail,
                           model) if timeline else ()
    return CostReport(LABEL, step_s * 1e3, request.tokens / step_s, floor_s * 1e3,
                      floor_s / step_s, hbm, floor_bytes, tuple(costs + steady_costs + tail),
                      events, request.steps, call_s * 1e3, launch_s * 1e3,
                      copy_bytes=copied, copy_ms=copies_s * 1e3, commit_bytes=committed,
                      commit_ms=commit_s * 1e3, walked=walked)


def _walk_step(pre, stacks, head, credit, cap, bw_of, rate, latency, scale=1.0):
    """One step from ring credit ``credit`` -> (seconds, embed costs, first
    layer of each stack, steady layers, head costs, credit after the head,
    per stack the layers walked after the first)."""
    costs, credit = _walk(pre, credit, cap, bw_of, rate, scale)
    first_layers, total = [], sum(p.time_s for p in costs)
    steady_costs, walked = [], []
    for phases in stacks:
        # The first layer's per-layer vectors are fetched as it starts (later
        # layers' while the one before runs): their latency is exposed once.
        opening = [dataclasses.replace(p, stall_s=p.stall_s + latency) if i == 0 and
                   p.other_bytes else p for i, p in enumerate(phases)]
        first, credit = _walk(opening, credit, cap, bw_of, rate, scale)
        count = phases[0].per_step
        total += sum(p.time_s for p in first)
        # Walk the later layers one by one until the carried credit is steady (a
        # layer may drain credit the prologue left, a little per layer: charging
        # an undrained layer for all of them would model bandwidth that is not
        # there), then charge the steady layer for the rest.
        steady, carry, left, mine = first, credit, count - 1, []
        while left > 0:
            layer, after = _walk(phases, carry, cap, bw_of, rate, scale)
            mine.append(tuple(layer))
            total += sum(p.time_s for p in layer)
            left -= 1
            settled = abs(after - carry) <= 1e-12
            steady, carry = layer, after
            if settled:
                break
        total += left * sum(p.time_s for p in steady)
        if count > 1:
            credit = carry
        first_layers.append(first)
        steady_costs += steady
        walked.append(tuple(mine))
    tail, credit = _walk(head, credit, cap, bw_of, rate, scale)
    return (total + sum(p.time_s for p in tail), costs, first_layers, steady_costs, tail, credit,
            tuple(walked))
