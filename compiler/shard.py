"""Shard the model over N TensorCores (tensor parallel, MoE expert/tensor parallel).

After ``shard_model``: every weight has a ``ParamShard`` saying which axes are
split, which slice core c holds and the per-core (padded) shape; every layer
tensor has a per-core width; every tensor that leaves an op as a partial sum
has a ``Reduction`` naming its producer and consumer (the all-reduce sites).
Per-core shapes obey TPU tiling: split widths that feed the lane axis are
zero-padded to 128 lanes where that is exact (zero columns/rows add nothing).

Rules. Query heads are split evenly; KV heads are split, or replicated when
there are fewer KV heads than cores (each core keeps the one KV head its query
heads use). Projections into attention are column-parallel, the projection out
of it row-parallel (output is a partial sum). MLP intermediate and MoE experts
(expert parallel over ``ep`` groups, the intermediate split over ``cores/ep``)
likewise end in partial sums. The router and all norms are replicated; the
embedding and LM head are vocabulary-sharded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from megakernel.compiler.layout import LANES, dtype_name, itemsize, round_up
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.shard_formats import CUT_GROUPS, check_globals, format_params
from megakernel.compiler.shard_rules import ParamShard, Reduction, Split, StateShard, layer_rules
from megakernel.errors import IRError, PlanningError, ShardingError, error_context
from megakernel.quantize import Packed
from megakernel.ir.graph import Model, body_global_name, body_local_name, body_run, body_runs
from megakernel.ir.weight_kinds import layer_formats

__all__ = ["Split", "ParamShard", "StateShard", "StackShard", "ShardPlan", "Reduction", "shard_model",
           "moe_degrees", "whole_experts", "legal_core_counts", "shard_weights",
           "gather_weights"]


@dataclass(frozen=True)
class StackShard:
    """Shards of one stack's body (identical for all ``count`` repetitions of
    its ``period`` layers; one copy per run of equal layers, ``runs`` as in
    ``ir.graph.Stack``). ``widths``: per-core feature count of every tensor."""

    stack: int
    start: int
    count: int
    period: int
    params: tuple[ParamShard, ...]
    widths: tuple[tuple[str, int], ...]
    reductions: tuple[Reduction, ...]
    heads: tuple[tuple[str, int, int, int], ...]   # (attention node, q heads, kv heads, kv replication)
    experts: tuple[tuple[str, int, int, int, int], ...]  # (moe node, ep, tp, experts/core, intermediate/core)
    states: tuple[StateShard, ...] = ()
    runs: tuple[tuple[int, int], ...] = dataclasses.field(default=(),
                                                          metadata={OMIT_DEFAULT: True})

    def reps(self, local: str) -> int:
        """Run-layers of body weight, state or node ``local`` per step."""
        return self.count * body_run(self.period, self.runs, local.split(".")[0])[1]

    def layer_order(self):
        """(run-layer index, run's first body position) of every layer of the
        stack, in execution order."""
        for rep in range(self.count):
            for first, c in body_runs(self.period, self.runs):
                for i in range(c):
                    yield rep * c + i, first

    def param(self, name: str) -> ParamShard:
        return next(p for p in self.params if p.name == name)

    def width(self, tensor: str) -> int:
        return dict(self.widths)[tensor]

    @property
    def layers(self) -> int:
        return self.count * self.period

    def global_name(self, k: int, local: str) -> str:
        """Full name of body weight/state ``local`` in repetition ``k``."""
        return body_global_name(self.start, self.period, k, local, self.runs)


@dataclass(frozen=True)
class ShardPlan:
    cores: int
    stacks: tuple[StackShard, ...]
    globals: tuple[ParamShard, ...]
    vocab_stride: int       # vocabulary entries per core before padding
    vocab_local: int        # per-core vocabulary after padding to 128 lanes
    vocab_size: int
    embed: str              # "vocab" | "replicated"
    tied: bool
    ep: int                 # expert-parallel degree of MoE stacks (1: pure TP)

    def global_param(self, name: str) -> ParamShard:
        return next(p for p in self.globals if p.name == name)

    def stack_of(self, layer: int) -> StackShard:
        return next(s for s in self.stacks if s.start <= layer < s.start + s.layers)

    def param(self, full_name: str) -> ParamShard:
        if full_name.startswith("layers."):
            _, index, rest = full_name.split(".", 2)
            st = self.stack_of(int(index))
            return st.param(body_local_name(st.start, st.period, int(index), rest, st.runs)[1])
        return self.global_param(full_name)

    def full_names(self):
        """(full weight name, shard) over the model, in consumption order."""
        yield "embed.weight", self.global_param("embed.weight")
        for st in self.stacks:
            for k, first in st.layer_order():
                for p in st.params:
                    if st.period == 1 or p.name.startswith(f"l{first}_"):
                        yield st.global_name(k, p.name), p
        for p in self.globals[1:]:
            yield p.name, p

    def vocab_valid(self, core: int) -> int:
        """Real (unpadded) vocabulary entries of core ``core``'s logits."""
        return max(0, min(self.vocab_stride, self.vocab_size - core * self.vocab_stride))

    def padding(self) -> list[tuple[str, tuple[int, ...], tuple[int, ...], int]]:
        """(weight, full shape, per-core shape, zero-padding bytes per core) for
        every weight whose shard was padded."""
        named = [(f"stack{s.stack}.{p.name}", p) for s in self.stacks for p in s.params]
        named += [(p.name, p) for p in self.globals]
        out = []
        for name, p in named:
            valid = math.prod(r.stop - r.start for r in p.source(0))
            if p.size > valid:
                out.append((name, p.full_shape, p.shape, (p.size - valid) * itemsize(p.dtype)))
        return out


def expert_counts(model: Model) -> list[int]:
    """Expert counts of the model's routed ops (any op with ``num_experts``)."""
    return sorted({n.op.num_experts for st in model.stacks for n in st.layer.nodes
                   if getattr(n.op, "num_experts", None)})


def whole_experts(model: Model) -> bool:
    """Whether a routed op needs each expert whole on one core (its
    ``whole_experts``: a per-expert output norm reads all of its output)."""
    return any(getattr(n.op, "whole_experts", False) for st in model.stacks
               for n in st.layer.nodes)


def moe_degrees(model: Model, cores: int) -> list[int]:
    """Expert-parallel degrees d that are legal for every MoE layer: d divides
    ``cores`` and the expert count, and is ``cores`` itself where an expert
    must stay whole (no intermediate split). [1] for a dense model."""
    experts = expert_counts(model)
    whole = whole_experts(model)
    return [d for d in range(1, cores + 1)
            if cores % d == 0 and all(e % d == 0 for e in experts) and not (whole and d < cores)]


def _resolve_ep(model: Model, cores: int, moe_parallel) -> int:
    if not expert_counts(model):
        return 1
    legal = moe_degrees(model, cores)
    if moe_parallel is None and legal:
        return legal[0]           # 1 (pure tensor parallel) unless experts stay whole
    wanted = {None: cores, "tp": 1, "ep": cores}.get(moe_parallel, moe_parallel)
    if wanted not in legal:
        if whole_experts(model):
            raise ShardingError(
                f"expert_output_norm normalises each expert's whole output, so each expert "
                f"sits whole on one core: ep must be cores={cores}, which must divide "
                f"num_experts={expert_counts(model)} (moe_parallel={moe_parallel!r})",
                path="shard.moe_parallel",
                hint=f"use moe_parallel='ep' with devices dividing {expert_counts(model)}")
        raise ShardingError(f"expert-parallel degree {wanted} does not divide both "
                            f"cores={cores} and num_experts={expert_counts(model)}",
                            path="shard.moe_parallel",
                            hint=f"use moe_parallel in {legal} or 'tp'")
    return wanted


def legal_core_counts(model: Model) -> list[int]:
    """Core counts in 1..32 that every stack's layer can be sharded over (tried
    with the sharding rules themselves, so the answer cannot drift from them)."""
    def fits(cores: int) -> bool:
        try:
            ep = _resolve_ep(model, cores, None)
            for st in model.stacks:
                params = layer_rules(st.layer, model.dtype, cores, ep)[0]
                # quantized weights: a core's rows must hold whole scale groups
                format_params(params, layer_formats(model.quantize, st.layer), "shard")
        except (ShardingError, PlanningError, IRError):
            return False
        return True

    return [c for c in range(1, 33) if fits(c)]


def shard_model(model: Model, cores: int, *, moe_parallel=None, embed: str = "vocab") -> ShardPlan:
    """Split ``model`` over ``cores`` TensorCores; raises ShardingError naming the
    tensor, the numbers and the core counts that would work."""
    if not (isinstance(cores, int) and 1 <= cores <= 32):
        raise ShardingError(f"devices={cores!r} must be an integer in 1..32", path="shard")
    ep = _resolve_ep(model, cores, moe_parallel)
    stacks = []
    for i, st in enumerate(model.stacks):
        try:
            with error_context(f"shard.layers.{st.start}"):
                params, widths, reductions, heads, experts, states = layer_rules(
                    st.layer, model.dtype, cores, ep)
        except ShardingError as err:
            if err.hint:
                raise
            raise ShardingError(err.message, path=err.path,
                                hint=f"use devices in {legal_core_counts(model)}") from None
        try:
            params = format_params(params, layer_formats(model.quantize, st.layer),
                                   f"shard.layers.{st.start}")
        except PlanningError as err:
            if err.hint != CUT_GROUPS:
                raise
            raise PlanningError(err.message, path=err.path,
                                hint=f"use devices in {legal_core_counts(model)}, or "
                                     "another format for this weight kind") from None
        stacks.append(StackShard(i, st.start, st.count, st.period, params, widths, reductions,
                                 heads, experts, states, st.runs))
    check_globals(model.quantize)
    v, h, dt = model.vocab_size, model.hidden_size, dtype_name(model.dtype)
    stride = -(-v // cores)
    local = round_up(stride, LANES)
    vocab_split = Split(axis=0, parts=cores, div=1, stride=stride, padded=local)
    embed_splits = (vocab_split,) if embed == "vocab" else ()
    globals_ = [ParamShard("embed.weight", (v, h), dt, embed_splits, "gather",
                           "vocab rows" if embed_splits else "replicated"),
                ParamShard("final_norm.weight", (h,), dt, (), "resident", "replicated")]
    # A tied head is a second copy of the embedding, stored transposed
    # ([hidden, vocab]): streamed [vocab, hidden] it would reach the MXU as
    # transposed pushes, which run at half rate (docs/floors.md). HBM has room.
    head = ParamShard("lm_head.weight", (h, v), dt, (Split(1, cores, 1, stride, local),),
                      "ring", "vocab columns" + ("; the tied embedding, transposed"
                                                 if model.tie_embeddings else ""))
    # A quantized head streams codes, its scales beside them (per column for int8)
    globals_.extend(format_params((head,), {head.name: model.quantize.lm_head}, "shard"))
    return ShardPlan(cores, tuple(stacks), tuple(globals_), stride, local, v, embed,
                     model.tie_embeddings, ep)


def _cut(full: np.ndarray, p: ParamShard, core: int) -> np.ndarray:
    if isinstance(full, Packed):       # a quantized weight: codes and scales alike
        return full.cut(p.source(core), p.shape, f"shard.{p.name}")
    part = full[p.source(core)]
    pads = [(0, want - have) for want, have in zip(p.shape, part.shape)]
    return np.pad(part, pads) if any(hi for _, hi in pads) else np.ascontiguousarray(part)


def shard_weights(model: Model, plan: ShardPlan,
                  weights: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Per-core weights: ``out[c][name]`` has shape ``plan.param(name).shape``."""
    out: list[dict[str, np.ndarray]] = [{} for _ in range(plan.cores)]
    for name, p in plan.full_names():
        if p.scale_of:           # cut with its weight (a quantize.Packed) below
            continue
        full = head_of(weights) if name == "lm_head.weight" and plan.tied else weights[name]
        if tuple(full.shape) != p.full_shape:
            raise ShardingError(f"weight has shape {tuple(full.shape)}, expected "
                                f"{p.full_shape}", path=f"shard.{name}")
        for core in range(plan.cores):
            out[core][name] = _cut(full, p, core)
            if isinstance(full, Packed):
                out[core][name + "_scale"] = out[core][name].scales
    return out


def head_of(weights: dict[str, np.ndarray]) -> np.ndarray:
    """The LM head a tied model streams: its embedding, transposed."""
    return np.ascontiguousarray(weights["embed.weight"].T)


def gather_weights(model: Model, plan: ShardPlan,
                   per_core: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Inverse of ``shard_weights``: every full weight rebuilt from the cores'
    valid (unpadded) regions; replicated copies must agree."""
    out = {}
    for name, p in plan.full_names():
        if isinstance(per_core[0][name], Packed):      # codes; scales from their shard
            codes = _gather(p, [c[name].codes for c in per_core], name)
            scales = _gather(plan.param(name + "_scale"), [c[name].scales for c in per_core],
                             name + "_scale")
            out[name] = dataclasses.replace(per_core[0][name], codes=codes, scales=scales)
            continue
        if p.scale_of:
            continue
        out[name] = _gather(p, [c[name] for c in per_core], name)
    if plan.tied:           # the head is derived from the embedding, not a weight
        if not np.array_equal(out.pop("lm_head.weight"), head_of(out)):
            raise ShardingError("the tied LM head differs from the embedding",
                                path="shard.lm_head.weight")
    return out


def _gather(p, pieces: list[np.ndarray], name: str) -> np.ndarray:
    """One weight rebuilt from every core's piece (its valid region); the
    copies several cores hold must agree."""
    full = np.zeros(p.full_shape, pieces[0].dtype)
    seen = np.zeros(p.full_shape, bool)
    for core, mine in enumerate(pieces):
        region = p.source(core)
        piece = mine[tuple(slice(0, r.stop - r.start) for r in region)]
        if seen[region].any() and not np.array_equal(full[region], piece):
            raise ShardingError("replicated copies differ between cores", path=f"shard.{name}")
        full[region], seen[region] = piece, True
    return full
