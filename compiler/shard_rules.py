"""Per-kind sharding rules: propagate a split state through a layer's dataflow.

After ``layer_rules``: each tensor of the layer is replicated ("rep"), split
along its feature axis (a ``Split``), or a partial sum ("partial"); each
weight has its splits; wherever an op needs the full value of a partial sum
(a norm, a residual add next to a replicated tensor, a projection, a
nonlinearity) a ``Reduction`` (an all-reduce site) sits between that tensor's
producer and its first such consumer, and the tensor is replicated after it.

Two passes, each a rule per op kind from ``SHARDING``:
  * backward, ``want``: the split each op would like its inputs to have. The
    attention op wants its q/k/v split by heads; per-head ops (rope, a
    per-head norm) pass that wish on; a projection adopts it as its column
    split. So any graph of the IR's kinds is sharded by the same few rules,
    never by op names.
  * forward, ``forward``: the state of each op's output from its inputs'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.layout import LANES, dtype_name, itemsize, padded_bytes, round_up
from megakernel.errors import ShardingError, error_context
from megakernel.ir.graph import Layer, OpNode
from megakernel.ir.types import DType
from megakernel.registry import Registry

REP, PARTIAL = "rep", "partial"


@dataclass(frozen=True)
class Split:
    """``axis`` cut into ``parts`` slices of ``stride`` entries (the last may be
    short), zero-padded to ``padded``; core c holds slice (c // div) % parts, so
    ``div`` > 1 means neighbouring cores hold the same slice (replication)."""

    axis: int
    parts: int
    div: int
    stride: int
    padded: int

    def part(self, core: int) -> int:
        return (core // self.div) % self.parts


@dataclass(frozen=True)
class ParamShard:
    """How one weight is cut. ``name`` is layer-local (``q_proj.weight``) for
    layer weights, global (``embed.weight``) otherwise. ``channel`` says how it
    reaches VMEM: ring (streamed tiles), vector (parity double buffer), experts
    (expert slots), gather (rows by token id), resident."""

    name: str
    full_shape: tuple[int, ...]
    dtype: str
    splits: tuple[Split, ...]
    channel: str
    role: str
    # megakernel/formats.py: "plain", or a quantized format (``dtype`` is then
    # its code dtype); ``scale_of`` names the weight a scale companion serves
    # (compiler/shard_formats.py).
    format: str = field(default="plain", metadata={OMIT_DEFAULT: True})
    scale_of: str = field(default="", metadata={OMIT_DEFAULT: True})

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-core shape, padding included."""
        out = list(self.full_shape)
        for s in self.splits:
            out[s.axis] = s.padded
        return tuple(out)

    @property
    def nbytes(self) -> int:
        return padded_bytes(self.shape, self.dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def item(self) -> int:
        return itemsize(self.dtype)

    def source(self, core: int) -> tuple[slice, ...]:
        """The region of the full weight core ``core`` holds (before padding)."""
        return _source(self.full_shape, self.splits, core)


@dataclass(frozen=True)
class StateShard:
    """How one op's state (``Op.state``) is cut: ``splits`` on its axes (the
    batch axis is never split); the kernel holds a core's slice with the axes
    from ``merge`` on flattened into one (e.g. K/V heads merged into lanes)."""

    node: str
    name: str
    access: str
    splits: tuple[Split, ...]
    merge: int | None = None

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        """A core's slice of a state of shape ``full`` (padding included)."""
        out = list(full)
        for s in self.splits:
            out[s.axis] = s.padded
        return tuple(out)

    def layout(self, full: tuple[int, ...]) -> tuple[int, ...]:
        """The slice as the kernel holds it."""
        shape = self.shape(full)
        if self.merge is None:
            return shape
        return (*shape[:self.merge], math.prod(shape[self.merge:]))

    def source(self, full: tuple[int, ...], core: int) -> tuple[slice, ...]:
        return _source(full, self.splits, core)


def _source(full, splits, core) -> tuple[slice, ...]:
    """The region of an array of shape ``full`` core ``core`` holds (before padding)."""
    region = [slice(0, d) for d in full]
    for s in splits:
        lo = min(s.part(core) * s.stride, full[s.axis])   # trailing parts may be all padding
        region[s.axis] = slice(lo, min(lo + s.stride, full[s.axis]))
    return tuple(region)


@dataclass(frozen=True)
class Reduction:
    """A partial sum ``tensor`` from ``producer`` that must be all-reduced
    before ``consumer`` (its first reader that needs the full value) reads it."""

    tensor: str
    producer: str
    consumer: str


State = "Split | str"


@dataclass
class LayerSharding:
    """The sharding pass over one layer: tensor states and what it has found."""

    layer: Layer
    dtype: DType
    cores: int
    ep: int
    state: dict = field(default_factory=dict)
    wants: dict = field(default_factory=dict)
    params: list = field(default_factory=list)
    reductions: list = field(default_factory=list)
    heads: list = field(default_factory=list)
    experts: list = field(default_factory=list)
    states: list = field(default_factory=list)

    def __post_init__(self):
        self.producer = {t: n for n in self.layer.nodes for t in n.outputs}
        self.state[self.layer.input] = REP

    @property
    def dt(self) -> str:
        return dtype_name(self.dtype)

    @property
    def partial(self) -> str:
        """What a sum over this core's slice is: partial, unless one core holds all."""
        return PARTIAL if self.cores > 1 else REP

    def param(self, node: OpNode, pname: str, shape, splits, channel: str, role: str,
              dtype: str | None = None) -> None:
        self.params.append(ParamShard(f"{node.name}.{pname}", tuple(shape), dtype or self.dt,
                                      tuple(splits), channel, role))

    def announced(self, tensor: str):
        """The split ``tensor``'s producer announces (``ShardRule.announce``), or None."""
        node = self.producer.get(tensor)
        rule = SHARDING(node.op.kind, node.name) if node is not None else None
        if rule is None or rule.announce is None:
            return None
        try:
            return rule.announce(self, node)
        except ShardingError:
            return None      # the producer's own rule reports it, naming itself

    def full(self, node: OpNode, tensor: str):
        """The state of ``tensor`` as ``node`` reads it when it needs the full
        value: a partial sum is all-reduced first (once; later readers see it
        replicated)."""
        if self.state[tensor] == PARTIAL:
            self.reductions.append(Reduction(tensor, self.producer[tensor].name, node.name))
            self.state[tensor] = REP
        return self.state[tensor]


def _no_wish(ls: LayerSharding, node: OpNode, out_want):
    return (None,) * len(node.inputs)


def _pass_wish(ls: LayerSharding, node: OpNode, out_want):
    return (out_want,)


@dataclass(frozen=True)
class ShardRule:
    """``forward(ls, node) -> state of node's outputs``; ``want(ls, node,
    wanted output split) -> wanted input splits`` (None: no preference);
    ``announce(ls, node) -> the split the node's output will have`` whatever
    its inputs, for kinds that decide it themselves (attention: by heads), so
    that an op combining that output with another tensor (a gate's ``mul``)
    can wish the other tensor split alike before the forward pass runs."""

    forward: Callable
    want: Callable = _no_wish
    announce: Callable | None = None


SHARDING: Registry[ShardRule] = Registry("sharding", "compiler/shard_rules.py")


def layer_rules(layer: Layer, dtype: DType, cores: int, ep: int):
    """(params, widths, reductions, heads, experts, states) of one layer; see StackShard."""
    ls = LayerSharding(layer, dtype, cores, ep)
    for node in reversed(layer.nodes):
        with error_context(node.name):
            rule = SHARDING(node.op.kind, node.name)
            wished = rule.want(ls, node, ls.wants.get(node.outputs[0]))
        for t, w in zip(node.inputs, wished):
            if w is not None:
                ls.wants.setdefault(t, w)
    for node in layer.nodes:
        with error_context(node.name):
            out = SHARDING(node.op.kind, node.name).forward(ls, node)
        for t in node.outputs:
            ls.state[t] = out
    widths = tuple((t.name, _width(t.shape[0], ls.state.get(t.name, REP)))
                   for t in layer.tensors)
    return (tuple(ls.params), widths, tuple(ls.reductions), tuple(ls.heads),
            tuple(ls.experts), tuple(ls.states))


def _width(full: int, s) -> int:
    return s.padded if isinstance(s, Split) else full


def lane_split(full: int, parts: int, div: int = 1) -> Split:
    """An even split of a width that may be zero-padded (MLP/expert widths)."""
    stride = -(-full // parts)
    return Split(0, parts, div, stride, round_up(stride, LANES))


def on_axis(split: Split, axis: int) -> Split:
    return replace(split, axis=axis)


# ---- rules -----------------------------------------------------------------

def _rmsnorm(ls: LayerSharding, node: OpNode):
    op, s = node.op, ls.full(node, node.inputs[0])
    if isinstance(s, Split) and s.stride % op.dim:
        raise ShardingError(f"dim={op.dim} norm reads a tensor split over cores in "
                            f"slices of {s.stride} features, which cut its groups",
                            path="dim", hint="use a core count that keeps whole groups")
    ls.param(node, "weight", (op.dim,), (), "vector", "replicated")
    return s


SHARDING.register("rmsnorm")(ShardRule(_rmsnorm, _pass_wish))
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


def _linear_want(ls: LayerSharding, node: OpNode, out_want):
    return (None,)


def _linear(ls: LayerSharding, node: OpNode):
    op = node.op
    shape = (op.in_features, op.out_features)
    s = ls.full(node, node.inputs[0])
    if isinstance(s, Split):                      # row-parallel: input features are split
        if s.parts != ls.cores:
            raise ShardingError("row-parallel projection reads a tensor replicated "
                                f"on {s.div} cores; its partial sums would repeat",
                                path="weight")
        ls.param(node, "weight", shape, (on_axis(s, 0),), "ring", "rows (input heads)")
        if op.bias:
            ls.param(node, "bias", (op.out_features,), (), "vector",
                     "replicated, added once after the all-reduce")
        return ls.partial
    want = ls.wants.get(node.outputs[0])
    if want is None:                              # nobody wants it split: keep it whole
        ls.param(node, "weight", shape, (), "ring", "replicated")
        if op.bias:
            ls.param(node, "bias", (op.out_features,), (), "vector", "replicated")
        return REP
    ls.param(node, "weight", shape, (on_axis(want, 1),), "ring", "columns (heads)")
    if op.bias:
        ls.param(node, "bias", (op.out_features,), (on_axis(want, 0),), "vector",
                 "columns (heads)")
    return want


SHARDING.register("linear")(ShardRule(_linear, _linear_want))


def _add(ls: LayerSharding, node: OpNode):
    states = [ls.state[t] for t in node.inputs]
    if all(s == PARTIAL for s in states):
        return PARTIAL                            # a sum of partial sums stays partial
    states = [ls.full(node, t) for t in node.inputs]
    if any(s != states[0] for s in states):
        raise ShardingError(f"adds tensors held differently across cores: {states}",
                            path="inputs")
    return states[0]


SHARDING.register("add")(ShardRule(_add))


def _mlp(ls: LayerSharding, node: OpNode):
    op = node.op
    ls.full(node, node.inputs[0])
    split = lane_split(op.intermediate, ls.cores)
    for pname, spec in op.params(ls.dtype).items():
        axis = 0 if pname == "down" else 1
        ls.param(node, pname, spec.shape, (on_axis(split, axis),), "ring",
                 "rows of intermediate" if axis == 0 else "columns of intermediate")
    return ls.partial


SHARDING.register("mlp")(ShardRule(_mlp))


def _moe(ls: LayerSharding, node: OpNode):
    op, ep = node.op, ls.ep
    ls.full(node, node.inputs[0])
    tp = ls.cores // ep
    per = Split(0, ep, tp, op.num_experts // ep, op.num_experts // ep)
    width = lane_split(op.expert_intermediate, tp)
    role = f"experts over {ep} groups, intermediate over {tp} cores"
    h, e, i = op.hidden, op.num_experts, op.expert_intermediate
    ls.param(node, "router", (h, e), (), "ring", "replicated")
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
    ls.experts.append((node.name, ep, tp, op.num_experts // ep, width.padded))
    return ls.partial


SHARDING.register("moe")(ShardRule(_moe))
