"""Which assumed constants each modeled step rests on, and the step targets.

``sensitivity(model, plan)``: the plan's modeled step re-estimated (cost model
only: the same plan, geometry and collective algorithms, no compile) with each
assumed constant of ``CONSTANTS`` halved and doubled; collective times are
re-derived from the changed constants. ``render`` prints one row per model:
the modeled step and, per constant, the step with it x0.5 / x2. Every number
here is modeled.

``TARGETS``: the modeled efficiency issue 17 asks for at batch 1, restated
against the sustained HBM floor (3.2 TB/s, what a core can read: issue 17 set
them against the nominal 3.7 TB/s, which no DMA reaches); ``render_targets``
states each against the cost model and, where a trace exists, the trace replay.
"""

from __future__ import annotations

import dataclasses

# The constants (compiler/target.COST_TABLE) whose value is assumed, or fitted to
# one component benchmark (compiler/measured.py), that the step time may hinge on.
CONSTANTS = ("tile_overhead_s", "op_overhead_s", "mxu_push_rows", "dma_latency_s",
             "hbm_share_per_dma", "collective_phase_s")
FACTORS = (0.5, 2.0)
TARGETS = {("qwen3-32b", 8): 0.88, ("qwen3-8b", 4): 0.90, ("llama-3.2-1b", 1): 0.92}


def step_ms(model, plan, constants) -> float:
    """The modeled step of ``plan`` under ``constants`` (no re-planning)."""
    from megakernel.compiler.cost import estimate
    from megakernel.compiler.schedule_collectives import phase_seconds

    target = dataclasses.replace(plan.target, constants=constants)
    specs = tuple(dataclasses.replace(s, seconds=s.phases * phase_seconds(s.bytes_per_peer,
                                                                          target))
                  for s in plan.collectives.specs)
    collectives = dataclasses.replace(plan.collectives, specs=specs)
    return estimate(model, plan.shard, plan.memory, collectives, target, plan.request,
                    timeline=False).step_ms


def sensitivity(model, plan) -> dict:
    """{constant: {"x0.5": step ms, "x2": step ms}}, all modeled."""
    base = plan.target.constants
    return {name: {f"x{f:g}": step_ms(model, plan, dataclasses.replace(
                base, **{name: getattr(base, name) * f})) for f in FACTORS}
            for name in CONSTANTS}


def render(records) -> list[str]:
    rows = [r for r in records if r.get("modeled_sensitivity")]
    if not rows:
        return []
    head = ["model/cores", "step ms"] + [f"{c} x0.5/x2" for c in CONSTANTS]
    table = [head]
    for r in rows:
        s = r["modeled_sensitivity"]
        table.append([f"{r['model']}/{r['cores']}", f"{r['modeled_step_ms']:.3f}"]
                     + [f"{s[c]['x0.5']:.3f}/{s[c]['x2']:.3f}" for c in CONSTANTS])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    out = ["Sensitivity (MODELED, cost model only, same plan): step ms with each assumed "
           "constant halved / doubled"]
    out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in table]
    return out


def render_targets(records) -> list[str]:
    out = ["Targets at batch 1 (MODELED efficiency = sustained HBM floor at 3.2 TB/s / step; "
           "replay where a trace exists):"]
    for (name, cores), want in TARGETS.items():
        r = next((x for x in records if x["model"] == name and x["cores"] == cores), None)
        if r is None or r.get("modeled_sustained_efficiency") is None:
            out.append(f"  {name}/{cores} >= {want:.0%}: not run")
            continue
        eff = r["modeled_sustained_efficiency"]
        line = f"  {name}/{cores} >= {want:.0%}: cost model {eff:.1%} " \
               f"({'met' if eff >= want else 'NOT met'})"
        if r.get("replay_step_ms"):
            reff = r["modeled_hbm_sustained_floor_ms"] / r["replay_step_ms"]
            line += f", replay {reff:.1%} ({'met' if reff >= want else 'NOT met'})"
        else:
            line += ", replay: no trace (full-size models do not run in the interpreter)"
        if r.get("modeled_sustained_efficiency_b8") is not None:
            line += f"; batch 8: {r['modeled_sustained_efficiency_b8']:.1%}"
        out.append(line)
    return out
