"""Emitters of rotary embedding (``rt.rope`` with the plan's inverse-frequency
table) and attention: one call of its kernel library's ``attend``
(backends/pallas_tpu/kernels/attention.py) with the plan's geometry and
buffers, the first window and KV tile of a repetition started a layer ahead
(``StackCtx.ahead``)."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen import declare
from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v

LIBRARIES.register("attention")("attn_lib")


@EMITTERS.register("rope")
def _rope(c: StackCtx, n) -> list[str]:
    op = n.op
    heads = c.shard.width(n.inputs[0]) // op.head_dim
    table = declare.ref(c.plan, f"s{c.s}.{n.name}.inv_freq")
    factor = op.attention_factor()
    extra = f", factor={literal(factor)}" if factor != 1.0 else ""
    return [f"{v(n.outputs[0])} = rt.rope({v(n.inputs[0])}, pos, {table}[...], "
            f"heads={literal(heads)}, head_dim={literal(op.head_dim)}, "
            f"rotary_dim={literal(op.rotary_dim)}{extra})"]


@EMITTERS.register("attention")
def _attention(c: StackCtx, n) -> list[str]:
    q, kk, vv = (v(t) for t in n.inputs)
    lib = c.library("attention")
    sinks = f", sinks={c.vec(n.name + '.sinks')}" if n.op.sinks else ""
    # The first window and KV tile of a repetition are started a layer ahead.
    state, prefetch = c.ahead(lib, n.name, "kv", "KV tile")
    return [f"{v(n.outputs[0])} = {lib}.attend({c.geometry(n.name)}, {q}, {kk}, {vv}, {state}"
            f"{sinks}{c.stopped()})"] + ([prefetch] if prefetch else [])
