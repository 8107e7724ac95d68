"""A step timeline replayed from what the kernel really did (trace mode).

Input: the program-order log of one core's DMAs from ``trace.trace_step``
(each DMA's start, and the wait that consumed it) and the target's rates.
Output: a *modeled* timeline and step time: the DMAs are simulated on the
core's HBM path with the cost model's constants, and the core runs the
kernel's own order of starts and waits, doing each consumed tile's matmul
after its wait. Nothing here comes from the plan: a kernel that fetched
less far ahead (the synchronised-ops ablation) shows it in its own replay.

The HBM path is processor-shared: the DMAs in flight split the core's
sustained bandwidth (``hbm_efficiency`` x peak), and one DMA gets at most
``hbm_share_per_dma`` of it, so a kernel needs several DMAs in flight to
stream at full speed. Each DMA starts moving ``dma_latency_s`` after it is
issued. Compute per consumed tile is the MXU time of a decode matmul
(``mxu_push_rows`` LHS rows at least, ``f32_matmul_slowdown`` for f32) plus
``tile_overhead_s``; per-layer vectors and embedding rows cost
``op_overhead_s``. Vector-unit ops between DMAs (norms, RoPE, softmax) are
not in the trace, so the replay is a lower bound on the kernel's time.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.cost import Event
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


class _HbmPath:
    """Processor-shared DMA transfers; times in us."""

    def __init__(self, bw: float, cap: float, latency_us: float):
        self.bw, self.cap, self.latency = bw, cap, latency_us
        self.now = 0.0
        self.pending: dict[int, tuple[float, float]] = {}   # id -> (ready at, bytes left)
        self.done_at: dict[int, float] = {}
        self.started: dict[int, float] = {}

    def start(self, dma: int, nbytes: int, t: float) -> None:
        self.run_until(t)
        self.pending[dma] = (t + self.latency, float(nbytes))
        self.started[dma] = t

    def _rate(self, moving: int) -> float:      # bytes/us per moving DMA
        return min(self.cap, self.bw / moving) / 1e6

    def run_until(self, t: float, until_done: int | None = None) -> None:
        """Advance to time t (or, with ``until_done``, until that DMA completes)."""
        while self.pending and (until_done in self.pending or self.now < t):
            moving = [d for d, (ready, _) in self.pending.items() if ready <= self.now]
            if not moving:
                nxt = min(ready for ready, _ in self.pending.values())
                if until_done is None and nxt >= t:
                    break
                self.now = nxt
                continue
            rate = self._rate(len(moving))
            finish = min(self.pending[d][1] for d in moving) / rate
            nxt_ready = min((r for r, _ in self.pending.values() if r > self.now),
                            default=float("inf"))
            step = min(finish, nxt_ready - self.now)
            if until_done is None:
                step = min(step, t - self.now)
            for d in moving:
                ready, left = self.pending[d]
                left -= rate * step
                if left <= 1e-6:
                    del self.pending[d]
                    self.done_at[d] = self.now + step
                else:
                    self.pending[d] = (ready, left)
            self.now += step
        self.now = max(self.now, t) if until_done is None else self.now


def replay(program, target, *, rows_padded: int, itemsize: int, f32: bool,
           constants: CostConstants | None = None) -> Replay:
    """Replay ``program``: (op, dma id, bytes, kind) in program order, op in
    {"start", "done"}, as ``trace.TraceResult.program(core)`` gives it."""
    c = constants or CostConstants.default()
    bw = target.hbm_bw * c.hbm_efficiency
    path = _HbmPath(bw, bw * c.hbm_share_per_dma, c.dma_latency_s * 1e6)
    flops = target.bf16_flops / (c.f32_matmul_slowdown if f32 else 1.0)
    lhs_rows = max(rows_padded, c.mxu_push_rows)
    t = c.kernel_launch_s * 1e6
    events, stall, moved, sizes = [], 0.0, 0, {}
    for op, dma, nbytes, kind in program:
        if kind in ("local", "collective"):
            continue                      # on-core copies; remote copies: not on HBM
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
        if kind in MATMUL_KINDS:
            work = 2.0 * lhs_rows * (nbytes / itemsize) / flops * 1e6 + c.tile_overhead_s * 1e6
        else:
            work = c.op_overhead_s * 1e6
        events.append(Event("compute", kind, t, t + work))
        t += work
    return Replay(t, tuple(events), stall, moved)
