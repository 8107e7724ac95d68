"""Emit a stack's loops: the source lines of one stack's layer loop.

A stack is one ``fori_loop`` over its repetitions. A body without repeated
layers (a uniform stack's one layer, or alternating layers) is emitted as
one layer body: its vectors' double buffers, then each node's emitter
(``emit.EMITTERS``), the residual read at the start and written at the end.
A body with runs of equal layers (``ir.graph.Stack.runs``) runs each run
in turn inside the repetition: a run of several layers as an inner
``fori_loop`` over them (its code once), a run of one inline. Inside a run,
``k`` is the run-layer index ``rep * layers + r`` by which the run's weights,
vectors and state are indexed, as a uniform stack's are by its repetition.
"""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen import declare
from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emitters import EMITTERS, v
from megakernel.compiler.plan_buffers import VECTORS

# ``c`` is emit.StackCtx: emit.render calls this module, so it is not imported
# back (annotations are strings under ``from __future__ import annotations``).


def _vectors(c: StackCtx, names, var: str, first: int = 0) -> str:
    """The ``rt.Vectors`` of vectors ``names`` of the stack, as ``var``."""
    mem = c.plan.memory
    hbm = declare.tuple_of(c.hbm(p) for p in names)
    bound = mem.bound(c.s, VECTORS)
    bufs = declare.tuple_of(declare.ref(c.plan, bound[p]) for p in names)
    at = f", first={literal(first)}" if first else ""
    return (f"{var} = rt.Vectors({hbm}, {bufs}, {declare.ref(c.plan, 'vec.sems')}, "
            f"sync=SYNCHRONISED{at})")


def _vector_lines(vec: str, count: int) -> list[str]:
    """Run-layer ``k``'s vectors waited for, and the next layer's fetched
    (none when the loop runs once)."""
    lines = [f"{vec}.wait(k)", ""]
    if count > 1:
        lines += [f"@pl.when(k + 1 < {literal(count)})", "def _():", f"    {vec}.start(k + 1)", ""]
    return lines


def _layer_lines(c: StackCtx, nodes, vec: str, count: int) -> list[str]:
    """A layer's lines at run-layer index ``k`` of ``count``: its vectors'
    (``_vector_lines``), then each node's emitter."""
    return _vector_lines(vec, count) + _node_lines(c, nodes)


def _node_lines(c: StackCtx, nodes) -> list[str]:
    lines = []
    for n in nodes:
        emitter = EMITTERS(n.op.kind, f"layers[{c.s}].{n.name}")
        lines.append(f"# node: layers[{c.s}].{n.name}")
        lines += emitter(c, n) + c.reduce(n.name, n.outputs[0])
    return lines


def residual(c: StackCtx) -> str:
    """The residual stream's ref, read at the start of a layer and written at its end."""
    return f"{declare.ref(c.plan, 'residual')}[...]"


def _header(c: StackCtx) -> str:
    body = f", a body of {c.shard.period} layers" if c.shard.period > 1 else ""
    return (f"# ---- stack {c.s}: layers {c.shard.start}..{c.shard.start + c.shard.layers - 1} "
            f"({declare.comment(c.layer.kind)}{body}) ----")


def stack_body(c: StackCtx) -> list[str]:
    """The source lines of stack ``c``: its vectors' double buffers, the
    lines its emitters need before the loop, the loop, the lines after it."""
    if c.shard.runs:
        return _run_stack_body(c)
    s, count = c.s, c.shard.count
    lines = [_header(c), _vectors(c, c.vectors, f"vec_s{s}"),
             f"vec_s{s}.start(0)", "__BEFORE__", f"def layer_s{s}(k, carry):",
             f"    {v(c.layer.input)} = {residual(c)}"]
    # the residual read after the vectors' lines, as before runs
    lines[-1:-1] = [f"    {ln}" if ln else "" for ln in _vector_lines(f"vec_s{s}", count)]
    lines += [f"    {ln}" for ln in _node_lines(c, c.layer.nodes)]
    lines += [f"    {residual(c)} = {v(c.layer.output)}", "    return carry", "",
              f"jax.lax.fori_loop(0, {literal(count)}, layer_s{s}, 0)", *c.after, ""]
    at = lines.index("__BEFORE__")
    return lines[:at] + c.before + [""] + lines[at + 1:]


def _run_stack_body(c: StackCtx) -> list[str]:
    """A stack whose body repeats layers: the loop over repetitions ``rep``
    runs each run of the body in turn; a run of several layers is an inner
    ``fori_loop`` over its layers (its code once), a run of one is inline.
    Inside a run, ``k`` is the run-layer index rep * layers + r, by which its
    weights, vectors and state are indexed; each run has its own vectors'
    double buffers (and semaphores), and reads and writes the residual."""
    s = c.s
    runs = []
    first_sem = 0
    head = [_header(c)]
    for first, n in c.shard.runs:
        prefix = f"l{first}_"
        nodes = [nd for nd in c.layer.nodes if nd.name.startswith(prefix)]
        names = [p for p in c.vectors if p.startswith(prefix)]
        var = f"vec_s{s}_l{first}"
        head += [_vectors(c, names, var, first_sem), f"{var}.start(0)"]
        first_sem += len(names)
        runs.append((first, n, nodes, names, var))
    lines = [f"def layer_s{s}(rep, carry):"]
    for first, n, nodes, names, var in runs:
        every = c.vectors
        c.count, c.vec_of, c.vectors = c.shard.count * n, var, names
        inp, out = _run_io(c, nodes)
        body = [f"{inp} = {residual(c)}"] + _layer_lines(c, nodes, var, c.count) + [
            f"{residual(c)} = {out}"]
        c.vectors = every
        where = f"layers {first}..{first + n - 1} of the body" if n > 1 else \
            f"layer {first} of the body"
        if n > 1:
            lines += [f"    def run_s{s}_l{first}(r, carry):  # {where}",
                      f"        k = rep * {literal(n)} + r"]
            lines += [f"        {ln}" if ln else "" for ln in body]
            lines += ["        return carry", "",
                      f"    jax.lax.fori_loop(0, {literal(n)}, run_s{s}_l{first}, 0)"]
        else:
            lines += [f"    k = rep  # {where}"]
            lines += [f"    {ln}" if ln else "" for ln in body]
        lines.append("")
    c.count, c.vec_of = c.shard.count, f"vec_s{s}"
    lines[-1:] = ["    return carry", "",
                  f"jax.lax.fori_loop(0, {literal(c.shard.count)}, layer_s{s}, 0)", *c.after, ""]
    return head + c.before + [""] + lines


def _run_io(c: StackCtx, nodes) -> tuple[str, str]:
    """(input, output) variables of a run's layer in the merged body: its
    first node's tensor read from outside the run, and its last output."""
    made = {t for nd in nodes for t in nd.outputs}
    ins = [t for nd in nodes for t in nd.inputs if t not in made]
    return v(ins[0]), v(nodes[-1].outputs[0])
