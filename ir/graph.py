"""The layer graph: ops joined by named tensors, layers, stacks and the model.

Outside, everything is a frozen dataclass checked at construction; inside, a
layer's dataflow is a networkx DiGraph used to verify it (every input produced
before use, no cycles, shapes agree) and to order it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Annotated

import networkx as nx
from pydantic import Field

from megakernel.errors import IRError, error_context
from megakernel.ir import limits
from megakernel.ir.kind_rmsnorm import RMSNorm
from megakernel.ir.op_base import Op
from megakernel.ir.schema import Bool, Identifier, Int, ModelName, node
from megakernel.ir.types import DType, ParamSpec, StateSpec, TensorSpec
from megakernel.ir.weight_kinds import Quantize

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


MAX_PERIOD = 8   # longest repeating body of layers a stack is looked for with


@dataclass(frozen=True)
class Stack:
    """``count`` repetitions of a body of ``period`` consecutive layers from
    ``start`` (a 3:1 linear/full-attention hybrid is one stack with a body of
    4). Later stages loop over the repetitions. ``runs``: the body's runs of
    consecutive equal layers, (first body position, length) each, covering
    the body in order. ``layer`` is the body as one graph holding ONE copy of
    each run's layer: with a period above 1, the copy of the run starting at
    body position j has its nodes and tensors prefixed ``l{j}_`` and its
    input is the previous run's output, so every stage treats the body as
    one layer, and the kernel loops over a run's layers inside the loop over
    repetitions. A node of a run of c layers runs ``count * c`` times a step:
    its run-layer index k in 0..count*c-1 is repetition k // c, layer k % c
    of the run (``body_place``), and its weights, vectors and state are
    indexed by k."""

    kind: str
    start: int
    count: int
    layer: Layer
    period: int = 1
    body: tuple[Layer, ...] = ()
    runs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        check_runs(self.period, self.runs)

    @property
    def indices(self) -> range:
        """Global indices of every layer of the stack."""
        return range(self.start, self.start + self.count * self.period)

    def reps(self, node: str) -> int:
        """How many times body node ``node`` runs per step (its run-layers)."""
        return self.count * body_run(self.period, self.runs, node)[1]

    def place(self, k: int, node: str) -> tuple[int, str]:
        return body_place(self.start, self.period, k, node, self.runs)

    def global_name(self, k: int, local: str) -> str:
        return body_global_name(self.start, self.period, k, local, self.runs)


def body_runs(period: int, runs: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The runs of a body: ``runs``, or each position its own run when empty."""
    return runs or tuple((j, 1) for j in range(period))


def check_runs(period: int, runs: tuple[tuple[int, int], ...]) -> None:
    """``runs`` (when given) cover body positions 0..period-1 in order."""
    at = 0
    for first, length in runs:
        if first != at or length < 1:
            raise IRError(f"runs {list(runs)} do not cover a body of {period} layers in order",
                          path="stack.runs")
        at += length
    if runs and at != period:
        raise IRError(f"runs {list(runs)} do not cover a body of {period} layers in order",
                      path="stack.runs")


def body_run(period: int, runs: tuple[tuple[int, int], ...], node: str) -> tuple[int, int]:
    """(first body position, length) of the run whose layer holds body node
    ``node`` (named ``l{first}_...`` when the period is above 1)."""
    if period == 1:
        return 0, 1
    head = node.partition("_")[0]
    first = int(head[1:])
    for run in body_runs(period, runs):
        if run[0] == first:
            return run
    raise IRError(f"node {node!r} names body position {first}, which starts no run of "
                  f"{list(body_runs(period, runs))}", path="stack.runs")


def body_place(start: int, period: int, k: int, node: str,
               runs: tuple[tuple[int, int], ...] = ()) -> tuple[int, str]:
    """(global layer index, node name in that layer) of a stack body's node
    ``node`` at run-layer index ``k`` (repetition k // c, layer k % c of its
    run of c layers; with no repeated layers, k is the repetition)."""
    name = node
    if period > 1:
        name = node.partition("_")[2]
    first, c = body_run(period, runs, node)
    rep, i = divmod(k, c)
    return start + rep * period + first + i, name


def body_global_name(start: int, period: int, k: int, local: str,
                     runs: tuple[tuple[int, int], ...] = ()) -> str:
    """``layers.{i}.{op}.{rest}`` of a body weight or state ``{node}.{rest}``
    at run-layer index ``k``."""
    node, _, rest = local.partition(".")
    i, name = body_place(start, period, k, node, runs)
    return f"layers.{i}.{name}.{rest}"


def body_local_name(start: int, period: int, layer: int, rest: str,
                    runs: tuple[tuple[int, int], ...] = ()) -> tuple[int, str]:
    """(run-layer index, body-local ``{node}.{...}``) of ``layers.{layer}.{rest}``."""
    rep, j = divmod(layer - start, period)
    first, c = next(r for r in body_runs(period, runs) if r[0] <= j < r[0] + r[1])
    return rep * c + j - first, (f"l{first}_{rest}" if period > 1 else rest)


def find_runs(body: tuple[Layer, ...]) -> tuple[tuple[int, int], ...]:
    """(first position, length) of each run of consecutive equal layers of ``body``."""
    runs: list[list[int]] = []
    for j, layer in enumerate(body):
        if runs and body[runs[-1][0]] == layer:
            runs[-1][1] += 1
        else:
            runs.append([j, 1])
    return tuple((a, b) for a, b in runs)


def merge_body(body: tuple[Layer, ...], runs: tuple[tuple[int, int], ...] = ()) -> Layer:
    """One graph running one copy of each of ``body``'s runs in order (see
    ``Stack``; no runs given: every layer its own run)."""
    if len(body) == 1:
        return body[0]
    nodes, tensors, carry = [], [], None
    for j, _ in body_runs(len(body), runs):
        layer = body[j]
        rename = {t.name: f"l{j}_{t.name}" for t in layer.tensors}
        if carry is not None:
            rename[layer.input] = carry          # chained: input = previous output
        tensors += [TensorSpec(rename[t.name], t.shape, t.dtype) for t in layer.tensors
                    if not (carry is not None and t.name == layer.input)]
        nodes += [OpNode(f"l{j}_{n.name}", n.op, tuple(rename[t] for t in n.inputs),
                         tuple(rename[t] for t in n.outputs)) for n in layer.nodes]
        carry = rename[layer.output]
    kind = "_".join(layer.kind for layer in body)[:limits.MAX_NAME_CHARS]
    return Layer(kind, tuple(nodes), tuple(tensors), f"l0_{body[0].input}", carry)


def find_stacks(layers: tuple[Layer, ...]) -> tuple[Stack, ...]:
    """Cover ``layers`` by stacks, left to right: at each layer the repeating
    body (at most ``MAX_PERIOD`` layers, repeated at least twice) that covers
    the most layers, the shortest body on a tie; a layer that starts no
    repetition is a stack of its own."""
    out, i, n = [], 0, len(layers)
    while i < n:
        best = (1, 1)                            # (repetitions, period)
        for p in range(1, min(MAX_PERIOD, n - i) + 1):
            reps = 1
            while i + (reps + 1) * p <= n and \
                    layers[i + reps * p:i + (reps + 1) * p] == layers[i:i + p]:
                reps += 1
            if reps >= 2 and reps * p > best[0] * best[1]:
                best = (reps, p)
        reps, p = best
        body = tuple(layers[i:i + p])
        runs = find_runs(body) if p > 1 else ()
        if runs and all(c == 1 for _, c in runs):
            runs = ()                            # no repeated layer: as before runs
        merged = merge_body(body, runs)
        out.append(Stack(merged.kind, i, reps, merged, p, body, runs))
        i += reps * p
    return tuple(out)


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
    # Elementwise ops applied, in order, to the logits (e.g. Gemma 2's final
    # soft-capping); each maps [vocab] to [vocab].
    logit_ops: Annotated[tuple[Op, ...], Field(max_length=8)] = ()
    # Elementwise ops applied, in order, to the embedded tokens before the
    # first layer (e.g. Gemma's scale by sqrt(hidden)); each maps [hidden] to
    # [hidden]. A tied LM head reads the embedding table without them.
    embed_ops: Annotated[tuple[Op, ...], Field(max_length=8)] = ()
    # The storage format of each weight kind (megakernel/formats.py); all
    # plain unless the card or ``--quantize`` asks.
    quantize: Quantize = Quantize()
    # Ids below it are the vocabulary; the rows from it to vocab_size are
    # padding (Muse Spark), never chosen, their logits -inf. None: all used.
    vocab_used: Int(1, limits.MAX_VOCAB) | None = None

    def __post_init__(self):
        if not self.layers:
            raise IRError("a model needs at least one layer", path="layers")
        if self.vocab_used is not None and self.vocab_used > self.vocab_size:
            raise IRError(f"vocab_used={self.vocab_used} exceeds vocab_size={self.vocab_size}",
                          path="vocab_used", hint=f"use at most {self.vocab_size}")
        for where, ops, width in (("logit_ops", self.logit_ops, self.vocab_size),
                                  ("embed_ops", self.embed_ops, self.hidden_size)):
            for i, op in enumerate(ops):
                with error_context(f"{where}.{i}"):
                    if op.params(self.dtype) or op.infer(((width,),)) != ((width,),):
                        raise IRError(f"{op.kind} is not a weightless op from [{width}] to "
                                      f"[{width}]", path="kind",
                                      hint="use scale, softcap, activation or an rmsnorm "
                                           "without weight")
        for i, layer in enumerate(self.layers):
            shape = layer.tensor(layer.input).shape
            if shape != (self.hidden_size,):
                raise IRError(f"input has per-token shape {shape}, expected "
                              f"({self.hidden_size},) = hidden_size", path=f"layers.{i}")
        if self.tie_embeddings and self.quantize.lm_head != "plain":
            raise IRError(f"lm_head={self.quantize.lm_head!r}, but the LM head is the tied "
                          "embedding, which stays plain", path="quantize.lm_head",
                          hint="remove lm_head from the quantize table")
        self.check_formats()
        if self.final_norm.dim != self.hidden_size:
            raise IRError(f"dim={self.final_norm.dim} differs from hidden_size="
                          f"{self.hidden_size}", path="final_norm")

    @functools.cached_property
    def stacks(self) -> tuple[Stack, ...]:
        return find_stacks(self.layers)

    def params(self) -> dict[str, ParamSpec]:
        """Every weight of the model, in consumption order, each in the format
        the ``quantize`` table gives its weight kind (ir/weight_kinds.py)."""
        from megakernel.ir.weight_kinds import layer_formats

        q = self.quantize
        p = {"embed.weight": ParamSpec((self.vocab_size, self.hidden_size), self.dtype,
                                       format=q.embedding)}
        for i, layer in enumerate(self.layers):
            fmts = layer_formats(q, layer)
            p.update({f"layers.{i}.{k}": dataclasses.replace(v, format=fmts.get(k, "plain"))
                      for k, v in layer.params(self.dtype).items()})
        p["final_norm.weight"] = ParamSpec((self.hidden_size,), self.dtype)
        if not self.tie_embeddings:
            p["lm_head.weight"] = ParamSpec((self.hidden_size, self.vocab_size), self.dtype,
                                            format=q.lm_head)
        return p

    def check_formats(self) -> None:
        """Every quantized weight's shape suits its format (formats.Format.check)."""
        from megakernel import formats

        if not self.quantize.chosen():
            return
        for name, spec in self.params().items():
            formats.get(spec.format).check(spec.shape, name)

    @property
    def param_count(self) -> int:
        return sum(s.size for s in self.params().values())

    def cache_specs(self, batch: int) -> dict[str, StateSpec]:
        """Every op's state (``Op.state``: KV caches, recurrent state), named
        ``layers.{i}.{op}.{state}``, e.g. ``layers.3.attention.k`` [B, S, Hkv, D]."""
        return {f"layers.{i}.{n.name}.{name}": spec
                for i, layer in enumerate(self.layers) for n in layer.nodes
                for name, spec in n.op.state(batch, self.max_seq_len, self.dtype).items()}

    def truncated(self, num_layers: int) -> "Model":
        """The same model cut to its first ``num_layers`` layers (for tests)."""
        import dataclasses

        if not 0 < num_layers <= len(self.layers):
            raise IRError(f"cannot cut {len(self.layers)} layers to {num_layers}",
                          path="layers")
        return dataclasses.replace(self, layers=self.layers[:num_layers])
