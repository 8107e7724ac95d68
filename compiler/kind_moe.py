"""Sharding, buffer, cost and constant rules of mixture of experts (ir/kind_moe.py).

Sharding: experts over ``ep`` groups of cores and each expert's intermediate
width over the ``cores // ep`` cores of a group (the plan's ``moe_parallel``
choice); the router is replicated, shared experts split like a dense MLP.
A per-expert output norm inside the op reads each expert's whole output, so
such an op takes only ep = cores (compiler/shard.py ``moe_degrees``); the
card's per-expert norm is the other form: the op emits its picks apart
(``per_slot``: [rows, top_k x hidden], partial) and the expert_combine node
after it norms them once the sharding pass has all-reduced them, so any
(ep, tp) is legal (compiler/kind_expert_combine.py).
Buffers: the kernel library's expert slots (compiler/geometry/moe.py). Cost:
the chosen experts' tiles fetched into the slots and their matmuls, and per
slot the placing of each expert's output in its rows' slots (vector work).
"""

from __future__ import annotations

from megakernel.compiler.buffers import Kind
from megakernel.compiler.cost import COST, _bw, format_factor
from megakernel.compiler.geometry import moe
from megakernel.compiler.plan_buffers import BUFFERS, OpCtx, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_pass import SHARDING, LayerSharding, ShardRule, lane_split, on_axis
from megakernel.compiler.shard_records import REP, Split
from megakernel.errors import ShardingError
from megakernel.ir.graph import OpNode


def _moe(ls: LayerSharding, node: OpNode):
    op, ep = node.op, ls.ep
    for t in node.inputs:              # the experts' input, and the router's when apart
        ls.full(node, t)
    tp = ls.cores // ep
    if op.whole_experts and tp > 1:
        raise ShardingError(
            f"expert_output_norm normalises each expert's whole output, but ep={ep} on "
            f"{ls.cores} cores splits every expert's intermediate over {tp} cores",
            path="moe_parallel", hint=f"plan with moe_parallel='ep' (ep={ls.cores}: each "
            f"expert whole on one core; num_experts={op.num_experts} must be a multiple of "
            "the core count)")
    per = Split(0, ep, tp, op.num_experts // ep, op.num_experts // ep)
    width = lane_split(op.expert_intermediate, tp)
    role = f"experts over {ep} groups, intermediate over {tp} cores"
    h, e, i = op.hidden, op.num_experts, op.expert_intermediate
    ls.param(node, "router", (op.router_width, e), (), "ring", "replicated",
             "float32" if op.router_f32 else None)
    if op.correction_bias:
        ls.param(node, "router_bias", (e,), (), "vector", "replicated", "float32")
    if op.router_logit_bias:
        ls.param(node, "router_logit_bias", (e,), (), "vector", "replicated")
    ls.param(node, "experts_gate", (e, h, i), (per, on_axis(width, 2)), "experts", role)
    ls.param(node, "experts_up", (e, h, i), (per, on_axis(width, 2)), "experts", role)
    ls.param(node, "experts_down", (e, i, h), (per, on_axis(width, 1)), "experts", role)
    if op.expert_bias:
        # Small [experts, width] tables, whole per layer: the kernel picks an
        # expert's row by a masked sum, and adds the down bias on one core of
        # each intermediate split only.
        for part in ("gate", "up"):
            ls.param(node, f"experts_{part}_bias", (e, i), (per, on_axis(width, 1)), "vector",
                     role)
        ls.param(node, "experts_down_bias", (e, h), (per,), "vector",
                 f"experts over {ep} groups; added once per group")
    if op.num_shared_experts:
        s = lane_split(op.shared_width, ls.cores)
        ls.param(node, "shared_gate", (h, op.shared_width), (on_axis(s, 1),), "ring",
                 "columns of shared")
        ls.param(node, "shared_up", (h, op.shared_width), (on_axis(s, 1),), "ring",
                 "columns of shared")
        ls.param(node, "shared_down", (op.shared_width, h), (on_axis(s, 0),), "ring",
                 "rows of shared")
        if op.shared_expert_gate:   # scales a partial sum per token: still a partial sum
            ls.param(node, "shared_expert_gate", (h,), (), "vector", "replicated")
    if op.expert_output_norm:
        ls.param(node, "expert_output_norm", (h,), (), "vector", "replicated")
    ls.experts.append((node.name, ep, tp, op.num_experts // ep, width.padded))
    # per_slot: the picks' outputs are partial sums like the weighted sum; their
    # weights come from the replicated router, the same on every core
    return (ls.partial, REP) if op.per_slot else ls.partial


SHARDING.register("moe")(ShardRule(_moe))


@BUFFERS.register("moe")
def _moe_buffers(cx: OpCtx, node) -> OpLayout:
    op, s = node.op, cx.ss.stack
    _, _, _, local, width = next(e for e in cx.ss.experts if e[0] == node.name)
    es = next(e for e in cx.experts if e.stack == s and e.node == node.name)
    g = moe.MoEGeometry(
        rows=cx.rows, rows_padded=cx.rows_padded, hidden=op.hidden,
        num_experts=op.num_experts, experts_local=local, inter_local=width, top_k=op.top_k,
        scoring=op.scoring.value, correction_bias=op.correction_bias,
        renormalize=op.renormalize, routed_scaling=op.routed_scaling,
        activation=op.activation.value, slots=es.slots,
        dtype=es.dtype if es.format == "plain" else cx.model.dtype.value, chunk=es.chunk,
        router_logit_bias=op.router_logit_bias, expert_bias=op.expert_bias,
        swiglu_limit=op.swiglu_limit, swiglu_alpha=op.swiglu_alpha,
        n_group=op.n_group, topk_group=op.topk_group,
        fmt="" if es.format == "plain" else es.format,
        router_logit_scale=op.router_logit_scale, renormalize_eps=op.renormalize_eps,
        expert_output_norm=op.expert_output_norm,
        expert_output_norm_eps=op.expert_output_norm_eps,
        expert_output_norm_input_scaled=op.expert_output_norm_input_scaled,
        expert_output_norm_offset=op.expert_output_norm_offset, per_slot=op.per_slot)
    return OpLayout("moe", g, moe.buffers(g), Kind.EXPERT_SLOTS, moe.value_bytes(g, cx.ss, node))


@COST.register("moe")
def _moe_cost(cx, node, ph: dict) -> dict:
    c = cx.target.constants
    e = cx.memory.experts_of(cx.ss.stack, node.name)
    fetches = e.max_distinct * e.chunks
    bw = _bw(cx.target, cx.ring + e.slots)
    # per slot: each fetched expert placed once in its row's slot, a select and
    # an add of [rows, hidden] for each of the top_k slots (kernels/moe_slots.py)
    place = (e.max_distinct * node.op.top_k * cx.memory.rows_padded * e.hidden * 2
             / c.vpu_f32_ops_per_s if node.op.per_slot else 0.0)
    return dict(ph, other_bytes=ph["other_bytes"] + e.bytes_per_layer,
                floor_bytes=ph["floor_bytes"] + e.bytes_per_layer,
                flops=ph["flops"] + 2.0 * cx.rows_eff * fetches * 3 * e.hidden * e.chunk
                * format_factor(e.format),
                outstanding=cx.ring + e.slots,
                overhead_s=ph["overhead_s"] + fetches * c.tile_overhead_s + place,
                stall_s=c.dma_latency_s + e.chunk_dma_bytes / bw, kind="compute")


CONSTANTS.register("moe")(lambda op: {})
