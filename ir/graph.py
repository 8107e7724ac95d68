"""The layer graph: ops joined by named tensors, layers, stacks and the model.

Outside, everything is a frozen dataclass checked at construction; inside, a
layer's dataflow is a networkx DiGraph used to verify it (every input produced
before use, no cycles, shapes agree) and to order it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated

import networkx as nx
from pydantic import Field

from megakernel.errors import IRError, error_context
from megakernel.ir import limits
from megakernel.ir.ops import Attention, Op, RMSNorm
from megakernel.ir.schema import Bool, Identifier, Int, ModelName, node
from megakernel.ir.types import DType, ParamSpec, TensorSpec

_Names = Annotated[tuple[Identifier, ...], Field(max_length=limits.MAX_TENSORS)]


@node
class OpNode:
    """One op application: ``outputs = op(*inputs)``, named ``name`` in its layer."""

    name: Identifier
    op: Op
    inputs: _Names
    outputs: _Names


@node
class Layer:
    """One decoder layer: ``nodes`` in execution order from tensor ``input`` to
    ``output`` (both [hidden] per token). ``kind`` is a short label (``dense``,
    ``moe``); two layers with equal fields compute the same function."""

    kind: Identifier
    nodes: Annotated[tuple[OpNode, ...], Field(max_length=limits.MAX_NODES)]
    tensors: Annotated[tuple[TensorSpec, ...], Field(max_length=limits.MAX_TENSORS)]
    input: Identifier = "x"
    output: Identifier = "y"

    def __post_init__(self):
        self._verify()

    def _verify(self) -> None:
        specs = {}
        for t in self.tensors:
            if t.name in specs:
                raise IRError(f"tensor {t.name!r} is declared twice", path="tensors")
            specs[t.name] = t
        if self.input not in specs or self.output not in specs:
            raise IRError(f"input {self.input!r} and output {self.output!r} must be "
                          "declared tensors", path="tensors")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise IRError(f"op names repeat: {names}", path="nodes")
        graph = self.dataflow()
        if not nx.is_directed_acyclic_graph(graph):
            raise IRError(f"dataflow has a cycle: {nx.find_cycle(graph)}", path="nodes")
        produced = {self.input}
        for node in self.nodes:
            with error_context(node.name):
                for t in node.inputs + node.outputs:
                    if t not in specs:
                        raise IRError(f"tensor {t!r} is not declared", path="tensors")
                missing = [t for t in node.inputs if t not in produced]
                if missing:
                    raise IRError(f"reads {missing} before any op produces them "
                                  "(ops must be listed in execution order)", path="inputs")
                clash = [t for t in node.outputs if t in produced]
                if clash:
                    raise IRError(f"writes {clash}, which already have a producer "
                                  "(tensors are single-assignment)", path="outputs")
                inferred = node.op.infer(tuple(specs[t].shape for t in node.inputs))
                declared = tuple(specs[t].shape for t in node.outputs)
                if inferred != declared:
                    raise IRError(f"outputs declared with shapes {list(declared)}, "
                                  f"but the op produces {list(inferred)}", path="outputs")
                produced.update(node.outputs)
        if self.output not in produced:
            raise IRError(f"output {self.output!r} is never produced", path="output")
        if specs[self.input].shape != specs[self.output].shape:
            raise IRError(f"input shape {specs[self.input].shape} differs from output "
                          f"shape {specs[self.output].shape}", path="output")

    def dataflow(self) -> nx.DiGraph:
        """Bipartite DiGraph: tensor -> op -> tensor, ops keyed ``("op", name)``."""
        g = nx.DiGraph()
        for node in self.nodes:
            key = ("op", node.name)
            g.add_node(key, node=node)
            for t in node.inputs:
                g.add_edge(("tensor", t), key)
            for t in node.outputs:
                g.add_edge(key, ("tensor", t))
        return g

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    def node(self, name: str) -> OpNode:
        return next(n for n in self.nodes if n.name == name)

    def params(self, dtype: DType) -> dict[str, ParamSpec]:
        """Weights of this layer, keyed ``op_name.param``."""
        return {f"{n.name}.{p}": spec for n in self.nodes for p, spec in n.op.params(dtype).items()}

    def attention_nodes(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.nodes if isinstance(n.op, Attention))


@dataclass(frozen=True)
class Stack:
    """``count`` consecutive identical layers starting at ``start``: later stages
    loop over a stack instead of unrolling it."""

    kind: str
    start: int
    count: int
    layer: Layer

    @property
    def indices(self) -> range:
        return range(self.start, self.start + self.count)


@node
class Model:
    """A decoder-only LM: token embedding, layers, final norm, LM head.

    Weight names: ``embed.weight`` [V, H]; ``layers.{i}.{op}.{param}``;
    ``final_norm.weight`` [H]; ``lm_head.weight`` [H, V] unless tied to the
    embedding. ``dtype`` is the storage dtype of weights and KV caches."""

    name: ModelName
    vocab_size: Int(1, limits.MAX_VOCAB)
    hidden_size: Int(1, limits.MAX_WIDTH)
    layers: Annotated[tuple[Layer, ...], Field(max_length=limits.MAX_LAYERS)]
    final_norm: RMSNorm
    tie_embeddings: Bool = False
    dtype: DType = DType.BF16
    max_seq_len: Int(1, limits.MAX_SEQ_LEN) = 4096

    def __post_init__(self):
        if not self.layers:
            raise IRError("a model needs at least one layer", path="layers")
        for i, layer in enumerate(self.layers):
            shape = layer.tensor(layer.input).shape
            if shape != (self.hidden_size,):
                raise IRError(f"input has per-token shape {shape}, expected "
                              f"({self.hidden_size},) = hidden_size", path=f"layers.{i}")
        if self.final_norm.dim != self.hidden_size:
            raise IRError(f"dim={self.final_norm.dim} differs from hidden_size="
                          f"{self.hidden_size}", path="final_norm")

    @functools.cached_property
    def stacks(self) -> tuple[Stack, ...]:
        out: list[Stack] = []
        for i, layer in enumerate(self.layers):
            if out and out[-1].layer == layer:
                last = out[-1]
                out[-1] = Stack(last.kind, last.start, last.count + 1, last.layer)
            else:
                out.append(Stack(layer.kind, i, 1, layer))
        return tuple(out)

    def params(self) -> dict[str, ParamSpec]:
        """Every weight of the model, in consumption order."""
        p = {"embed.weight": ParamSpec((self.vocab_size, self.hidden_size), self.dtype)}
        for i, layer in enumerate(self.layers):
            p.update({f"layers.{i}.{k}": v for k, v in layer.params(self.dtype).items()})
        p["final_norm.weight"] = ParamSpec((self.hidden_size,), self.dtype)
        if not self.tie_embeddings:
            p["lm_head.weight"] = ParamSpec((self.hidden_size, self.vocab_size), self.dtype)
        return p

    @property
    def param_count(self) -> int:
        return sum(s.size for s in self.params().values())

    def cache_specs(self, batch: int) -> dict[str, ParamSpec]:
        """KV caches, ``layers.{i}.{attn}.k|v`` -> [batch, max_seq_len, Hkv, D]."""
        out = {}
        for i, layer in enumerate(self.layers):
            for node in layer.attention_nodes():
                a = node.op
                shape = (batch, self.max_seq_len, a.num_kv_heads, a.head_dim)
                for part in ("k", "v"):
                    out[f"layers.{i}.{node.name}.{part}"] = ParamSpec(shape, self.dtype)
        return out

    def truncated(self, num_layers: int) -> "Model":
        """The same model cut to its first ``num_layers`` layers (for tests)."""
        import dataclasses

        if not 0 < num_layers <= len(self.layers):
            raise IRError(f"cannot cut {len(self.layers)} layers to {num_layers}",
                          path="layers")
        return dataclasses.replace(self, layers=self.layers[:num_layers])
