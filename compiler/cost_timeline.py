"""The modeled timeline of a plan's step: events per lane (dma, compute,
collective, stall), for the report and the bench chart. Of a multi-step call
it shows the call's launch and its first step."""

from __future__ import annotations

from megakernel.compiler.cost import Event
from megakernel.ir.graph import Model


def place_events(costs, t: float, events: list) -> float:
    """Append the events of ``costs`` (PhaseCost, in order) starting at ``t`` us;
    returns the time after the last. DMAs of prefetched tiles start early."""
    for p in costs:
        dur = p.time_s * 1e6
        if p.kind == "collective":
            events.append(Event("collective", p.name, t, t + dur))
        else:
            if p.stall_s:
                events.append(Event("stall", p.name, t, t + p.stall_s * 1e6))
            start = t + p.stall_s * 1e6
            if p.hbm_bytes:               # prefetched tiles were fetched earlier
                early = start - p.prefetched_s * 1e6
                events.append(Event("dma", p.name, max(early, 0.0), early + p.hbm_s * 1e6))
            events.append(Event("compute", p.name, start, start + (p.mxu_s + p.overhead_s) * 1e6))
        t += dur
    return t


def timeline(pre, first_layers, steady, tail, model: Model) -> tuple[Event, ...]:
    """Events of the prologue, the first layer of each stack in detail, one
    span for the rest of each stack, and the head."""
    events, t = [], 0.0

    def place(costs):
        nonlocal t
        t = place_events(costs, t, events)

    place(pre)
    for st, first in zip(model.stacks, first_layers):
        place(first)
        if st.count > 1:
            mine = [p for p in steady if p.stack == first[0].stack]
            span = (st.count - 1) * sum(p.time_s for p in mine) * 1e6
            first = st.start + st.period
            what = "layers" if st.period == 1 else f"bodies of {st.period} layers"
            events.append(Event("compute", f"layers {first}..{first + (st.count - 1) * st.period - 1} "
                                f"(x{st.count - 1} steady {what})", t, t + span))
            t += span
    place(tail)
    return tuple(events)
