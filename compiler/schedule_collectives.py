"""Schedule the step's collectives: tensor-parallel all-reduces and the logits.

``collective_specs`` (run before memory planning) picks each collective's
algorithm by modeled time and lists the buffers and semaphores it needs.
After ``schedule_collectives``: every all-reduce site sits at a program point
strictly between its producer and its consumer; every site names its slots,
semaphores and parity; the weight-ring tiles in flight while it runs are
recorded. Only the valid rows (batch x tokens) travel, in the plan's wire
dtype (``CollectiveSpec.wire``: the model's activation dtype unless the
``wire`` override says otherwise, so bf16 for bf16 models); the payload the
algorithm is chosen on is those bytes. Partials are rounded to the wire dtype
once; sums run in f32 in rank order 0..N-1 on every core (one-shot: each core
sums all N slots; reduce-scatter: core c sums chunk c, then broadcasts it in
the wire dtype), so all cores hold bit-identical results. Slots are
double-buffered by the parity of the collective's sequence number, so the
layer loop needs no barrier: a peer cannot start collective n+2 before this
core has finished n.
All-reduce sites of the hidden width share the spec ``allreduce``. Sites of
a wider partial (a per-slot MoE's picks, ``fold`` pieces of hidden) move
several times the bytes in each phase, so their best algorithm can differ:
when it does they get a spec of their own, ``allreduce_wide``, with its own
buffers and semaphores. Its sites keep the step's sequence numbers (every
collective completes on every core before the next starts, so a peer cannot
write collective n+2's slots, of either spec, before this core has read n's).
A one-shot site of a partial narrower than hidden (a per-row statistic, a
latent) moves only its lanes, rounded up to 128 (``Collective.lanes``); a
reduce-scatter site moves all of hidden's, its chunks whole lane groups.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel.compiler.buffers import Buffer, Kind, Space
from megakernel.compiler.layout import LANES, itemsize, padded_bytes, round_up, scratch_bytes
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.request import PlanRequest
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.target import Target


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective algorithm and its buffers (shared by all its sites)."""

    name: str
    kind: str            # all_reduce | argmax | all_gather
    algorithm: str       # one_shot | rs_ag | exchange
    payload: tuple[int, ...]
    payload_bytes: int
    wire: str            # dtype on the wire: slots, payload_bytes and bytes_per_peer use it
    phases: int
    bytes_per_peer: int  # per phase
    seconds: float       # modeled
    buffers: tuple[Buffer, ...]
    # Pieces of [rows, hidden] the slots hold: the widest partial the plan
    # reduces (a per-slot MoE's [rows, top_k x latent]) over the hidden size.
    fold: int = dataclasses.field(default=1, metadata={OMIT_DEFAULT: True})

    def site_seconds(self, fold: int, target: Target, lanes: int = 0) -> float:
        """Modeled time of a site moving ``fold`` pieces (or, ``lanes`` set,
        that many lanes of one): latency-bound phases carry more (fewer)
        bytes each (fold 1, lanes 0: ``seconds``)."""
        if fold == 1 and not lanes:
            return self.seconds
        return self.phases * phase_seconds(self.site_bytes_per_peer(fold, lanes), target)

    def site_bytes_per_peer(self, fold: int, lanes: int = 0) -> int:
        """Bytes per peer per phase of a site of ``fold`` pieces or ``lanes`` lanes."""
        if lanes:
            return self.bytes_per_peer * lanes // self.payload[1]
        return self.bytes_per_peer * fold


@dataclass(frozen=True)
class Collective:
    """One site. Per-layer sites (``stack`` set) run once per layer of the
    stack's run holding the producer (``run`` layers per repetition); at
    run-layer index k, ``seq_offset``/``seq_stride``/``seq_skip`` give the
    sequence number seq = seq_offset + k * seq_stride + (k // run) * seq_skip
    (seq_skip: the other runs' collectives of a repetition), and the slot
    parity seq % 2, so consecutive collectives alternate.
    ``overlap_first``: index, relative to the layer's first tile (or flat for
    global sites), of the first of ``overlap_count`` ring tiles in flight while
    the collective runs."""

    name: str
    spec: str
    stack: int | None
    tensor: str
    producer: str
    consumer: str
    point: int
    producer_point: int
    consumer_point: int
    seq_offset: int
    seq_stride: int
    per_step: int
    overlap_first: int
    overlap_count: int
    sum_order: tuple[int, ...]
    run: int = dataclasses.field(default=1, metadata={OMIT_DEFAULT: True})
    seq_skip: int = dataclasses.field(default=0, metadata={OMIT_DEFAULT: True})
    # pieces of [rows, hidden] the site moves (its tensor's width over hidden)
    fold: int = dataclasses.field(default=1, metadata={OMIT_DEFAULT: True})
    # a one-shot site of a partial narrower than hidden: the lanes it moves
    # (its width rounded up to 128); 0: all of hidden's
    lanes: int = dataclasses.field(default=0, metadata={OMIT_DEFAULT: True})

    def seq(self, k: int = 0) -> int:
        """Sequence number at run-layer index ``k``."""
        return self.seq_offset + k * self.seq_stride + (k // self.run) * self.seq_skip

    def parity(self, layer_in_stack: int = 0) -> int:
        return self.seq(layer_in_stack) % 2


@dataclass(frozen=True)
class CollectivePlan:
    specs: tuple[CollectiveSpec, ...]
    sites: tuple[Collective, ...]

    def spec(self, name: str) -> CollectiveSpec:
        return next(s for s in self.specs if s.name == name)

    @property
    def wire(self) -> str | None:
        """The all-reduces' wire dtype (None on one core: nothing travels)."""
        return next((s.wire for s in self.specs if s.kind == "all_reduce"), None)

    @property
    def all_reduces_per_step(self) -> int:
        """All-reduces one step runs: every all-reduce site, once per layer
        of its stack (each rounds its partials to the wire dtype once)."""
        return sum(site.per_step for site in self.sites
                   if self.spec(site.spec).kind == "all_reduce")

    def per_layer(self, stack: int) -> tuple[Collective, ...]:
        return tuple(s for s in self.sites if s.stack == stack)

    def remote_bytes(self, cores: int) -> int:
        """Bytes one core sends to its peers in one step (every site, every
        phase, N-1 peers): what a trace of the executed kernel must show."""
        return sum(site.per_step * self.spec(site.spec).phases * (cores - 1)
                   * self.spec(site.spec).site_bytes_per_peer(site.fold, site.lanes)
                   for site in self.sites)


def phase_seconds(bytes_per_peer: int, target: Target) -> float:
    """Modeled time of one exchange phase: every core sends ``bytes_per_peer``
    to each of its N-1 peers, sibling-core copies and ICI copies in parallel."""
    c, topo = target.constants, target.topology
    siblings = min(topo.cores_per_chip, topo.cores) - 1
    remote = topo.cores - 1 - siblings
    t_sib = c.core_to_core_latency_s + bytes_per_peer / c.core_to_core_bw if siblings else 0.0
    t_ici = (c.collective_phase_s + topo.diameter * c.ici_hop_latency_s
             + remote * bytes_per_peer / c.ici_bw_per_core) if remote else 0.0
    return max(t_sib, t_ici)


def _sems(prefix: str, shape: tuple[int, ...], note: str) -> tuple[Buffer, ...]:
    return tuple(Buffer(f"{prefix}.{part}_sems", Space.SEMAPHORE, Kind.SEMAPHORES, shape,
                        "dma_semaphore", 0, note=note) for part in ("send", "recv"))


def _allreduce(rows: int, hidden: int, wire: str, target: Target,
               forced: str | None, fold: int = 1, name: str = "allreduce") -> CollectiveSpec:
    """The all-reduce of sites of up to ``fold`` pieces of [rows, hidden]:
    the algorithm (``forced``, else the fastest for a site of ``fold``
    pieces) and its buffers, named ``{name}.*``."""
    n, item = target.cores, itemsize(wire)
    payload = (rows, hidden)
    nbytes = rows * hidden * item
    chunk = hidden // n
    options = {"one_shot": (1, nbytes)}
    if hidden % (n * LANES) == 0:          # reduce-scatter chunks must be whole lane groups
        options["rs_ag"] = (2, rows * chunk * item)
    if forced is not None and forced in options:
        algo = forced
    else:
        algo = min(options, key=lambda a: options[a][0] * phase_seconds(fold * options[a][1],
                                                                       target))
    phases, per_peer = options[algo]
    # folded slots: a piece axis after the rank (kernels/collectives.py)
    f, fn = ((fold,), ", piece") if fold > 1 else ((), "")
    if algo == "one_shot":
        bufs = (_slots(f"{name}.slots", (2, n, *f, rows, hidden), wire,
                       f"[parity, sender{fn}] valid rows of the partials; own slot written "
                       "locally"),)
        bufs += _sems(name, (2, n), "[parity, peer]")
    else:
        bufs = (_slots(f"{name}.stage", (2, *f, rows, hidden), wire,
                       f"[parity{fn}] the partial's valid rows, while its chunks are sent"),)
        bufs += tuple(_slots(f"{name}.{ph}_slots", (2, n, *f, rows, chunk), wire, note)
                      for ph, note in (("rs", f"[parity, sender{fn}] chunk c partials"),
                                       ("ag", f"[parity, owner{fn}] reduced chunks")))
        bufs += _sems(name, (2, 2, n), "[parity, phase, peer]")
    return CollectiveSpec(name, "all_reduce", algo, payload, nbytes, wire, phases, per_peer,
                          phases * phase_seconds(per_peer, target), bufs, fold)


def _allreduces(rows: int, hidden: int, wire: str, target: Target, forced: str | None,
                forced_wide: str | None, fold: int) -> list[CollectiveSpec]:
    """The all-reduce specs for sites of up to ``fold`` pieces: one, unless
    the widest sites' algorithm (``forced_wide``, else ``forced``, else the
    fastest for their bytes) differs from the hidden-width sites' (then
    ``allreduce`` for those and ``allreduce_wide`` for the wider)."""
    wide = _allreduce(rows, hidden, wire, target, forced_wide or forced, fold, "allreduce_wide")
    narrow = _allreduce(rows, hidden, wire, target, forced)
    if fold == 1 or wide.algorithm == narrow.algorithm:
        return [_allreduce(rows, hidden, wire, target, narrow.algorithm, fold)]
    return [narrow, wide]


def _slots(name: str, shape: tuple[int, ...], dtype: str, note: str) -> Buffer:
    # kernel scratch: tiled as Mosaic tiles scratch (layout.scratch_rows)
    return Buffer(name, Space.VMEM, Kind.COLLECTIVE, shape, dtype, scratch_bytes(shape, dtype),
                  note=note)


def collective_specs(shard: ShardPlan, request: PlanRequest, target: Target,
                     hidden: int, dtype: str) -> tuple[CollectiveSpec, ...]:
    """Algorithms and buffers of every collective the step needs (none on 1
    core), sized on the valid rows; ``dtype`` is the model's activation dtype,
    the all-reduces' wire dtype unless ``request.overrides.wire`` names one."""
    n = target.cores
    if n == 1:
        return ()
    rows, rows_p = request.rows, round_up(request.rows, 8)
    # The activation dtype on the wire: a bf16 model's partials are rounded to
    # bf16 once (half the bytes of f32); measured on 40 drawn bf16 models on 2
    # and 4 cores, that keeps the logits within half the bf16 tolerance
    # (backends/pallas_tpu/check/against_reference.py, above TOL). f32 models keep f32.
    wire = request.overrides.wire or dtype
    fold = max((site_fold(st, r.tensor, hidden) for st in shard.stacks
                for r in st.reductions), default=1)
    specs = _allreduces(rows, hidden, wire, target, request.overrides.allreduce,
                        request.overrides.allreduce_wide, fold)
    if request.overrides.logits == "argmax":
        shape = (n, rows, LANES)
        bufs = (_slots("argmax.values", shape, "float32", "[sender] per-row local max"),
                _slots("argmax.indices", shape, "int32", "[sender] per-row global argmax"))
        per_peer = 2 * rows * LANES * 4
        sems = Buffer("argmax.sems", Space.SEMAPHORE, Kind.SEMAPHORES, (2, 2, n),
                      "dma_semaphore", 0, note="[send|recv, values|indices, peer]")
        # f32 values and int32 indices: 4 bytes each, whatever the model's dtype
        specs.append(CollectiveSpec("argmax", "argmax", "exchange", (rows, 2), rows * 8,
                                    "float32", 1,
                                    per_peer, phase_seconds(per_peer, target), bufs + (sems,)))
    else:
        shape = (n, rows_p, shard.vocab_local)
        per_peer = rows_p * shard.vocab_local * 4
        bufs = (Buffer("logits.gathered", Space.HBM, Kind.COLLECTIVE, shape, "float32",
                       padded_bytes(shape, "float32"), note="[owner] vocab-sharded logits"),)
        specs.append(CollectiveSpec("gather", "all_gather", "exchange", (rows_p, shard.vocab_local),
                                    per_peer, "float32", 1, per_peer,
                                    phase_seconds(per_peer, target),
                                    bufs + _sems("gather", (n,), "[peer]")))
    return tuple(specs)


def schedule_collectives(shard: ShardPlan, memory, specs: tuple[CollectiveSpec, ...]) -> CollectivePlan:
    """Place every collective of ``specs`` at its program point of ``memory``."""
    if not specs:
        return CollectivePlan((), ())
    n = shard.cores
    order = tuple(range(n))
    ring = memory.stream.num_banks
    hidden = specs[0].payload[1]          # the all-reduce's [rows, hidden]
    sites = []
    seq = 0
    if shard.embed == "vocab":
        sites.append(Collective("embed.allreduce", "allreduce", None, "embed_rows", "embed",
                                "layers.0", memory.point_index("allreduce.embed"),
                                memory.point_index("embed"), memory.first_point(0), 0, 0, 1,
                                0, min(ring, memory.stream.total), order))
        seq = 1
    for st, ss in zip(shard.stacks, memory.stream.stacks):
        # A repetition's collectives in order: each run's, once per layer of
        # the run (a run's nodes, so its reductions, are contiguous).
        keys = [_run_key(st, red.producer) for red in st.reductions]
        runs = [st.reps(red.producer) // st.count for red in st.reductions]
        per_rep = sum(runs)
        for k, red in enumerate(st.reductions):
            c, stride = runs[k], keys.count(keys[k])
            q = k - keys.index(keys[k])
            before = sum(runs[:keys.index(keys[k])])     # earlier runs' collectives
            last = _last_tile_through(ss, memory.stack_nodes[st.stack], red.producer)
            fold = site_fold(st, red.tensor, hidden)
            spec = next(s for s in specs if s.name == _spec_of(specs, fold))
            lanes = round_up(st.width(red.tensor), LANES)
            # only unfolded one-shot slots take a narrower partial (kernels/collectives.py)
            narrow = spec.algorithm == "one_shot" and spec.fold == 1 and lanes < hidden
            lanes = lanes if narrow else 0
            sites.append(Collective(
                f"s{st.stack}.allreduce.{red.tensor}", spec.name, st.stack, red.tensor,
                red.producer, red.consumer,
                memory.point_index(f"s{st.stack}.allreduce.{red.tensor}"),
                memory.point_of(st.stack, red.producer), memory.point_of(st.stack, red.consumer),
                seq + before + q, stride, st.count * c, last + 1, ring, order,
                c, per_rep - c * stride, fold, lanes))
        seq += per_rep * st.count
    head = specs[-1]
    sites.append(Collective(f"logits.{head.name}", head.name, None, "logits", "lm_head", "output",
                            memory.point_index("logits"), memory.point_index("lm_head"),
                            memory.point_index("epilogue"), 0, 0, 1, memory.stream.total, 0, order))
    return CollectivePlan(specs, tuple(sites))


def _spec_of(specs, fold: int) -> str:
    """The all-reduce spec of a site of ``fold`` pieces."""
    names = {s.name for s in specs}
    return "allreduce_wide" if fold > 1 and "allreduce_wide" in names else "allreduce"


def site_fold(st, tensor: str, hidden: int) -> int:
    """Pieces of [rows, hidden] an all-reduce of layer tensor ``tensor`` moves:
    1 for hidden or narrower (zero-padded), more for a wider partial."""
    return max(1, -(-st.width(tensor) // hidden))


def _run_key(st, node: str) -> str:
    """The body run holding ``node`` (its ``l{first}_`` prefix; '' for a
    uniform stack)."""
    return node.split("_")[0] if st.period > 1 and st.runs else ""


def _last_tile_through(ss, node_order: list[str], producer: str) -> int:
    """Index of the last ring tile consumed by the time ``producer`` finishes."""
    upto = set(node_order[:node_order.index(producer) + 1])
    ends = [n.first + n.count - 1 for n in ss.node_tiles if n.node in upto]
    return max(ends, default=-1)


def overlapping_tiles(site: Collective, stream, rep: int = 0) -> list[int]:
    """Flat stream indices of the ring tiles in flight during ``site`` (at
    run-layer index ``rep`` of its run, when the site is per-layer)."""
    if site.stack is None:
        base = site.overlap_first
    else:
        ss = stream.stacks[site.stack]
        # ``rep``: the run-layer index; from the run-layer's first tile, as
        # many places on as overlap_first lies past the run's first tile
        t0 = next((r[1] for r in ss.run_tiles if site.producer.startswith(f"l{r[0]}_")), 0)
        base = ss.flat(rep, t0) + site.overlap_first - t0 if ss.tiles else (
            ss.offset + rep * ss.per_layer + site.overlap_first)
    return [i for i in range(base, base + site.overlap_count) if i < stream.total]
