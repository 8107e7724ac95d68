"""The planning half of the compiler, as a list of stages.

    request     request.make_request           check batch, tokens, context, overrides
    target      target.make_target             capacities from pltpu, topology, constants
    shard       shard.shard_model              split weights, heads, experts over the cores
    algorithms  schedule_collectives.collective_specs   one-shot or RS+AG; their buffers
    geometry    choose_geometry.choose_geometry         bank size/count, slots, KV tile
    memory      plan_memory.plan_memory        every buffer: space, shape, size, lifetime
    schedule    schedule_collectives.schedule_collectives   sites, parity, overlapped tiles
    cost        cost.estimate                  modeled step time, floor, efficiency
    steps       choose_steps.choose            (steps="auto") N steps per call: the
                                               stages above at N = 1, then at N

For MoE models the shard stage is run once per legal expert-parallel degree
(unless overridden) and the plan with the lowest modeled step time is kept.
Code generation (emit -> load -> check) follows in the backends.
"""

from __future__ import annotations

from megakernel.compiler import choose_steps
from megakernel.compiler.choose_geometry import choose_geometry
from megakernel.compiler.cost import estimate
from megakernel.compiler.plan import Plan
from megakernel.compiler.request import make_request
from megakernel.compiler.schedule_collectives import collective_specs, schedule_collectives
from megakernel.compiler.shard import expert_counts, moe_degrees, shard_model, whole_experts
from megakernel.compiler.shard_formats import check_target
from megakernel.compiler.target import Target, make_target
from megakernel.errors import PlanningError
from megakernel.ir import sizes
from megakernel.ir.graph import Model
from megakernel.registry import Registry

STAGES = ("request", "target", "shard", "algorithms", "geometry", "memory", "schedule", "cost",
          "steps")


# The format offered, per weight kind, to a model too big for its cores: the
# ones docs/formats.md shows fitting (kimi-k2's experts on 16 cores, qwen3-8b's
# dense weights).
SMALLER = {"experts": "mxfp4", "dense": "int4_g128"}


def _smaller_format(model: Model) -> str:
    """``KIND=FORMAT`` for the first kind of SMALLER that ``model`` stores plain."""
    from megakernel.ir.weight_kinds import model_kinds

    kinds = model_kinds(model.layers)
    return next((f"{k}={f}" for k, f in SMALLER.items()
                 if k in kinds and getattr(model.quantize, k) == "plain"), "")


def plan_model(model: Model, *, target: "Target | str | None" = None, devices: int = 1,
               batch: int = 1, tokens: int = 1, context: int | None = None,
               overrides=None, steps: "int | str" = 1) -> Plan:
    """Plan one kernel call of ``model`` on ``devices`` TensorCores of ``target``
    (a Target, a chip name, or None for TPU7x): ``steps`` greedy decode steps
    (``steps_per_call``; 1 = one step per call; "auto": the planner's choice,
    compiler/choose_steps.py)."""
    if steps == choose_steps.AUTO:
        return choose_steps.choose(
            lambda n: plan_model(model, target=target, devices=devices, batch=batch,
                                 tokens=tokens, context=context, overrides=overrides, steps=n),
            context=context)
    request = make_request(model, devices=devices, batch=batch, tokens=tokens,
                           context=context, overrides=overrides, steps=steps)
    target = _target(target, devices)
    # Weights and caches that cannot fit these cores even split evenly are
    # refused from the numbers, before any tile is enumerated.
    sizes.check_fits(sizes.of_model(model, formatted=True), cores=request.devices,
                     hbm_per_core=target.hbm_bytes, chip=target.chip, batch=request.batch,
                     path="plan.hbm", error=PlanningError, quantize=_smaller_format(model))
    options = _expert_parallel_options(model, request)
    # Several MoE splits: compare them with a one-round geometry search, then
    # refine the winner with the full search.
    caches = {ep: {} for ep in options}
    candidates, refused = [], []
    for ep in options:
        try:
            candidates.append(_plan_one(model, target, request, ep,
                                        rounds=1 if len(options) > 1 else 2, cache=caches[ep]))
        except PlanningError as err:
            # A split whose shards overflow HBM (e.g. expert widths padded to
            # 128 lanes under tensor parallelism) leaves the others to try.
            if err.path != "plan.hbm" or len(options) == 1:
                raise
            refused.append((ep, err))
    if not candidates:
        listing = "; ".join(f"ep={ep}: {err.message}" for ep, err in refused)
        raise PlanningError(f"no expert-parallel degree fits HBM: {listing}", path="plan.hbm",
                            hint=refused[0][1].hint)
    options = [ep for ep in options if ep not in {e for e, _ in refused}]
    best = min(candidates, key=lambda p: p.cost.step_ms)
    if len(options) > 1:
        ep = options[candidates.index(best)]
        refined = _plan_one(model, target, request, ep, rounds=2, cache=caches[ep])
        best = min((best, refined), key=lambda p: p.cost.step_ms)
    return _with_choices(best, candidates, model, refused)


def _plan_one(model: Model, target: Target, request, ep, *, rounds: int, cache: dict) -> Plan:
    """The stages after ``target`` for one expert-parallel degree."""
    shard = shard_model(model, request.devices, moe_parallel=ep, embed=request.overrides.embed)
    check_target(shard, target)
    specs = collective_specs(shard, request, target, model.hidden_size, model.dtype.value)
    geometry, memory = choose_geometry(model, shard, target, request, specs, rounds=rounds,
                                       cache=cache)
    collectives = schedule_collectives(shard, memory, specs)
    report = estimate(model, shard, memory, collectives, target, request)
    return Plan(model, request, target, shard, memory, collectives, report)


def _target(target, devices: int) -> Target:
    if target is None or isinstance(target, str):
        return make_target(target or "tpu7x", devices)
    return target if target.cores == devices else target.with_cores(devices)


def _expert_parallel_options(model: Model, request) -> list:
    forced = request.overrides.moe_parallel
    if forced is not None or not expert_counts(model):
        return [forced]
    return moe_degrees(model, request.devices)


# Op kind -> (plan, model) -> [(decision, why)]: the choices its rules made
# inside the stages, explained in the plan (MLA's form of each MLA node,
# compiler/kind_mla.py); kinds that choose nothing have none.
CHOICE_NOTES: Registry = Registry("choice notes", "compiler/kind_*.py", per_op_kind=False)


def _with_choices(best: Plan, candidates: list[Plan], model: Model,
                  refused: list = ()) -> Plan:
    import dataclasses

    choices = []
    if len(candidates) + len(refused) > 1:
        listing = ", ".join(f"ep={p.shard.ep}: {p.cost.step_ms:.3f} ms" for p in candidates)
        listing += "".join(f", ep={ep}: does not fit HBM ({err.message.split(' of HBM')[0]})"
                           for ep, err in refused)
        choices.append(("moe_parallel", f"ep={best.shard.ep} (modeled {listing})"))
    elif best.shard.cores > 1 and whole_experts(model):
        choices.append(("moe_parallel", f"ep={best.shard.ep} (expert_output_norm reads each "
                        "expert's whole output: every expert whole on one core)"))
    g = best.memory.geometry
    slots = f"{g.expert_slots} expert slots, " if best.memory.experts else ""
    choices.append(("geometry", f"{g.num_banks} ring banks for tiles of up to "
                    f"{g.bank_bytes // 1024} KiB (bank_bytes), {slots}"
                    f"kv_tile {g.kv_tile} (lowest modeled step time within the VMEM budget)"))
    for spec in best.collectives.specs:
        wire = f", {spec.wire} wire" if spec.kind == "all_reduce" else ""
        choices.append((spec.name, f"{spec.algorithm}{wire} ({spec.seconds * 1e6:.1f} us modeled)"))
    kinds = {n.op.kind for st in model.stacks for n in st.layer.nodes}
    for kind in sorted(kinds & CHOICE_NOTES.kinds()):
        choices += CHOICE_NOTES[kind](best, model)
    return dataclasses.replace(best, choices=tuple(choices))
