"""Sharding, buffer, cost and constant rules of Gated DeltaNet (ir/kind_gdn.py).

Sharding: value heads are split evenly over the cores; key heads too, or, when
there are fewer key heads than cores, each key head is replicated on the cores
whose value heads read it (value head h reads key head h // group, so a core's
value heads always share one key head then). The q/k projections and conv
channels follow the key heads, v/z/b/a and their conv channels, A_log and
dt_bias follow the value heads; the output is split by value heads, so
out_proj is row-parallel and the dataflow pass puts the all-reduce after it.
The state is cut like the channels it holds: conv histories by channel, the
recurrent state by value head.
"""

from __future__ import annotations

from megakernel.compiler.buffers import Kind
from megakernel.compiler.cost import COST
from megakernel.compiler.layout import LANES, round_up
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS, UPDATES
from megakernel.compiler.stepping import STEPPING, Stepping
from megakernel.compiler.shard_rules import (SHARDING, LayerSharding, ShardRule, Split, StateShard,
                                             on_axis)
from megakernel.compiler.geometry import gdn
from megakernel.errors import ShardingError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 32) + 1) if n % d == 0]


def gdn_splits(op, cores: int) -> tuple[Split, Split, Split, Split, int]:
    """(key-width split, value-width split, gate split, value-head split, key
    replication). The b and a gates (one per value head) are zero-padded to 128
    lanes per core: a few lanes wide, their projections would otherwise stream
    through a ring of their own, R banks of tiles padded to 128 lanes in VMEM
    (10 MiB for Qwen3.5-27B on 8 cores); padded, they are ordinary tiles."""
    hk, hv = op.num_key_heads, op.num_value_heads
    if hv % cores:
        raise ShardingError(f"num_value_heads={hv} cannot be split evenly over {cores} "
                            "TensorCores", path="num_value_heads",
                            hint=f"use a number of devices dividing {hv}: {_divisors(hv)}")
    if hk % cores and cores % hk:
        raise ShardingError(f"num_key_heads={hk} neither splits over nor replicates evenly "
                            f"onto {cores} TensorCores", path="num_key_heads",
                            hint=f"use devices dividing {hk} or a multiple of it (and "
                            f"dividing num_value_heads={hv})")
    hv_l = hv // cores
    value = Split(0, cores, 1, hv_l * op.value_dim, hv_l * op.value_dim)
    heads = Split(0, cores, 1, hv_l, hv_l)
    gates = Split(0, cores, 1, hv_l, round_up(hv_l, LANES))
    if hk >= cores:
        w = hk // cores * op.key_dim
        return Split(0, cores, 1, w, w), value, gates, heads, 1
    rep = cores // hk
    return Split(0, hk, rep, op.key_dim, op.key_dim), value, gates, heads, rep


def _want(ls: LayerSharding, node, out_want):
    key, value, gates, _, _ = gdn_splits(node.op, ls.cores)
    return (key, key, value, value, gates, gates)


def _forward(ls: LayerSharding, node):
    op = node.op
    key, value, gates, heads, _ = gdn_splits(op, ls.cores)
    for t, want in zip(node.inputs, (key, key, value, value, gates, gates)):
        if ls.state[t] != want:
            raise ShardingError(f"input {t!r} is {ls.state[t]!r} across cores, expected "
                                "split by heads: it must come from a projection", path="inputs")
    for part, split in (("conv_q", key), ("conv_k", key), ("conv_v", value)):
        spec = op.params(ls.dtype)[part]
        ls.param(node, part, spec.shape, (on_axis(split, 1),), "vector",
                 "conv taps of this core's channels")
    for part in ("A_log", "dt_bias"):
        ls.param(node, part, (op.num_value_heads,), (heads,), "vector",
                 "this core's value heads", "float32")
    ls.param(node, "norm", (op.value_dim,), (), "vector", "replicated (one per head dim)")
    for name, spec in op.state(1, 1, ls.dtype).items():
        split = {"hist_q": on_axis(key, 2), "hist_k": on_axis(key, 2),
                 "hist_v": on_axis(value, 2), "recurrent": on_axis(heads, 1)}[name]
        ls.states.append(StateShard(node.name, name, spec.access, (split,)))
    return value


SHARDING.register("gated_deltanet")(ShardRule(
    _forward, _want, lambda ls, node: gdn_splits(node.op, ls.cores)[1]))


@BUFFERS.register("gated_deltanet")
def _buffers(cx, node) -> OpLayout:

    op = node.op
    cores = cx.request.devices
    rep = gdn_splits(op, cores)[-1]
    g = gdn.GDNGeometry(
        batch=cx.request.batch, tokens=cx.request.tokens, rows_padded=cx.rows_padded,
        key_heads=max(op.num_key_heads // cores, 1), value_heads=op.num_value_heads // cores,
        key_dim=op.key_dim, value_dim=op.value_dim, conv_kernel=op.conv_kernel,
        norm_eps=op.norm_eps, conv_dtype=cx.model.dtype.value, layers=cx.ss.reps(node.name),
        key_replication=rep, steps=cx.request.steps)
    return OpLayout("gdn", g, gdn.buffers(g), Kind.STATE, values=gdn.value_bytes(g),
                    stack_lifetime=True)


@UPDATES.register("gated_deltanet")
def _updates(op, state: str, spec, layout, request, cores: int):
    """Per layer and sequence: for a conv history, ``gdn.conv_rows`` rows (the
    history before the call, then row Kc-1 + i*T + t for step i's token t);
    for the recurrent state, per value head of this core, ``gdn.window`` rows
    (row i*T + t) of its key, delta-rule update and the call's log-decays
    summed up to the row."""

    w = gdn.window(request.tokens, request.steps)
    if state != "recurrent":
        c = gdn.conv_rows(op.conv_kernel, request.tokens, request.steps)
        return ((request.batch, c, layout[-1]), spec.dtype.value,
                f"per layer and sequence, {state} before the call, then the call's raw "
                f"{state[-1]} rows (row Kc-1+i*T+t: step i, token t); the history after "
                "the call is taken from it")
    rows = "per layer and sequence, row i*T+t (step i, token t) of the call: "
    return ((request.batch, op.num_value_heads // cores, w,
             gdn.update_width(op.key_dim, op.value_dim)), "float32",
            rows + "per value head, its key | delta-rule update | summed log-decay, "
                   "committed as a low-rank update of the recurrent state after the call")


@COST.register("gated_deltanet")
def _cost(cx, node, ph: dict) -> dict:
    """The kernel's state traffic (the state read ahead, read only; the call's
    update windows stored, and read back on a later step of a multi-step call:
    streaming bytes like the ring's) and the vector work (the library's count).
    The commit after the call is charged per call (cost.py)."""

    stream = next(s for s in cx.memory.states
                  if s.stack == cx.ss.stack and s.node == node.name)
    g = cx.memory.geometry_of(cx.ss.stack, node.name).geometry
    vpu = gdn.vector_ops(g) / cx.target.constants.vpu_f32_ops_per_s
    return dict(ph, other_bytes=ph["other_bytes"] + stream.bytes_per_layer,
                floor_bytes=ph["floor_bytes"] + stream.bytes_per_layer,
                outstanding=cx.ring + 2, overhead_s=ph["overhead_s"] + vpu)


CONSTANTS.register("gated_deltanet")(lambda op: {})


# How its kernel library (backends/pallas_tpu/kernels/gdn.py) runs in a multi-step call.
STEPPING.register("gated_deltanet")(Stepping(
    True, "reads the state before the call on every step and rebuilds the state after the "
          "previous step in VMEM from the call's update rows; the commit after the call "
          "takes only the rows of the steps each sequence ran, so a stopped sequence keeps "
          "its state"))
