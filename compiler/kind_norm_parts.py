"""Sharding, buffer, cost and constant rules of the two-part norm
(ir/kind_norm_parts.py).

``mean_square`` over a tensor split across cores gives each core its slice's
share of the mean: a partial sum, which the sharding pass all-reduces before
``rms_scale`` reads it (the "small all-reduce of per-row statistics": one
[rows, 1] value per token, zero-padded to the all-reduce's width). A slice
that several cores hold (replicated KV heads) would be counted once per copy,
so that split is refused by name. ``rms_scale`` acts per feature: x and its
weight keep x's split.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_rules import REP, SHARDING, LayerSharding, ShardRule, Split, on_axis
from megakernel.errors import ShardingError

KINDS = ("mean_square", "rms_scale")


def _mean_square(ls: LayerSharding, node):
    s = ls.full(node, node.inputs[0])
    if not isinstance(s, Split):
        return REP
    if s.div > 1 or s.parts != ls.cores:
        raise ShardingError(
            f"reads {node.inputs[0]!r} held in {s.parts} slices over {ls.cores} TensorCores "
            f"(each slice on {s.div}); a sum over cores would count copies more than once",
            path="inputs", hint="use a core count that splits these heads without "
            "replicating them (at most the number of KV heads)")
    return ls.partial


def _rms_scale_want(ls: LayerSharding, node, out_want):
    return (out_want, None)


def _rms_scale(ls: LayerSharding, node):
    x, ms = node.inputs
    ls.full(node, ms)
    s = ls.full(node, x)
    splits = (on_axis(s, 0),) if isinstance(s, Split) else ()
    ls.param(node, "weight", (node.op.dim,), splits, "vector",
             "columns of the split" if splits else "replicated")
    return s


SHARDING.register("mean_square")(ShardRule(_mean_square))
SHARDING.register("rms_scale")(ShardRule(_rms_scale, _rms_scale_want))
BUFFERS.register(*KINDS)(lambda cx, node: OpLayout())
COST.register(*KINDS)(vector_op_cost)
CONSTANTS.register(*KINDS)(lambda op: {})
