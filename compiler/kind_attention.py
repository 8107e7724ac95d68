"""Sharding, buffer, cost, constant and multi-step rules of attention and
rotary embedding (ir/kind_attention.py).

Sharding: query heads split evenly over the cores, KV heads split too or, when
there are fewer than cores, each replicated onto a group of cores; rope (and
a per-head norm) pass the attention op's wish for its inputs on to the
projections. Each core keeps its KV heads' K/V caches (axis 2 of [B, S, Hkv,
D]). Buffers: the kernel library's geometry and buffers
(compiler/geometry/attention.py). Cost: the KV tiles read per step and the
score and value matmuls over them. Rope reads its inverse frequencies as a
constant table.
"""

from __future__ import annotations

import numpy as np

from megakernel.compiler.buffers import Kind
from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.geometry import attention
from megakernel.compiler.plan_buffers import BUFFERS, OpCtx, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_pass import SHARDING, LayerSharding, ShardRule, _pass_wish
from megakernel.compiler.shard_records import Split, StateShard
from megakernel.compiler.stepping import STEPPING, Stepping
from megakernel.errors import ShardingError
from megakernel.ir.graph import OpNode


SHARDING.register("rope")(ShardRule(lambda ls, node: ls.full(node, node.inputs[0]),
                                    _pass_wish))


def head_splits(op, cores: int) -> tuple[Split, Split, int]:
    """(q split, kv split, kv replication) of an attention op over ``cores``."""
    if op.num_q_heads % cores:
        raise ShardingError(f"num_q_heads={op.num_q_heads} cannot be split evenly over "
                            f"{cores} TensorCores", path="num_q_heads")
    if op.num_kv_heads % cores and cores % op.num_kv_heads:
        raise ShardingError(f"num_kv_heads={op.num_kv_heads} neither splits over nor "
                            f"replicates evenly onto {cores} TensorCores", path="num_kv_heads")
    d = op.head_dim
    q = Split(0, cores, 1, op.num_q_heads // cores * d, op.num_q_heads // cores * d)
    if op.num_kv_heads >= cores:
        return q, Split(0, cores, 1, op.num_kv_heads // cores * d,
                        op.num_kv_heads // cores * d), 1
    rep = cores // op.num_kv_heads
    return q, Split(0, op.num_kv_heads, rep, d, d), rep


def _attention_want(ls: LayerSharding, node: OpNode, out_want):
    q, kv, _ = head_splits(node.op, ls.cores)
    return (q, kv, kv)


def _attention(ls: LayerSharding, node: OpNode):
    op = node.op
    q, kv, rep = head_splits(op, ls.cores)
    for t, want in zip(node.inputs, (q, kv, kv)):
        if ls.state[t] != want:
            raise ShardingError(f"input {t!r} is {ls.state[t]!r} across cores, expected "
                                "split by heads: it must come from a projection through "
                                "per-head ops only", path="inputs")
    kv_local = max(op.num_kv_heads // ls.cores, 1)
    ls.heads.append((node.name, op.num_q_heads // ls.cores, kv_local, rep))
    if op.sinks:                                  # one logit per query head: split like q
        per = op.num_q_heads // ls.cores
        ls.param(node, "sinks", (op.num_q_heads,), (Split(0, ls.cores, 1, per, per),),
                 "vector", "query heads")
    # K/V [B, S, Hkv, D]: the core's kv heads (axis 2), merged into lanes.
    heads = Split(2, kv.parts, kv.div, kv_local, kv_local)
    for name, spec in op.state(1, 1, ls.dtype).items():
        ls.states.append(StateShard(node.name, name, spec.access, (heads,), merge=2))
    return q


SHARDING.register("attention")(ShardRule(_attention, _attention_want,
                                         lambda ls, node: head_splits(node.op, ls.cores)[0]))


BUFFERS.register("rope")(lambda cx, node: OpLayout())


@BUFFERS.register("attention")
def _attention_buffers(cx: OpCtx, node) -> OpLayout:
    op, s = node.op, cx.ss.stack
    _, q_l, kv_l, _ = next(h for h in cx.ss.heads if h[0] == node.name)
    k = next(x for x in cx.kv if x.stack == s and x.node == node.name)
    g = attention.AttentionGeometry(
        batch=cx.request.batch, tokens=cx.request.tokens, rows_padded=cx.rows_padded,
        q_heads=q_l, kv_heads=kv_l, head_dim=op.head_dim, kv_tile=k.kv_tile,
        max_seq_len=cx.model.max_seq_len, scale=op.softmax_scale, window=op.sliding_window,
        cache_dtype=k.dtype, softcap=op.logit_softcap, sinks=op.sinks, steps=cx.request.steps)
    # the next repetition's first window and cache tile are fetched right
    # after this one's attend, and the windows' stores drain after the loop
    # (kernels/attention.py prefetch, drain): its buffers span the stack
    return OpLayout("attention", g, attention.buffers(g), Kind.KV_TILES,
                    attention.value_bytes(g), stack_lifetime=True)


COST.register("rope")(vector_op_cost)


@COST.register("attention")
def _attention_cost(cx, node, ph: dict) -> dict:
    c, request = cx.target.constants, cx.request
    kv = cx.memory.kv_of(cx.ss.stack, node.name)
    _, q_l, kv_l, _ = next(h for h in cx.ss.heads if h[0] == node.name)
    group = max(request.tokens * q_l // kv_l, 1)
    n_tiles = request.batch * kv.tiles_per_seq
    other = ph["other_bytes"]
    flops = (4.0 * kv_l * n_tiles * max(group, c.mxu_push_rows) * kv.kv_tile
             * node.op.head_dim)
    overhead = 2 * n_tiles * c.tile_overhead_s + c.op_overhead_s
    return dict(ph, other_bytes=other + kv.bytes_per_layer,
                floor_bytes=ph["ring_bytes"] + other + kv.valid_bytes_per_layer,
                flops=flops, outstanding=cx.ring + 2, overhead_s=overhead,
                stall_s=cx.sequence_stall(flops / cx.rate + overhead))


CONSTANTS.register("attention")(lambda op: {})
CONSTANTS.register("rope")(lambda op: {"inv_freq": op.inv_freq().astype(np.float32)[None, :]})


# How its kernel library (backends/pallas_tpu/kernels/attention.py) runs in a multi-step call.
STEPPING.register("attention")(Stepping(
    True, "writes each running sequence's K/V row at the step's position; a stopped "
          "sequence's cache is not written"))
