"""Three floors under a plan's step time, per core: HBM, core and latency.

After ``floors(plan)``: a ``Floors`` record with

- the HBM floor: the bytes one core must read per step (``CostReport.floor_bytes_per_core``)
  at the nominal bandwidth (pltpu) and at the 3.2 TB/s Inferact measured sustained;
- the core floor: every weight matrix of the step (ring tiles, expert slices, the LM
  head) loaded into the MXU at the calibrated rate of its format and layout
  (``compiler/calibration.json``: weights per cycle, dequantisation included, at the
  calibrated clock). At decode (LHS rows <= ``mxu_push_rows``) loading weights, not
  flops, bounds the MXU; with more rows the flops bound is taken where larger;
- the latency floor: the call's launch over its steps, plus every collective phase's
  fixed latency (``phase_seconds`` of an empty payload) times its runs per step;

the binding floor (the largest, with the HBM floor at the sustained rate: what
a core can physically read), and efficiency against it (floor / modeled step).
Attention's KV reads and vector ops are left out of the core floor: it is a lower
bound. docs/floors.md explains each figure and its source.

``with_core_work(plan, busy_ms)``: the plan's cost with every phase's compute
scaled up so that the step's modeled compute is libtpu's busy core work for
the same kernel where that is larger (the profile's account of the core, which
the cost model's per-op constants can miss).
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler import calibration
from megakernel.compiler.schedule_collectives import phase_seconds
from megakernel.compiler.target import Constant

HBM_SUSTAINED = Constant(
    3.2e12, "B/s", "Inferact/tpu-megakernels README: sustained HBM read per TPU7x core "
    "(2.9 for a DMA-only loop, 3.05 for their dense ring; platform-facts.md, issue 19)")


@dataclass(frozen=True)
class Floors:
    hbm_ms: float              # bytes per core at nominal bandwidth
    hbm_sustained_ms: float    # the same bytes at HBM_SUSTAINED
    core_ms: float             # MXU weight loads (and dequantisation) per core
    latency_ms: float          # launch share + collective phase latencies
    modeled_ms: float          # the cost model's step
    weights_by_format: tuple[tuple[str, int], ...]   # ("bfloat16.kn", elements per step)
    hbm_bytes: int = 0         # what the HBM floor reads per core per step
    hbm_bw: float = 0.0        # the nominal bandwidth it is read at (B/s)

    @property
    def binding(self) -> str:
        return max((("hbm", self.hbm_sustained_ms), ("core", self.core_ms),
                    ("latency", self.latency_ms)), key=lambda kv: kv[1])[0]

    @property
    def floor_ms(self) -> float:
        return max(self.hbm_sustained_ms, self.core_ms, self.latency_ms)

    @property
    def efficiency(self) -> float:
        """Binding floor / modeled step."""
        return self.floor_ms / self.modeled_ms

    @property
    def hbm_efficiency(self) -> float:
        """The older yardstick, kept for comparison: nominal HBM floor / modeled step."""
        return self.hbm_ms / self.modeled_ms

    @property
    def sustained_efficiency(self) -> float:
        """Sustained HBM floor / modeled step (at most 1: the cost model streams
        at most the sustained rate, compiler/measured.py)."""
        return self.hbm_sustained_ms / self.modeled_ms

    def lines(self) -> list[str]:
        """The report's floors, one line each, and the efficiency against them."""
        fmts = ", ".join(f"{k} {n / 1e6:.1f} M" for k, n in self.weights_by_format)
        return [
            f"HBM floor: {duration(self.hbm_ms)} ({self.hbm_bytes:,} bytes read per core per "
            f"step at {self.hbm_bw / 1e12:.2f} TB/s nominal; {duration(self.hbm_sustained_ms)} "
            f"at {HBM_SUSTAINED.value / 1e12:.1f} TB/s sustained, Inferact)",
            f"core floor: {duration(self.core_ms)} (MXU weight loads at calibrated rates, "
            f"compiler/calibration.json; weights per core per step: {fmts or 'none'})",
            f"latency floor: {duration(self.latency_ms)} (launch share + collective phases)",
            f"binding floor: {self.binding} ({duration(self.floor_ms)}); modeled efficiency "
            f"(binding floor / modeled step) {self.efficiency:.1%}, against the HBM floor "
            f"{self.sustained_efficiency:.1%} sustained, {self.hbm_efficiency:.1%} nominal",
        ]


def duration(ms: float) -> str:
    """A time in ms from 0.1 ms up (to the us), in us to the hundredth below
    it: a tiny model's 1.23 us floor does not read "0.001 ms"."""
    return f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.2f} us"


def _weights(plan) -> dict[str, int]:
    """dtype (plain) or format (quantized) -> weight elements one core loads into
    the MXU per step. Every
    weight is stored [K, N] (the tied LM head as a transposed copy), so every
    push is at the [K, N] rate."""
    out: dict[str, int] = {}
    stream = plan.memory.stream

    def add(dtype, fmt, n):
        # Quantized codes go through their format's kernel path
        # (backends/pallas_tpu/kernels/dequant.py), calibrated per format with its
        # decode and scales: that is the rate they pay.
        key = dtype if fmt == "plain" else f"q.{fmt}"
        out[key] = out.get(key, 0) + n

    for st in stream.stacks:
        for j, t in enumerate(st.tiles):     # a run's tiles once per layer of the run
            add(t.dtype, t.format, t.elements * st.count * st.layers_of(j))
    for t in stream.head:
        add(t.dtype, t.format, t.elements)
    for e in plan.memory.experts:
        count = plan.shard.stacks[e.stack].reps(e.node)
        add(e.dtype, e.format, e.max_distinct * e.chunks * 3 * e.hidden * e.chunk * count)
    return out


def core_seconds(plan, cal=None) -> tuple[float, dict]:
    """(seconds, {format: elements}) of the step's MXU weight loads on one core."""
    cal = cal or calibration.load()
    clock, fpc = cal.rate("clock_hz"), cal.rate("flops_per_cycle")
    rows = plan.memory.rows_padded
    cycles, by_fmt = 0.0, {}
    for dtype, n in sorted(_weights(plan).items()):
        where = f"{plan.model.name}.weights[{dtype}]"
        load = n / cal.weights_per_cycle(dtype, False, where)
        cycles += max(load, 2.0 * rows * n / fpc)
        by_fmt[f"{dtype}.kn"] = by_fmt.get(f"{dtype}.kn", 0) + n
    return cycles / clock, by_fmt


def latency_seconds(plan) -> float:
    c, t = plan.cost, plan.target
    fixed = phase_seconds(0, t)          # a phase's latency with an empty payload
    per_step = sum(site.per_step * plan.collectives.spec(site.spec).phases
                   for site in plan.collectives.sites)
    return c.launch_ms / 1e3 / max(c.steps_per_call, 1) + per_step * fixed


def floors(plan) -> Floors:
    c = plan.cost
    core_s, by_fmt = core_seconds(plan)
    nbytes = c.floor_bytes_per_core
    return Floors(nbytes / plan.target.hbm_bw * 1e3, nbytes / HBM_SUSTAINED.value * 1e3,
                  core_s * 1e3, latency_seconds(plan) * 1e3, c.step_ms,
                  tuple(sorted(by_fmt.items())), nbytes, plan.target.hbm_bw)


def modeled_compute_parts(cost) -> tuple[float, float]:
    """(MXU ms, overhead ms): the cost model's compute side of one step split
    into MXU time (weight loads at the calibrated push rate) and its per-op and
    per-tile overheads, each over every phase times its runs. The overheads
    stand for all the core work that is not a weight push (streaming results,
    vector, cross-lane and scalar work), which libtpu's schedule splits by unit."""
    mxu = sum(p.mxu_s * p.per_step for p in cost.phases) * 1e3
    return mxu, sum(p.overhead_s * p.per_step for p in cost.phases) * 1e3


def modeled_compute_ms(cost) -> float:
    """The cost model's compute side of one step (MXU time + per-op and per-tile
    overheads of every phase, times its runs): what libtpu's core work checks."""
    return sum(modeled_compute_parts(cost))


def with_core_work(plan, busy_ms: float):
    """(scale, CostReport): ``plan``'s cost re-estimated with every phase's
    compute times ``scale`` = busy / modeled compute when libtpu's busy core
    work (its critical path without DMA waits, for the same plan's kernel:
    backends/pallas_tpu/aot/profile_kernel.py) exceeds the modeled compute,
    else 1 and the plan's own cost. Uniform, because the profile splits the
    core's work by unit, not by phase."""
    from megakernel.compiler.cost import estimate

    scale = max(1.0, busy_ms / modeled_compute_ms(plan.cost))
    if scale == 1.0:
        return 1.0, plan.cost
    return scale, estimate(plan.model, plan.shard, plan.memory, plan.collectives, plan.target,
                           plan.request, timeline=False, compute_scale=scale)
