"""Sharding, buffer, cost and constant rules of the elementwise kinds.

A linear map of one tensor (``scale``, ``channel_scale``) keeps a partial sum
partial; a nonlinear one (``activation``, ``softcap``, ``mul``) needs the full
value, so a partial input is all-reduced first. All of them act per feature,
so a tensor split over cores stays split the same way, and a wish for a split
output passes through to the input.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_rules import SHARDING, LayerSharding, ShardRule, Split, on_axis
from megakernel.errors import ShardingError

KINDS = ("mul", "activation", "scale", "softcap", "channel_scale")


def _wish_through(ls: LayerSharding, node, out_want):
    return (out_want,) * len(node.inputs)


def _mul_want(ls: LayerSharding, node, out_want):
    """Both factors split alike: as the output is wished, else as a factor's
    producer announces its output (a gate on the attention output wishes the
    gate projection split by heads, as the attention splits its output)."""
    if out_want is None:
        out_want = next((w for w in map(ls.announced, node.inputs) if w is not None), None)
    return (out_want,) * len(node.inputs)


def both_whole(ls: LayerSharding, node):
    """Every input read whole (a partial sum all-reduced first), all held
    alike: the rule of a nonlinear map, and of the residual gate
    (compiler/kind_residual_gate.py)."""
    states = [ls.full(node, t) for t in node.inputs]
    if any(s != states[0] for s in states):
        raise ShardingError(f"combines tensors held differently across cores: {states}",
                            path="inputs")
    return states[0]


def _linear_map(ls: LayerSharding, node):
    return ls.state[node.inputs[0]]


def _channel_scale(ls: LayerSharding, node):
    s = ls.state[node.inputs[0]]
    splits = (on_axis(s, 0),) if isinstance(s, Split) else ()
    ls.param(node, "weight", (node.op.dim,), splits, "vector",
             "per-feature scale" + (", columns of the split" if splits else ""))
    return s


for kind in ("activation", "softcap"):
    SHARDING.register(kind)(ShardRule(both_whole, _wish_through))
SHARDING.register("mul")(ShardRule(both_whole, _mul_want))
SHARDING.register("scale")(ShardRule(_linear_map, _wish_through))
SHARDING.register("channel_scale")(ShardRule(_channel_scale, _wish_through))
BUFFERS.register(*KINDS)(lambda cx, node: OpLayout())
COST.register(*KINDS)(vector_op_cost)
CONSTANTS.register(*KINDS)(lambda op: {})
