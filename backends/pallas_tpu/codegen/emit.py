"""Emit: Plan -> the source text of one megakernel module (jinja2, StrictUndefined).

Table-driven: ``EMITTERS`` holds one rule per op kind; each returns the source
lines of its op inside a stack's layer body, preceded by a
``# node: layers[s].{name}`` comment (load.py maps errors back to it). The
module declares exactly the plan's buffers (``declare``), under the plan's
names, and hands each op library the buffers the plan bound to its node as
one bundle, declared once.
Every number in the source is a plan value rendered by ``declare.literal``;
the template only arranges it, and no line of the module is longer than 120
characters (``declare.wrap_source`` splits a longer one as a person would).
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from megakernel.backends.pallas_tpu.codegen import declare
from megakernel.backends.pallas_tpu.codegen import prologue_epilogue as frame
from megakernel.backends.pallas_tpu.codegen import operands as pack
from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emitters import EMITTERS, v  # noqa: F401 - kind modules' names
from megakernel.compiler import layout
from megakernel.compiler.shard_formats import scale_name
from megakernel.errors import EmitError

TEMPLATES = Path(__file__).parent / "templates"


class StackCtx:
    """What an emitter needs about one stack: its shard, tiles, vectors, sites."""

    def __init__(self, model, plan, s):
        self.model, self.plan, self.s = model, plan, s
        self.shard = plan.shard.stacks[s]
        self.stream = plan.memory.stream.stacks[s]
        self.layer = model.stacks[s].layer
        self.vectors = [p.name for p in self.shard.params if p.channel == "vector"]
        # The run being emitted (a stack without runs: its whole body): its
        # layers per step, whose run-layer index the kernel names ``k``, and
        # its vectors' double buffers (``vec_of``).
        self.count = self.shard.count
        self.vec_of = f"vec_s{s}"
        self.ring = [p.name for p in self.shard.params if p.channel == "ring"]
        self.sites = {c.producer: c for c in plan.collectives.per_layer(s)}
        self.reduced: set[str] = set()
        self.libraries: dict[str, str] = {}     # kernel library module -> its alias
        # A multi-step call's state ops read the step's positions and leave
        # stopped sequences' state alone (backends/pallas_tpu/kernels/step_loop.py).
        self.multistep = plan.request.steps > 1
        self.start_ref = declare.ref(plan, "step.start" if self.multistep else "start_pos")
        # Appended state: the call's first positions place each sequence's
        # window of new rows; the first step loads it from the cache
        # (backends/pallas_tpu/kernels/appended_state.py).
        self.first_step = "i == 0" if self.multistep else "True"
        # Lines an emitter needs around the stack's loop: before it (e.g. the
        # first repetition's state fetch) and after it (waits on its last writes).
        self.before: list[str] = []
        self.after: list[str] = []

    def stopped(self) -> str:
        """``, stopped=<ref>`` for a state op's library call in a multi-step call."""
        if not self.multistep:
            return ""
        return f", stopped={declare.ref(self.plan, 'step.stopped')}"

    def appended(self, node: str, parts) -> str:
        """``cache, ..., new rows, ...`` of ``node``'s appended state: the
        read-only cache operands, then the outputs of the call's new rows."""
        caches = [declare.ref(self.plan, f"hbm.s{self.s}.{node}.{p}") for p in parts]
        news = [declare.ref(self.plan, f"new.s{self.s}.{node}.{p}") for p in parts]
        return ", ".join(caches + news)

    def ahead(self, lib: str, node: str, parts, tile: str) -> tuple[str, str | None]:
        """(the state arguments of repetition k, the next repetition's
        prefetch, None when the loop runs once) of an op whose appended-state DMAs run a layer ahead
        (attention, MLA: their libraries' prefetch / attend / drain); adds
        repetition 0's prefetch before the stack's loop and the drain after it."""
        g, count = self.geometry(node), literal(self.count)
        appended = self.appended(node, parts)

        def state(layer: str) -> str:
            origin = declare.ref(self.plan, "start_pos")     # the call's first positions
            return (f"{appended}, {layer}, {self.start_ref}, {origin}, {self.first_step}, "
                    f"{self.buffers(node)}, sync=APPENDED_SYNC")

        where = f"layers[{self.s}].{node}"
        self.before.append(f"{lib}.prefetch({g}, {state('0')})  # {where}: "
                           f"repetition 0's first window and {tile}")
        self.after.append(f"{lib}.drain({g}, {appended}, {count}, {self.buffers(node)}, "
                          f"sync=APPENDED_SYNC)  # {where}: the last windows' stores")
        if self.count == 1:      # no next repetition to prefetch
            return state("k"), None
        return state("k"), f"{lib}.prefetch({g}, {state('k + 1')}, when=k + 1 < {count})"

    def hbm(self, param: str) -> str:
        """Kernel operand of this stack's weight ``param``."""
        return declare.ref(self.plan, f"hbm.s{self.s}.{param}")

    def library(self, module: str) -> str:
        """Import ``backends.pallas_tpu.<module>`` in the kernel; returns its alias."""
        alias = declare.library_alias(module)
        self.libraries[module] = alias
        return alias

    def buffers(self, node: str) -> str:
        """``bufs=<bundle>``: the plan buffers bound to ``node``'s library, as the
        kernel bundles them once (``declare.buffer_bundles``)."""
        return f"bufs={declare.bundle_name(node)}"

    def geometry(self, node: str) -> str:
        return declare.geometry_name(self.plan.memory.geometry_of(self.s, node))

    def vec(self, name: str) -> str:
        return f"{self.vec_of}.get({self.vectors.index(name)}, k)"

    def tiles_of(self, param: str) -> tuple[int, int]:
        """(first, count) of the layer's ring tiles of ``param`` (with its
        scales' tiles, interleaved, when it is quantized)."""
        idx = [j for j, t in enumerate(self.stream.tiles)
               if t.param in (param, scale_name(param))]
        if not idx or idx != list(range(idx[0], idx[-1] + 1)):
            raise EmitError(f"tiles of {param} are not contiguous in the stream",
                            path=f"layers[{self.s}].{param}")
        return idx[0], len(idx)

    def linear(self, out: str, x: str, param: str, width: int, exact: bool = False) -> str:
        """``out = x @ param`` through the ring; ``exact``: an f32 weight
        multiplied at full f32 precision (``rt.ring_linear``)."""
        first, count = self.tiles_of(param)
        quantized = self.shard.param(param).format != "plain"
        to = f", dequant_to={literal(self.model.dtype.value)}" if quantized else ""
        to += ", exact=True" if exact else ""
        return (f"{out} = rt.ring_linear(stream, {self.s}, k, {x}, "
                f"S{self.s}_TILES.tiles[{first}:{first + count}], out_cols={literal(width)}, "
                f"first={first}{to})")

    def reduce(self, node: str, tensor: str) -> list[str]:
        """The all-reduce of ``tensor`` if the plan puts one after ``node``."""
        site = self.sites.get(node)
        if site is None or node in self.reduced:
            return []
        self.reduced.add(node)
        if site.run > 1 and site.seq_skip:   # the other runs' collectives of each repetition
            par = _parity(site.seq_offset, (("k", site.seq_stride),
                                            (f"k // {literal(site.run)}", site.seq_skip)))
        else:                    # a run of one layer: k is the repetition
            par = _parity(site.seq_offset, (("k", site.seq_stride + site.seq_skip),))
        call = frame.allreduce_call(v(tensor), par, site)
        width = self.shard.width(tensor)
        lanes = site.lanes or self.model.hidden_size * site.fold
        if width == lanes:
            return [call]
        # A narrower partial (e.g. a per-row statistic) rides in the all-reduce's
        # [rows, hidden] slots, in its lanes rounded up to 128 (``site.lanes``:
        # one shot) or zero-padded to hidden (reduce-scatter); a wider one (a
        # per-slot MoE's picks) in whole pieces of hidden lanes (``site.fold``),
        # the last zero-padded.
        return [f"{v(tensor)} = rt.pad_lanes({v(tensor)}, {literal(lanes)})", call,
                f"{v(tensor)} = {v(tensor)}[:, :{literal(width)}]"]


def _parity(offset: int, terms) -> str:
    """The source of ``(offset + sum(term * coefficient)) % 2``, the slot of
    an all-reduce, without the terms whose coefficient is even: a constant
    where all are (Qwen3.5's attention layer: every repetition reduces into
    the same slot). A slot computed from the layer index costs libtpu's
    alias analysis a dynamic index into the slots in the loop's body, where
    the one-period cut (its loop of one trip folded) has a constant."""
    odd = [t for t, c in terms if c % 2]
    if not odd:
        return literal(offset % 2)
    if offset % 2 == 0:
        return f"{odd[0]} % 2" if len(odd) == 1 else f"({' + '.join(odd)}) % 2"
    return f"(1 + {' + '.join(odd)}) % 2"


@EMITTERS.register("linear")
def _linear(c: StackCtx, n) -> list[str]:
    out, x = n.outputs[0], v(n.inputs[0])
    lines = []
    rows = c.shard.param(f"{n.name}.weight").splits
    if rows and rows[0].axis == 0 and c.shard.width(n.inputs[0]) == n.op.in_features:
        # row-parallel on a whole input (Linear.split_rows): this core's slice
        r = rows[0]
        lines.append(f"x_rows = rt.local_slice({x}, me, {literal(r.parts)}, "
                     f"{literal(r.stride)}, {literal(r.padded)})")
        x = "x_rows"
    lines.append(c.linear(v(out), x, f"{n.name}.weight", c.shard.width(out)))
    lines += c.reduce(n.name, out)          # a row-parallel bias is added once, after it
    if n.op.bias:
        lines.append(f"{v(out)} = {v(out)} + {c.vec(n.name + '.bias')}")
    return lines


@EMITTERS.register("add")
def _add(c: StackCtx, n) -> list[str]:
    a, b = (v(t) for t in n.inputs)
    return [f"{v(n.outputs[0])} = {a} + {b}"]


def _state_update(model, plan, op) -> dict:
    """The STATE_UPDATES entry of whole-access state operand ``op``: its name,
    its update output's, and its kind's commit."""
    from megakernel.backends.pallas_tpu.kernels import state_commit as commit

    node, state = op.source.rsplit(".", 1)
    kind = model.stacks[op.stack].layer.node(node).op.kind
    where = f"layers[{op.stack}].{node}"
    fn, kwargs = commit.COMMITS(kind, where)(plan.memory.geometry_of(op.stack, node).geometry,
                                            state)
    if not callable(getattr(commit, fn, None)):
        raise EmitError(f"commit {fn!r} of {where}.{state} is not a function of "
                        "backends/pallas_tpu/kernels/state_commit.py", path=f"{where}.{state}")
    args = ", ".join(f"{k}={literal(val)}" for k, val in kwargs.items())
    return dict(input=op.name, output=op.updates, commit=f"partial(cm.{fn}, {args})")


def mem_shape(plan, ident: str) -> tuple[int, ...]:
    """Declared shape of the plan buffer whose kernel identifier is ``ident``."""
    return tuple(next(b for b in plan.memory.buffers if b.ident == ident).shape)


def render(model, plan, *, synchronised: bool = False) -> str:
    """The generated module's source text for ``plan``; ``synchronised`` builds
    the synchronised-ops ablation (no DMA ahead across op boundaries; bench only)."""
    known = ("one_shot", "rs_ag", "exchange")
    bad = [s.name for s in plan.collectives.specs if s.algorithm not in known]
    if bad or any(s.kind == "all_gather" for s in plan.collectives.specs):
        raise EmitError(f"collectives {bad or ['gather']} are not implemented in the kernel; "
                        f"it implements all-reduces {known[:2]} and the argmax exchange",
                        path="plan.collectives",
                        hint="plan with overrides allreduce='one_shot' and logits='argmax'")
    ctxs = [StackCtx(model, plan, s) for s in range(len(plan.shard.stacks))]
    ops = pack.operands(model, plan)
    # State is read only: appended state's new rows are returned (outputs
    # 1..), whole-access state's updates after them.
    appended = [i for i, o in enumerate(ops) if o.new_rows]
    whole = [i for i, o in enumerate(ops) if o.updates]
    unread = [o.name for o in ops if o.role == "cache" and not (o.new_rows or o.updates)]
    if unread:
        raise EmitError(f"state operands {unread} have neither new rows nor updates",
                        path="plan.operands", hint="give the kind an UPDATES rule "
                        "(compiler/plan_operands.py)")
    news = [dict(input=ops[i].name, output=ops[i].new_rows,
                 rows=literal(mem_shape(plan, ops[i].new_rows)[2]),
                 align=literal(layout.row_align(ops[i].dtype)),
                 seq="MAX_SEQ_LEN" if ops[i].shape[2] == model.max_seq_len
                 else literal(ops[i].shape[2])) for i in appended]
    updates = [_state_update(model, plan, ops[i]) for i in whole]
    outputs = [b for b in plan.memory.buffers if b.role == "output"]
    body = frame.prologue_lines(model, plan, ctxs)
    step = frame.step_begin_lines(model, plan) if plan.request.steps > 1 else []
    from megakernel.backends.pallas_tpu.codegen import stack_loop    # it reads EMITTERS

    for c in ctxs:
        step += stack_loop.stack_body(c)
    step += frame.epilogue_lines(model, plan)
    if plan.request.steps > 1:      # the step body in a loop over the call's steps
        step = (["", "def decode_step(i, carry):"] + [f"    {ln}" if ln else "" for ln in step]
                + ["    return carry", "",
                   "jax.lax.fori_loop(0, STEPS_PER_CALL, decode_step, 0)"])
    body += step
    body = [f"    {line}" if line else "" for line in body]    # the kernel function's
    scratch = declare.scratch_lines(plan)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    req, mem = plan.request, plan.memory
    return declare.wrap_source(env.get_template("kernel.py.j2").render(
        model_name=declare.comment(model.name), model_literal=literal(model.name),
        target=f"{plan.target.chip} ({plan.target.topology.name})",
        cores=plan.shard.cores, digest=plan.digest(), batch=req.batch, tokens=req.tokens,
        steps=req.steps, rows=mem.rows, rows_padded=mem.rows_padded, hidden=model.hidden_size,
        vocab_size=model.vocab_size, vocab_stride=plan.shard.vocab_stride,
        vocab_local=plan.shard.vocab_local, num_banks=mem.stream.num_banks,
        bank_shape=literal(mem.ring.shape),
        vmem_limit=int(plan.target.vmem_bytes), vmem_declared=mem.vmem_declared,
        libraries=sorted({(m, a) for c in ctxs for m, a in c.libraries.items()}),
        inputs=[dict(name=o.name, shape=literal(tuple(o.shape)), dtype=literal(o.dtype),
                     space=literal(o.space), sharded=literal(o.sharded)) for o in ops],
        outputs=[dict(name=b.ident, shape=literal(tuple(b.shape)), dtype=literal(b.dtype),
                      space=literal(b.space.value)) for b in outputs],
        new_rows=news, updates=updates,
        max_seq_len=model.max_seq_len,
        segments=declare.segment_tables(plan, ctxs),
        segment_names=declare.tuple_of([f"S{c.s}_TILES" for c in ctxs] + ["HEAD_TILES"]),
        geometry_lines=declare.geometry_lines(plan, model.max_seq_len), scratch=scratch,
        body=body,
        collective_id=0 if plan.shard.cores > 1 else None, synchronised=synchronised))
