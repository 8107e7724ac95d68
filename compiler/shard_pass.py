"""The sharding pass over one layer, and the rule record each op kind gives it.

After ``layer_rules``: every tensor of the layer has its state, every weight
its ``ParamShard``, every all-reduce site its ``Reduction`` (what the
module docstring of compiler/shard_rules.py spells out), found by running
each node's ``ShardRule`` from ``SHARDING`` backward (``want``) then forward.
``LayerSharding`` is the state the rules read and write; ``lane_split`` and
``on_axis`` the splits they share. Each kind's rule is registered in its
compiler/kind_*.py (the projection's and the residual add's in
compiler/shard_rules.py, which re-exports this module's names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from megakernel.compiler.layout import LANES, dtype_name, round_up
from megakernel.compiler.shard_records import PARTIAL, REP, ParamShard, Reduction, Split
from megakernel.errors import ShardingError, error_context
from megakernel.ir.graph import Layer, OpNode
from megakernel.ir.types import DType
from megakernel.registry import Registry


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


SHARDING: Registry[ShardRule] = Registry(
    "sharding", "compiler/kind_*.py (linear, add: compiler/shard_rules.py)")


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
        # one state for every output, or a tuple of one each (a per-slot MoE)
        outs = out if isinstance(out, tuple) else (out,) * len(node.outputs)
        for t, state in zip(node.outputs, outs):
            ls.state[t] = state
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
