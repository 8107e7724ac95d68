"""The modeled timeline of a plan's step: events per lane (dma, compute,
collective, stall), for the report and the bench chart. Of a multi-step call
it shows the call's launch and its first step.

DMA events show bytes when they stream: the ring issues tiles in consumption
order, so a phase's prefetched bytes (the ring credit it used) stream as soon
as the DMA lane is free after the bytes before them, under the waits and
compute-bound phases that made the credit, and its other bytes from the
phase's start, after them. The lane is drawn as one FIFO of the phases' HBM
times; the cost model's credit is not exactly FIFO (a phase's other bytes, KV
tiles and vectors, share the path with the ring), so where FIFO order would
end a bar after its phase (0.4 us at the end of qwen3-32b/8's step of 2389
us), the bar is moved earlier to end with its phase, as the model has it."""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.ir.graph import Model


@dataclass(frozen=True)
class Event:
    """One bar of the modeled timeline (``CostReport.timeline``)."""

    lane: str                  # dma | compute | collective | stall
    label: str
    start_us: float
    end_us: float


@dataclass
class DmaLane:
    """When the DMA lane is next free (us), carried from phase to phase."""

    free: float = 0.0


def place_events(costs, t: float, events: list, lane: DmaLane | None = None) -> float:
    """Append the events of ``costs`` (PhaseCost, in order) starting at ``t`` us;
    returns the time after the last."""
    lane = lane if lane is not None else DmaLane(t)
    for p in costs:
        dur = p.time_s * 1e6
        if p.kind == "collective":
            events.append(Event("collective", p.name, t, t + dur))
        else:
            if p.stall_s:
                events.append(Event("stall", p.name, t, t + p.stall_s * 1e6))
            start = t + p.stall_s * 1e6
            ahead = min(p.prefetched_s, p.hbm_s) * 1e6
            own = p.hbm_s * 1e6 - ahead
            # Streamed ahead right after the bytes before them, the rest after
            # them from the phase's start (the lane is one FIFO), but never past
            # the phase's end: the cost model's credit is not exactly FIFO (KV
            # tiles and vectors share the path), so where FIFO order would run
            # over, the phase's bars move earlier to end with it, as the model has it.
            first = lane.free
            second = max(start, first + ahead)
            last = second + own if own > 0 else first + ahead
            late = max(0.0, last - (t + dur))
            first, second = first - late, second - late
            if ahead > 0:
                events.append(Event("dma", p.name, first, first + ahead))
                lane.free = first + ahead
            if own > 0:
                events.append(Event("dma", p.name, second, second + own))
                lane.free = second + own
            events.append(Event("compute", p.name, start, start + (p.mxu_s + p.overhead_s) * 1e6))
        t += dur
    return t


def timeline(pre, first_layers, walked, steady, tail, model: Model) -> tuple[Event, ...]:
    """Events of the prologue, the first layer of each stack in detail, one
    span for the rest of each stack (its walked layers, then steady ones), and
    the head."""
    events, t, lane = [], 0.0, DmaLane()

    def place(costs):
        nonlocal t
        t = place_events(costs, t, events, lane)

    place(pre)
    for st, first, later in zip(model.stacks, first_layers, walked):
        place(first)
        if st.count > 1:
            mine = [p for p in steady if p.stack == first[0].stack]
            span = (sum(p.time_s for layer in later for p in layer)
                    + (st.count - 1 - len(later)) * sum(p.time_s for p in mine)) * 1e6
            first = st.start + st.period
            what = "layers" if st.period == 1 else f"bodies of {st.period} layers"
            events.append(Event("compute", f"layers {first}..{first + (st.count - 1) * st.period - 1} "
                                f"(x{st.count - 1} steady {what})", t, t + span))
            t += span
            lane.free = max(lane.free, t)
    place(tail)
    return tuple(events)
