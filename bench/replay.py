"""A step timeline replayed from what the kernel really did (trace mode).

Input: the program-order log of one core's DMAs from ``trace.trace_step``
(each DMA's start, and the wait that consumed it) and the target's rates.
Output: a *modeled* timeline and step time: the DMAs are simulated on the
core's HBM path with the cost model's constants, and the core runs the
kernel's own order of starts and waits, doing each consumed tile's matmul
after its wait. The DMA order and waits come from the trace only: a kernel
that fetched less far ahead (the synchronised-ops ablation) shows it in its
own replay.

The DMAs are served by ``compiler/dma_service.py``, the model the cost model
uses too: the DMAs in flight share the core's sustained HBM bandwidth, one DMA
draws at most ``hbm_share_per_dma`` of it, each starts ``dma_latency_s`` after
issue. Remote copies (the collectives) are off the HBM path: each completes
``phase_seconds`` after it started (every peer sends in parallel, so this
core's receives land when its sends do), and the core stalls on it at its
wait. The compute is, with ``compute=plan_compute(plan)`` (what the bench
uses), the cost model's own per phase, charged on the ring tiles as they
land, so replay and cost model differ only in the DMAs' order and waits.
Without it, from the trace alone: per consumed tile the MXU time of a decode
matmul (``mxu_push_rows`` LHS rows at least, ``f32_matmul_slowdown`` for f32)
plus ``tile_overhead_s``; per-layer vectors and embedding rows
``op_overhead_s``; vector-unit ops between DMAs (norms, RoPE, softmax) are not
in the trace, so that replay is a lower bound on the kernel's time.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.cost_timeline import Event
from megakernel.compiler.dma_service import HbmPath, phase_seconds
from megakernel.compiler.target import CostConstants

MATMUL_KINDS = ("ring", "experts", "kv")


@dataclass(frozen=True)
class Replay:
    step_us: float
    events: tuple[Event, ...]      # lanes: dma, compute, stall
    stall_us: float                # core time spent waiting on a DMA
    bytes: int                     # HBM bytes the replayed DMAs moved

    @property
    def step_ms(self) -> float:
        return self.step_us / 1e3


@dataclass(frozen=True)
class PlanCompute:
    """The cost model's compute (MXU + overheads, seconds) placed on the ring's
    tiles: ``before`` runs after the embedding gather, ``after[k]`` after
    tile k of the step's stream arrives; ``tile_bytes[k]`` its DMA bytes."""

    before: float
    after: tuple[float, ...]
    tile_bytes: tuple[int, ...]


def plan_compute(plan) -> PlanCompute:
    """Each phase's compute of ``plan.cost`` (steady layers) spread over its own
    ring tiles; a phase with none (norms, RoPE, attention's arithmetic,
    collectives' op overhead) runs after the last tile before it."""
    stream, c = plan.memory.stream, plan.target.constants
    after = [0.0] * stream.total

    def work(p):
        return p.mxu_s + p.overhead_s + (c.op_overhead_s if p.kind == "collective" else 0.0)

    phases = plan.cost.phases
    before, last = 0.0, None

    def charge(seconds, tiles):
        nonlocal before, last
        if tiles:
            for k in tiles:
                after[k] += seconds / len(tiles)
            last = tiles[-1]
        elif last is None:
            before += seconds
        else:
            after[last] += seconds

    head = {p.name: p for p in phases if p.stack is None}
    for name in ("embed", "allreduce.embed"):
        if name in head:
            charge(work(head[name]), [])
    steady = {}                  # every layer of a stack from its steady phases
    for p in phases:
        if p.stack is not None:
            steady.setdefault(p.stack, []).append(p)
    for ss in stream.stacks:
        tiles = {n.node: n.count for n in ss.node_tiles}
        for rep in range(ss.count):
            # a repetition's phases consume its tiles in stream order (a
            # run's layer once per layer of the run)
            at = ss.offset + rep * ss.per_layer
            for p in steady[ss.stack]:
                n = tiles.get(_run_node(ss, p.name.split(".", 1)[1]), 0)
                charge(work(p), list(range(at, at + n)))
                at += n
    for name in ("final_norm", "lm_head", "logits", "epilogue"):
        if name in head:
            charge(work(head[name]), list(range(stream.head_offset, stream.total))
                   if name == "lm_head" else [])
    return PlanCompute(before, tuple(after), tuple(e.tile.nbytes for e in stream.expand()))


def _run_node(ss, name: str) -> str:
    """The body node whose tiles phase ``name`` streams: a phase of layer
    ``l{j}_`` of a run streams the run's one copy, ``l{first}_``."""
    head, sep, rest = name.partition("_")
    if not ss.body_runs or not sep or not head[1:].isdigit():
        return name
    j = int(head[1:])
    first = max(f for f, _ in ss.body_runs if f <= j)
    return f"l{first}_{rest}"


def replay(program, target, *, rows_padded: int, itemsize: int, f32: bool,
           constants: CostConstants | None = None, compute: PlanCompute | None = None) -> Replay:
    """Replay ``program``: (op, dma id, bytes, kind) in program order, op in
    {"start", "done"}, as ``trace.TraceResult.program(core)`` gives it. With
    ``compute`` (``plan_compute``), the core's work is the cost model's, placed
    on the ring tiles as they arrive (matched by bytes), so the replay and the
    cost model differ only in how the DMAs were issued and waited for."""
    import dataclasses

    c = constants or CostConstants.default()
    path = HbmPath(target, c)
    remote_target = dataclasses.replace(target, constants=c)
    remote: dict[int, tuple[float, float]] = {}    # id -> (started, lands) in us
    flops = target.bf16_flops / (c.f32_matmul_slowdown if f32 else 1.0)
    lhs_rows = max(rows_padded, c.mxu_push_rows)
    t = c.kernel_launch_s * 1e6
    events, stall, moved, sizes = [], 0.0, 0, {}
    tile = [0, 0, False]       # ring tile reached, its bytes arrived, `before` charged
    for op, dma, nbytes, kind in program:
        if kind == "local":
            continue                      # on-core copies
        if kind == "collective":
            t, stall = _remote(op, dma, nbytes, t, stall, remote, remote_target, events)
            continue
        if op == "start":
            path.start(dma, nbytes, t)
            sizes[dma] = (nbytes, kind)
            continue
        if dma not in sizes:              # started before the log began
            continue
        path.run_until(t, until_done=dma)
        end = path.done_at[dma]
        events.append(Event("dma", kind, path.started[dma], end))
        if end > t:
            events.append(Event("stall", f"wait {kind}", t, end))
            stall += end - t
            t = end
        nbytes, _ = sizes.pop(dma)
        moved += nbytes
        if compute is not None:
            work, tile = _planned_work(compute, kind, nbytes, tile)
        elif kind in MATMUL_KINDS:
            work = 2.0 * lhs_rows * (nbytes / itemsize) / flops * 1e6 + c.tile_overhead_s * 1e6
        else:
            work = c.op_overhead_s * 1e6
        events.append(Event("compute", kind, t, t + work))
        t += work
    return Replay(t, tuple(events), stall, moved)


def _remote(op, dma, nbytes, t, stall, remote, target, events):
    """A remote copy: started at ``t``, lands one collective phase later; its
    wait stalls the core until then. -> (t, stall)."""
    if op == "start":
        remote[dma] = (t, t + phase_seconds(nbytes, target) * 1e6)
        return t, stall
    if dma not in remote:
        return t, stall
    started, lands = remote.pop(dma)
    events.append(Event("collective", "remote copy", started, lands))
    if lands > t:
        events.append(Event("stall", "wait collective", t, lands))
        return lands, stall + lands - t
    return t, stall


def _planned_work(compute: PlanCompute, kind: str, nbytes: int, tile: list):
    """-> (us of the cost model's work this arrival enables, tile state)."""
    work = 0.0
    if kind == "embed" and not tile[2]:
        tile[2] = True
        work += compute.before
    if kind == "ring":
        tile[1] += nbytes
        while tile[0] < len(compute.after) and tile[1] >= compute.tile_bytes[tile[0]]:
            tile[1] -= compute.tile_bytes[tile[0]]
            work += compute.after[tile[0]]
            tile[0] += 1
    return work * 1e6, tile
