"""Choose the ring geometry: bank size and count, expert slots, KV tile.

After ``choose_geometry``: the returned geometry fits the VMEM budget and has
the lowest modeled step time found by a coordinate search (expert slots and
slices, then KV tile, then bank size x bank count, twice); among geometries
within 0.1% of the best time the one using less VMEM wins, leaving headroom.
Then, at that bank size, the fewest more banks that divide every layer's
tiles are taken where they fit and cost no modeled time
(``WeightStream.static_banks``): each tile's bank is then a constant in the
kernel, which libtpu's static schedule shows costs the core less and which
its profile pass accepts where a computed bank can abort it (docs/floors.md).
A field set in the overrides is held fixed. No feasible geometry raises a
PlanningError that names the fixed buffers and the budget.
"""

from __future__ import annotations

import collections
import dataclasses

from megakernel.compiler import cost
from megakernel.compiler.layout import mib
from megakernel.compiler.plan_memory import Geometry, kv_tile_options, plan_memory
from megakernel.compiler.schedule_collectives import schedule_collectives
from megakernel.compiler.ring_layout import ring_layout
from megakernel.compiler.tile_weights import chunk_options, piece_cols, tile_stream
from megakernel.errors import PlanningError

KiB, MiB = 2**10, 2**20
BANK_OPTIONS = (128 * KiB, 256 * KiB, 512 * KiB, MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB)
# Every bank count from 2 to 128: the ring's VMEM is linear in the count, so
# checking that one fits is cheap, and the bisection of ``_ring_pass`` evaluates
# about log2(127) of them per bank size.
BANK_COUNTS = tuple(range(128, 1, -1))
SLOT_COUNTS = (2, 3, 4, 6, 8)
TOLERANCE = 1e-3
# Memory plans the search keeps (the best so far is among the last evaluated).
KEPT_PLANS = 4


@dataclasses.dataclass
class _Search:
    model: object
    shard: object
    target: object
    request: object
    specs: tuple
    seen: dict = dataclasses.field(default_factory=dict)
    fixed: dict = dataclasses.field(default_factory=dict)
    per_bank: dict = dataclasses.field(default_factory=dict)
    # The memory plans of the last few evaluations only: a plan holds every
    # stack's buffers, and keeping all of them (one per geometry tried) took
    # 1.4 GB for a 1,024-layer model with an irregular sliding/full pattern.
    plans: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)
    # The parts of a memory plan (and of its cost) that do not depend on every
    # field of the geometry, made once for all the geometries tried
    # (``plan_memory``'s and ``cost.estimate``'s memo): a 1,024-layer model of
    # an irregular sliding/full pattern (288 stacks) took 115 s without.
    memo: dict = dataclasses.field(default_factory=dict)

    def plan(self, g: Geometry, check: bool = True):
        return plan_memory(self.model, self.shard, self.target, self.request, g, self.specs,
                           check=check, memo=self.memo)

    def memory(self, g: Geometry):
        """The memory plan of evaluated, feasible ``g`` (planned again if dropped)."""
        if g not in self.plans:
            self._keep(g, self.plan(g))
        return self.plans[g]

    def _keep(self, g: Geometry, memory) -> None:
        self.plans[g] = memory
        self.plans.move_to_end(g)
        while len(self.plans) > KEPT_PLANS:
            self.plans.popitem(last=False)

    def fixed_vmem(self, g: Geometry) -> int:
        """VMEM of everything but the ring (it does not depend on the ring)."""
        key = (g.expert_slots, g.slot_chunks, g.kv_tile)
        if key not in self.fixed:
            probe = dataclasses.replace(g, bank_bytes=max(BANK_OPTIONS), num_banks=2)
            memory = self.plan(probe, check=False)
            self.fixed[key] = memory.vmem_total - memory.ring.nbytes
        return self.fixed[key]

    def ring_bytes(self, g: Geometry) -> int:
        """Declared bytes of the ring for ``g`` (linear in the bank count)."""
        if g.bank_bytes not in self.per_bank:
            layout = ring_layout(tile_stream(self.shard, g.bank_bytes, 2,
                                             piece_cols(self.shard, self.target)))
            self.per_bank[g.bank_bytes] = layout.nbytes // 2
        return g.num_banks * self.per_bank[g.bank_bytes]

    def fits(self, g: Geometry) -> bool:
        try:
            ring = self.ring_bytes(g)
        except PlanningError as err:
            if err.path != "plan.ring":
                raise
            return False        # a tile (a quantized weight's whole-K block) outgrows the banks
        return self.fixed_vmem(g) + ring <= self.target.vmem_budget

    def evaluate(self, g: Geometry):
        """(step ms, vmem bytes) or None when infeasible (``memory(g)``: its plan)."""
        if g in self.seen:
            return self.seen[g]
        if not self.fits(g):
            self.seen[g] = None
            return None
        try:
            memory = self.plan(g)
        except PlanningError as err:
            if err.path not in ("plan.vmem", "plan.ring"):
                raise                      # HBM or SMEM: no geometry can fix it
            self.seen[g] = None
            return None
        plan = schedule_collectives(self.shard, memory, self.specs)
        report = cost.estimate(self.model, self.shard, memory, plan, self.target, self.request,
                               timeline=False, memo=self.memo)
        self._keep(g, memory)
        # Ties on time go to fewer ring tiles per step, then to less VMEM: libtpu's
        # schedule charges a tile several times the assumed tile_overhead_s
        # (docs/floors.md), and llama-3.2-1b/1's 2 MiB banks, tied with 4 MiB ones
        # under the fitted HBM share, compiled 1.19 MiB over the plan's values.
        self.seen[g] = (report.step_ms, (memory.stream.total, memory.vmem_total))
        return self.seen[g]


def _better(a, b) -> bool:
    if b is None:
        return a is not None
    if a is None:
        return False
    return a[0] < b[0] * (1 - TOLERANCE) or (a[0] <= b[0] * (1 + TOLERANCE) and a[1] < b[1])


def _options(shard, model, overrides):
    o = overrides
    widths = [w for st in shard.stacks for (*_, w) in st.experts]
    has_moe = bool(widths)
    return dict(
        bank_bytes=(o.bank_bytes,) if o.bank_bytes else BANK_OPTIONS,
        num_banks=(o.num_banks,) if o.num_banks else BANK_COUNTS,
        expert_slots=(o.expert_slots,) if o.expert_slots else (SLOT_COUNTS if has_moe else (1,)),
        slot_chunks=(o.slot_chunks,) if o.slot_chunks else (
            tuple(chunk_options(min(widths))) if has_moe else (1,)),
        kv_tile=(o.kv_tile,) if o.kv_tile else tuple(kv_tile_options(model)),
    )


def _start(opts) -> Geometry:
    def near(values, want):
        return min(values, key=lambda v: (abs(v - want), v))
    return Geometry(near(opts["bank_bytes"], 2 * MiB), near(opts["num_banks"], 12),
                    near(opts["expert_slots"], 4), max(opts["slot_chunks"]),
                    near(opts["kv_tile"], 256))


def _ring_pass(search: _Search, opts, best_g, best):
    """Per bank size: the largest feasible bank count, then (the modeled time
    does not grow with the count) a bisection for the fewest banks within the
    tolerance of it."""
    for bank in opts["bank_bytes"]:
        counts = sorted(opts["num_banks"])
        feasible = [n for n in counts
                    if search.fits(dataclasses.replace(best_g, bank_bytes=bank, num_banks=n))]
        if not feasible:
            continue
        top = search.evaluate(dataclasses.replace(best_g, bank_bytes=bank, num_banks=feasible[-1]))
        if top is None:
            continue
        lo, hi = 0, len(feasible) - 1          # feasible[hi] is within tolerance
        while lo < hi:
            mid = (lo + hi) // 2
            r = search.evaluate(dataclasses.replace(best_g, bank_bytes=bank,
                                                    num_banks=feasible[mid]))
            if r is not None and r[0] <= top[0] * (1 + TOLERANCE):
                hi = mid
            else:
                lo = mid + 1
        g = dataclasses.replace(best_g, bank_bytes=bank, num_banks=feasible[hi])
        r = search.evaluate(g)
        if _better(r, best):
            best_g, best = g, r
    return best_g, best


def _field_pass(search: _Search, opts, names, best_g, best):
    import itertools

    for values in itertools.product(*(opts[n] for n in names)):
        g = dataclasses.replace(best_g, **dict(zip(names, values)))
        r = search.evaluate(g)
        if r is None:                      # shrink the ring until it fits
            for count in sorted(opts["num_banks"], reverse=True):
                if count < g.num_banks:
                    r = search.evaluate(dataclasses.replace(g, num_banks=count))
                    if r is not None:
                        g = dataclasses.replace(g, num_banks=count)
                        break
        if _better(r, best):
            best_g, best = g, r
    return best_g, best


def choose_geometry(model, shard, target, request, specs, *, rounds: int = 2,
                    cache: dict | None = None):
    """(geometry, memory plan) with the lowest modeled step time. ``cache`` (a
    dict kept by the caller) lets a later, longer search reuse evaluations."""
    search = _Search(model, shard, target, request, specs)
    if cache is not None:
        search.seen = cache.setdefault("seen", {})
        search.fixed = cache.setdefault("fixed", {})
        search.per_bank = cache.setdefault("per_bank", {})
        search.memo = cache.setdefault("memo", {})
    opts = _options(shard, model, request.overrides)
    best_g = _start(opts)
    best = search.evaluate(best_g)
    if best is None:
        best_g, best = _field_pass(search, opts, ("expert_slots", "slot_chunks"), best_g, best)
    if best is None:       # a tight model: start the passes from the smallest layout that plans
        best_g, best = next(((g, r) for g in _smallest(opts) if (r := search.evaluate(g))),
                            (best_g, best))
    for _ in range(rounds):
        best_g, best = _ring_pass(search, opts, best_g, best)
        best_g, best = _field_pass(search, opts, ("expert_slots", "slot_chunks"), best_g, best)
        best_g, best = _field_pass(search, opts, ("kv_tile",), best_g, best)
    if best is None:
        _raise_infeasible(model, shard, target, request, specs, opts)
    best_g, best = _constant_banks(search, opts, best_g, best)
    return best_g, search.memory(best_g)


def _constant_banks(search: _Search, opts, best_g, best):
    """The fewest banks of ``best_g``'s size, no fewer than it has, that make
    every tile's bank a constant (when the count is not held fixed), if they
    fit and are within the tolerance of the best time."""
    stream = search.memory(best_g).stream
    if len(opts["num_banks"]) == 1 or stream.static_banks(search.request.steps):
        return best_g, best
    for n in sorted(c for c in opts["num_banks"] if c > best_g.num_banks):
        if not dataclasses.replace(stream, num_banks=n).static_banks(search.request.steps):
            continue
        g = dataclasses.replace(best_g, num_banks=n)
        if not search.fits(g):
            break                       # more banks only need more VMEM
        r = search.evaluate(g)
        if r is not None and r[0] <= best[0] * (1 + TOLERANCE):
            return g, r
    return best_g, best


def _smallest(opts):
    """The least-VMEM geometry of each bank size, smallest banks first."""
    for bank in sorted(opts["bank_bytes"]):
        yield Geometry(bank, min(opts["num_banks"]), min(opts["expert_slots"]),
                       max(opts["slot_chunks"]), min(opts["kv_tile"]))


def _raise_infeasible(model, shard, target, request, specs, opts):
    """The VMEM shortfall of the smallest geometry whose banks hold every tile
    (a smaller bank's tile error would name the wrong cause)."""
    for smallest in _smallest(opts):
        bank = smallest.bank_bytes
        try:
            memory = plan_memory(model, shard, target, request, smallest, specs, check=False)
            break
        except PlanningError as err:
            if err.path != "plan.ring" or bank == max(opts["bank_bytes"]):
                raise
    ring = memory.ring.nbytes
    fixed = memory.vmem_total - ring
    big = sorted((b for b in memory.buffers if b.space.value == "vmem"
                  and not b.name.startswith("ring.")), key=lambda b: -b.nbytes)[:3]
    listing = ", ".join(f"{b.name} {mib(b.nbytes)}" for b in big)
    raise PlanningError(
        f"VMEM budget {mib(target.vmem_budget)} is too small for any ring: the smallest "
        f"({smallest.num_banks} banks x {smallest.bank_bytes // KiB} KiB, {mib(ring)} as laid out) plus the other buffers "
        f"({mib(fixed)}; largest: {listing}) needs {mib(memory.vmem_total)}",
        path="plan.ring",
        hint="lower vmem_reserve, batch or tokens per step, or use more TensorCores")
