"""Emitters of the elementwise kinds: one line of JAX each, on values.

They read nothing of the stack but their own node, so the LM head's logit ops
(``Model.logit_ops``) are emitted by the same rules (frame.py).
"""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, v


@EMITTERS.register("mul")
def _mul(c, n) -> list[str]:
    a, b = (v(t) for t in n.inputs)
    return [f"{v(n.outputs[0])} = {a} * {b}"]


@EMITTERS.register("activation")
def _activation(c, n) -> list[str]:
    return [f"{v(n.outputs[0])} = rt.activation({literal(n.op.fn.value)}, {v(n.inputs[0])})"]


@EMITTERS.register("scale")
def _scale(c, n) -> list[str]:
    return [f"{v(n.outputs[0])} = {v(n.inputs[0])} * {literal(n.op.factor)}"]


@EMITTERS.register("softcap")
def _softcap(c, n) -> list[str]:
    return [f"{v(n.outputs[0])} = rt.softcap({v(n.inputs[0])}, {literal(n.op.cap)})"]


@EMITTERS.register("channel_scale")
def _channel_scale(c, n) -> list[str]:
    w = c.vec(n.name + ".weight")
    return [f"{v(n.outputs[0])} = {v(n.inputs[0])} * ({w} + 1.0)" if n.op.offset
            else f"{v(n.outputs[0])} = {v(n.inputs[0])} * {w}"]
