"""Emitter of mixture of experts: the router logits through the ring (of the
op's second input in a latent MoE), one call of its kernel library's
``moe_routed`` (backends/pallas_tpu/kernels/moe.py) with the plan's geometry,
expert operands and buffers, then the shared experts through the ring."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v
from megakernel.compiler.shard_formats import scale_name

LIBRARIES.register("moe")("moe_lib")


@EMITTERS.register("moe")
def _moe(c: StackCtx, n) -> list[str]:
    op, x, out = n.op, v(n.inputs[0]), n.outputs[0]
    bias = c.vec(f"{n.name}.router_bias") if op.correction_bias else "None"
    _, _, tp, _, _ = next(e for e in c.shard.experts if e[0] == n.name)
    lib = c.library("moe")
    experts = ", ".join(c.hbm(f"{n.name}.experts_{p}") for p in ("gate", "up", "down"))
    extra = ""
    if op.router_logit_bias:
        extra += f", logit_bias={c.vec(n.name + '.router_logit_bias')}"
    if op.expert_output_norm:
        extra += f", out_norm={c.vec(n.name + '.expert_output_norm')}"
    if c.shard.param(f"{n.name}.experts_gate").format != "plain":    # their scales' operands
        scales = ", ".join(c.hbm(scale_name(f"{n.name}.experts_{p}")) for p in ("gate", "up", "down"))
        extra += f", experts_scales=({scales})"
    if op.expert_bias:      # the down biases once per group sharing an expert
        tables = ", ".join(c.vec(f"{n.name}.experts_{p}_bias") for p in ("gate", "up", "down"))
        extra += f", biases=({tables})"
        if tp > 1:          # one core of each group adds them (every core when tp is 1)
            extra += f", bias_here=(me % {literal(tp)} == 0)"
    # The router logits stream through the ring like any linear's output, one
    # weight chunk at a time: a router assembled as one value ([7168, 384] bf16
    # for Kimi-K2, 5.25 MiB) was held whole in VMEM beside the plan.
    # A profile build runs the cost model's count of expert items (profile_kernel.py).
    e = next(e for e in c.plan.memory.experts if e.stack == c.s and e.node == n.name)
    extra += f", static_items={literal(e.max_distinct * e.chunks)} if PROFILE_EXPERT_ITEMS else None"
    # A latent MoE's router reads its second input, the full-width one; an
    # f32 router (Muse Spark) multiplies in full f32 precision, as the reference.
    router_x = v(n.inputs[1]) if op.router_dim else x
    outs = ", ".join(v(t) for t in n.outputs)      # per slot: the picks and their weights
    lines = [c.linear("router_logits", router_x, f"{n.name}.router", op.num_experts,
                      exact=op.router_f32),
             f"{outs} = {lib}.moe_routed({c.geometry(n.name)}, {x}, router_logits, {bias}, "
             f"{experts}, k, {first_expert(c, n.name)}, {c.buffers(n.name)}{extra})"]
    if op.num_shared_experts:
        width = c.shard.param(f"{n.name}.shared_up").shape[1]
        lines += [c.linear("gate", x, f"{n.name}.shared_gate", width),
                  c.linear("up", x, f"{n.name}.shared_up", width),
                  f"act = rt.activation({literal(op.activation.value)}, gate) * up",
                  c.linear("shared", "act", f"{n.name}.shared_down", c.shard.width(out))]
        if op.shared_expert_gate:    # sigmoid(x . w) per row, x in the weight's dtype
            lines.append(f"shared = shared * rt.row_gate({x}, "
                         f"{c.vec(n.name + '.shared_expert_gate')}, {literal(model_dtype(c))})")
        lines.append(f"{v(out)} = {v(out)} + shared")
    return lines


def first_expert(c: StackCtx, node: str) -> str:
    """The global id of this core's first local expert of MoE ``node``: its
    expert group's (the core's index over the ``tp`` cores sharing a group,
    times the experts per core), 0 without expert parallelism. The variable
    is set before the step (``frame.prologue_lines``)."""
    _, ep, _, _, _ = next(e for e in c.shard.experts if e[0] == node)
    return f"first_expert_s{c.s}_{node}" if ep > 1 else "0"


def model_dtype(c: StackCtx) -> str:
    return c.model.dtype.value
