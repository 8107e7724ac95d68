"""Emit: Plan -> the source text of one megakernel module (jinja2, StrictUndefined).

Table-driven: ``EMITTERS`` holds one function per op kind; each returns the
source lines of its op inside a stack's layer body, preceded by a
``# node: layers[s].{name}`` comment (load.py maps errors back to it). Every
number the generated code uses is computed here from the plan; the template
only arranges it.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from megakernel.backends.pallas_tpu import pack
from megakernel.errors import EmitError
from megakernel.registry import Registry

TEMPLATES = Path(__file__).parent / "templates"


def v(tensor: str) -> str:
    """Python variable of a layer tensor."""
    return f"t_{tensor}"


class StackCtx:
    """What an emitter needs about one stack: its shard, tiles, vectors, sites."""

    def __init__(self, model, plan, s):
        self.model, self.plan, self.s = model, plan, s
        self.shard = plan.shard.stacks[s]
        self.stream = plan.memory.stream.stacks[s]
        self.layer = model.stacks[s].layer
        self.vectors = [p.name for p in self.shard.params if p.channel == "vector"]
        self.ring = [p.name for p in self.shard.params if p.channel == "ring"]
        self.sites = {c.producer: c for c in plan.collectives.per_layer(s)}
        self.libraries: dict[str, str] = {}     # kernel library module -> its alias

    def library(self, module: str, alias: str) -> str:
        """Import ``backends.pallas_tpu.<module>`` as ``alias`` in the kernel."""
        self.libraries[module] = alias
        return alias

    def vec(self, name: str) -> str:
        return f"vec_s{self.s}.get({self.vectors.index(name)}, k)"

    def tiles_of(self, param: str) -> tuple[int, int]:
        """(first, count) of the layer's ring tiles of ``param``."""
        idx = [j for j, t in enumerate(self.stream.tiles) if t.param == param]
        if not idx or idx != list(range(idx[0], idx[-1] + 1)):
            raise EmitError(f"tiles of {param} are not contiguous in the stream",
                            path=f"layers[{self.s}].{param}")
        return idx[0], len(idx)

    def linear(self, out: str, x: str, param: str, width: int) -> str:
        first, count = self.tiles_of(param)
        return (f"{out} = rt.ring_linear(stream, {self.s}, k, {x}, "
                f"S{self.s}_TILES.tiles[{first}:{first + count}], out_cols={width}, first={first})")

    def reduce(self, node: str, tensor: str) -> list[str]:
        site = self.sites.get(node)
        if site is None:
            return []
        par = f"({site.seq_offset} + k * {site.seq_stride}) % 2"
        from megakernel.backends.pallas_tpu.scratch import allreduce_call

        return [allreduce_call(self.plan, v(tensor), par, site.name)]


# One rule per op kind: (stack context, node) -> source lines of the layer body.
EMITTERS: Registry = Registry("emitter", "backends/pallas_tpu/emit.py")


@EMITTERS.register("rmsnorm")
def _rmsnorm(c: StackCtx, n) -> list[str]:
    op = n.op
    return [f"{v(n.outputs[0])} = rt.rmsnorm({v(n.inputs[0])}, {c.vec(n.name + '.weight')}, "
            f"dim={op.dim}, eps={op.eps!r}, offset={op.offset})"]


@EMITTERS.register("linear")
def _linear(c: StackCtx, n) -> list[str]:
    out = n.outputs[0]
    lines = [c.linear(v(out), v(n.inputs[0]), f"{n.name}.weight", c.shard.width(out))]
    lines += c.reduce(n.name, out)
    if n.op.bias:
        lines.append(f"{v(out)} = {v(out)} + {c.vec(n.name + '.bias')}")
    return lines


@EMITTERS.register("rope")
def _rope(c: StackCtx, n) -> list[str]:
    op = n.op
    heads = c.shard.width(n.inputs[0]) // op.head_dim
    return [f"{v(n.outputs[0])} = rt.rope({v(n.inputs[0])}, pos, s{c.s}_{n.name}_inv_freq[...], "
            f"heads={heads}, "
            f"head_dim={op.head_dim}, rotary_dim={op.rotary_dim})"]


@EMITTERS.register("attention")
def _attention(c: StackCtx, n) -> list[str]:
    q, kk, vv = (v(t) for t in n.inputs)
    caches = f"s{c.s}_{n.name}_k_cache, s{c.s}_{n.name}_v_cache"
    c.library("attention", "attn_lib")
    return [f"{v(n.outputs[0])} = attn_lib.attend(ATTN_S{c.s}_{n.name}, {q}, {kk}, {vv}, "
            f"{caches}, k, start_pos, attn_s{c.s}_{n.name})"]


@EMITTERS.register("mlp")
def _mlp(c: StackCtx, n) -> list[str]:
    op, x, out = n.op, v(n.inputs[0]), n.outputs[0]
    width = c.shard.param(f"{n.name}.up").shape[1]
    if op.gated:      # stream order: gate, up, down
        lines = [c.linear("gate", x, f"{n.name}.gate", width),
                 c.linear("up", x, f"{n.name}.up", width),
                 f"act = rt.activation({op.activation.value!r}, gate) * up"]
    else:
        lines = [c.linear("up", x, f"{n.name}.up", width)]
        lines.append(f"act = rt.activation({op.activation.value!r}, up)")
    lines.append(c.linear(v(out), "act", f"{n.name}.down", c.shard.width(out)))
    return lines + c.reduce(n.name, out)


@EMITTERS.register("moe")
def _moe(c: StackCtx, n) -> list[str]:
    op, x, out = n.op, v(n.inputs[0]), n.outputs[0]
    pre = f"s{c.s}_{n.name}_"
    bias = c.vec(f"{n.name}.router_bias") if op.correction_bias else "None"
    local = next(e for e in c.shard.experts if e[0] == n.name)[3]
    first, count = c.tiles_of(f"{n.name}.router")
    c.library("moe", "moe_lib")
    lines = [f"router = rt.ring_matrix(stream, {c.s}, k, S{c.s}_TILES.tiles[{first}:"
             f"{first + count}], first={first})",
             f"{v(out)} = moe_lib.moe_routed(MOE_S{c.s}_{n.name}, {x}, router, {bias}, "
             f"{pre}experts_gate, {pre}experts_up, {pre}experts_down, k, "
             f"expert_base_s{c.s}_{n.name} * {local}, moe_s{c.s}_{n.name})"]
    if op.num_shared_experts:
        width = c.shard.param(f"{n.name}.shared_up").shape[1]
        lines += [c.linear("gate", x, f"{n.name}.shared_gate", width),
                  c.linear("up", x, f"{n.name}.shared_up", width),
                  f"act = rt.activation({op.activation.value!r}, gate) * up",
                  c.linear("shared", "act", f"{n.name}.shared_down", c.shard.width(out)),
                  f"{v(out)} = {v(out)} + shared"]
    return lines + c.reduce(n.name, out)


@EMITTERS.register("add")
def _add(c: StackCtx, n) -> list[str]:
    a, b = (v(t) for t in n.inputs)
    return [f"{v(n.outputs[0])} = {a} + {b}"]


def stack_body(c: StackCtx) -> list[str]:
    s, count = c.s, c.shard.count
    lines = [f"# ---- stack {s}: layers {c.shard.start}..{c.shard.start + count - 1} "
             f"({c.layer.kind}) ----",
             f"vec_s{s} = rt.Vectors(({''.join(f's{s}_{pack.ident(p)}, ' for p in c.vectors)}), "
             f"({''.join(f'vec_s{s}_{i}, ' for i in range(len(c.vectors)))}), vec_sems_s{s}, "
             "sync=SYNCHRONISED)",
             f"vec_s{s}.start(0)", "", f"def layer_s{s}(k, carry):",
             f"    vec_s{s}.wait(k)", "", f"    @pl.when(k + 1 < {count})",
             "    def _():", f"        vec_s{s}.start(k + 1)", "",
             f"    {v(c.layer.input)} = residual[...]"]
    for n in c.layer.nodes:
        emitter = EMITTERS(n.op.kind, f"layers[{s}].{n.name}")
        lines.append(f"    # node: layers[{s}].{n.name}")
        lines += [f"    {line}" for line in emitter(c, n)]
    lines += [f"    residual[...] = {v(c.layer.output)}", "    return carry", "",
              f"jax.lax.fori_loop(0, {count}, layer_s{s}, 0)", ""]
    return lines


def render(model, plan, *, synchronised: bool = False) -> str:
    """The generated module's source text for ``plan``; ``synchronised`` builds
    the synchronised-ops ablation (no DMA ahead across op boundaries; bench only)."""
    from megakernel.backends.pallas_tpu import scratch

    known = ("one_shot", "rs_ag", "exchange")
    bad = [s.name for s in plan.collectives.specs if s.algorithm not in known]
    if bad:
        raise EmitError(f"collective algorithm of {bad} is not implemented; known: {known}",
                        path="plan.collectives", hint="plan with overrides allreduce='one_shot'")
    ctxs = [StackCtx(model, plan, s) for s in range(len(plan.shard.stacks))]
    ops = pack.operands(model, plan)
    inputs = [o for o in ops]
    caches = [i for i, o in enumerate(ops) if o.role == "cache"]
    sc = scratch.plan_scratch(model, plan, ctxs)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    body = scratch.prologue_lines(model, plan, ctxs, sc)
    for c in ctxs:
        body += stack_body(c)
    body += scratch.epilogue_lines(model, plan)
    req, mem = plan.request, plan.memory
    return env.get_template("kernel.py.j2").render(
        model_name=model.name, target=f"{plan.target.chip} ({plan.target.topology.name})",
        cores=plan.shard.cores, digest=plan.digest(), batch=req.batch, tokens=req.tokens,
        rows=mem.rows, rows_padded=mem.rows_padded, hidden=model.hidden_size,
        vocab_size=model.vocab_size, vocab_stride=plan.shard.vocab_stride,
        vocab_local=plan.shard.vocab_local, num_banks=mem.stream.num_banks,
        bank_shape=sc.bank_shape, vmem_limit=sc.vmem_limit,
        libraries=sorted({(m, a) for c in ctxs for m, a in c.libraries.items()}),
        inputs=inputs, sharded=tuple(o.sharded for o in inputs), cache_inputs=tuple(caches),
        segments=sc.segments, segment_names=", ".join(s["name"] for s in sc.segments),
        geometry_lines=sc.geometry_lines, scratch_lines=sc.lines, scratch_extra=sc.extra,
        n_inputs=len(inputs), n_outputs=1 + len(caches), n_scratch=len(sc.names),
        input_names=", ".join(o.name + ("_in" if o.role == "cache" else "") for o in inputs),
        output_names=", ".join(["next_token"] + [ops[i].name for i in caches]),
        scratch_names=", ".join(sc.names), scratch_unpack=sc.unpack, body=body,
        collective_id=0 if plan.shard.cores > 1 else None, synchronised=synchronised)
