"""The modeled step timeline, layer by layer, and the synchronised-ops ablation.

Everything here works on the cost model's output (``plan.cost``), so every
number it gives is modeled, not measured.

``CostReport.timeline`` details the prologue, the first layer of each stack
and the head, and stands for the other layers of a stack with one span.
``expand`` replaces each span with one detailed layer per layer, placed from
the layers the cost model walked one by one (``CostReport.walked``) and then
its steady-state phase costs (``CostReport.phases``), as the span was summed,
so the expanded timeline ends where the modeled step ends.

``synchronised_us`` is the ablation: the same events with every op
synchronised, i.e. no DMA runs ahead of its op across an op or layer boundary.
Each phase (the events sharing a label, in order) then takes

    strict:   stall + DMA + compute      (each DMA waited for before its
                                          consumer's compute starts)
    overlap:  stall + max(DMA, compute)  (tiles of one op still pipelined
                                          with that op's compute)

and a collective takes its own duration. The DMA duration is the full HBM
time of the phase (prefetched tiles included: nothing is fetched ahead), at
the bandwidth the cost model gave it. That bandwidth assumes the ring's many
DMAs in flight, which a synchronised kernel would not have, so the ablation is
a lower bound on its time and the megakernel's advantage an underestimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.cost_timeline import DmaLane, Event, place_events


@dataclass(frozen=True)
class Expanded:
    events: tuple[Event, ...]
    layer_ends_us: tuple[float, ...]     # end of each layer in step order (all stacks)
    end_us: float


def _place(costs, t: float, out: list, lane=None) -> float:
    """Append the events of ``costs`` starting at ``t`` us (the cost model's own placement)."""
    return place_events(costs, t, out, lane)


def _is_span(e: Event) -> bool:
    return e.lane == "compute" and e.label.startswith("layers ") and "steady " in e.label


def expand(model, report) -> Expanded:
    """The modeled timeline of ``report`` with every layer of every stack in detail."""
    steady = {}
    for p in report.phases:
        if p.stack is not None:
            steady.setdefault(p.stack, []).append(p)
    stacks = [(i, st.count) for i, st in enumerate(model.stacks)]
    out, ends = [], []
    shift = 0.0                 # how far later events move (0 when spans add up exactly)
    stack_iter = iter(stacks)
    current = None
    for e in report.timeline:
        if _is_span(e):
            while True:         # the span belongs to the next stack with count > 1
                current = next(stack_iter)
                if current[1] > 1:
                    break
            s, count = current
            ends.append(e.start_us + shift)        # end of that stack's first layer
            t = e.start_us + shift
            lane = DmaLane(max((x.end_us for x in out if x.lane == "dma"), default=t))
            later = list(report.walked[s]) if report.walked else []
            for k in range(count - 1):
                t = _place(later[k] if k < len(later) else steady[s], t, out, lane)
                ends.append(t)
            shift = t - e.end_us
            continue
        out.append(Event(e.lane, e.label, e.start_us + shift, e.end_us + shift))
    # The step ends with its last op; a DMA bar may run a little past it (cost_timeline.py).
    end = max((e.end_us for e in out if e.lane != "dma"), default=0.0)
    return Expanded(tuple(out), tuple(ends), end)


def _phases(events):
    """Group consecutive events that share a label (one phase occurrence)."""
    group = []
    for e in events:
        if group and e.label != group[-1].label:
            yield group
            group = []
        group.append(e)
    if group:
        yield group


def synchronised_us(events) -> dict[str, float]:
    """Step time in us of ``events`` (an expanded timeline) with every op
    synchronised: {"strict": DMA then compute, "overlap": within-op overlap only}."""
    strict = overlap = 0.0
    for group in _phases(events):
        d = {lane: 0.0 for lane in ("stall", "dma", "compute", "collective")}
        for e in group:
            d[e.lane] += e.end_us - e.start_us
        strict += d["stall"] + d["dma"] + d["compute"] + d["collective"]
        overlap += d["stall"] + max(d["dma"], d["compute"]) + d["collective"]
    return {"strict": strict, "overlap": overlap}


def plot(expanded: Expanded, path, *, title: str, layers: int = 3,
         xlabel: str = "time in step, us (MODELED by the cost model, not a measurement); "
                       "dotted lines: layer ends") -> None:
    """Write a PNG of the first ``layers`` layers (after the prologue) of the
    modeled timeline: DMA, compute, collective and stall lanes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stop = expanded.layer_ends_us[min(layers, len(expanded.layer_ends_us)) - 1] \
        if expanded.layer_ends_us else expanded.end_us
    lanes = ["collective", "compute", "dma", "stall"]
    names = {"dma": "DMA (HBM->VMEM)", "compute": "compute (MXU/VPU)",
             "collective": "collective (remote DMA)", "stall": "wait"}
    colors = {"dma": "tab:blue", "compute": "tab:green", "collective": "tab:red",
              "stall": "tab:gray"}
    fig, ax = plt.subplots(figsize=(14, 3.6))
    for y, lane in enumerate(lanes):
        spans = [(e.start_us, e.end_us - e.start_us) for e in expanded.events
                 if e.lane == lane and e.start_us < stop and e.end_us > e.start_us]
        ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=colors[lane],
                       edgecolors="black", linewidth=0.3)
    for x in expanded.layer_ends_us[:layers]:
        ax.axvline(x, color="black", linestyle=":", linewidth=0.8)
    ax.set_yticks(range(len(lanes)), [names[lane] for lane in lanes])
    ax.set_xlim(0, stop)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
