"""Emitter of Gated DeltaNet: one call of its kernel library (gdn.py) in the
layer body, the first repetition's state fetch before the stack's loop, and
the wait on the last writes after it. Every buffer is the plan's (bound by the
BUFFERS rule); the state operands are the plan's aliased HBM caches."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.emit import EMITTERS, StackCtx, v
from megakernel.backends.pallas_tpu.gdn import STATES
from megakernel.backends.pallas_tpu.steps import STEPPING, Stepping


@EMITTERS.register("gated_deltanet")
def _gdn(c: StackCtx, n) -> list[str]:
    lib, g, bufs = c.library("gdn"), c.geometry(n.name), c.buffers(n.name)
    mem = c.plan.memory
    hbm = "(" + ", ".join(mem.buffer(f"hbm.s{c.s}.{n.name}.{p}").ident for p in STATES) + ")"
    q, k, vv, z, b, a = (v(t) for t in n.inputs)
    taps = "(" + ", ".join(c.vec(f"{n.name}.conv_{p}") for p in "qkv") + ")"
    c.before.append(f"{lib}.fetch({g}, {hbm}, 0, sync=SYNCHRONISED, {bufs})"
                    f"  # layers[{c.s}].{n.name}: repetition 0's state")
    c.after.append(f"{lib}.drain({g}, {hbm}, sync=SYNCHRONISED, {bufs})"
                   f"  # layers[{c.s}].{n.name}: the last state writes")
    return [f"{v(n.outputs[0])} = {lib}.step({g}, ({q}, {k}, {vv}), {z}, {b}, {a}, {taps}, "
            f"{c.vec(n.name + '.A_log')}, {c.vec(n.name + '.dt_bias')}, "
            f"{c.vec(n.name + '.norm')}, {hbm}, k, sync=SYNCHRONISED, {bufs}{c.stopped()})"]


STEPPING.register("gated_deltanet")(Stepping(
    True, "keeps a stopped sequence's conv history and recurrent state as fetched (its "
          "VMEM slot is not stored, so the write-back returns the old bytes)"))
