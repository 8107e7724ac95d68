"""How the DMA engine serves outstanding descriptors: the one model the cost
model (``cost.py``) and the trace replay (``bench/replay.py``) both use.

Source: the DMA engine shares bandwidth among outstanding descriptors
(Inferact/tpu-megakernels, their TPU7x measurements; platform-facts.md). The
model is processor sharing: the DMAs moving at one time split the core's
sustained HBM bandwidth (``hbm_efficiency`` x peak) equally, and one DMA draws
at most ``hbm_share_per_dma`` of it, so a core streams at full speed only with
several DMAs in flight. A DMA starts moving ``dma_latency_s`` after it is
issued. Only DMAs in flight count: a ring bank whose tile has landed is
resident, not outstanding (``ring_in_flight``). Remote copies (collectives) do
not use the HBM path: one phase of them takes ``phase_seconds`` (the
collective schedule's model), all peers in parallel.
"""

from __future__ import annotations

from megakernel.compiler.schedule_collectives import phase_seconds  # noqa: F401 - one model


def bandwidth(target, constants, outstanding: float, dma_bytes: float | None = None) -> float:
    """Aggregate bytes/s of the core's HBM path with ``outstanding`` DMAs in
    flight. With ``dma_bytes`` (their size), each spends ``dma_latency_s`` not
    moving: by Little's law, ``outstanding`` DMAs kept in flight, each at most
    the per-DMA share, deliver outstanding x bytes / (latency + bytes / share),
    up to the sustained bandwidth (what ``HbmPath`` gives a ring in steady state)."""
    c = constants
    bw = target.hbm_bw * c.hbm_efficiency
    if dma_bytes is None:
        return bw * min(1.0, outstanding * c.hbm_share_per_dma)
    per = bw * c.hbm_share_per_dma
    return min(bw, outstanding * dma_bytes / (c.dma_latency_s + dma_bytes / per))


def ring_in_flight(num_banks: int) -> int:
    """Ring DMAs in flight while the weight stream is the bottleneck: every bank
    but the one the core is reading (a tile landed before its consumer is
    resident, but then the phase is compute-bound and the HBM rate does not
    set its time)."""
    return max(num_banks - 1, 1)


class HbmPath:
    """Processor-shared DMA transfers on one core's HBM path; times in us."""

    def __init__(self, target, constants):
        c = constants
        self.bw = target.hbm_bw * c.hbm_efficiency
        self.cap = self.bw * c.hbm_share_per_dma
        self.latency = c.dma_latency_s * 1e6
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
