"""Emitter of Gated DeltaNet: one call of its kernel library (gdn.py) in the
layer body, the first repetition's state fetch before the stack's loop, and
the wait on the last update stores after it. Every buffer is the plan's (bound
by the BUFFERS rule); the state operands are the plan's read-only HBM states,
and the update outputs the plan's ``new.<state>``, which the jitted step
commits after the call (``COMMITS``: backends/pallas_tpu/kernels/state_commit.py)."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.kernels.state_commit import COMMITS
from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, ref
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v
from megakernel.backends.pallas_tpu.kernels.gdn import STATES


LIBRARIES.register("gdn")("gdn_lib")


@EMITTERS.register("gated_deltanet")
def _gdn(c: StackCtx, n) -> list[str]:
    lib, g, bufs = c.library("gdn"), c.geometry(n.name), c.buffers(n.name)
    hbm = "(" + ", ".join(ref(c.plan, f"hbm.s{c.s}.{n.name}.{p}") for p in STATES) + ")"
    out = "(" + ", ".join(ref(c.plan, f"new.s{c.s}.{n.name}.{p}") for p in STATES) + ")"
    step = "i" if c.multistep else "0"      # the step index of a multi-step call
    q, k, vv, z, b, a = (v(t) for t in n.inputs)
    taps = "(" + ", ".join(c.vec(f"{n.name}.conv_{p}") for p in "qkv") + ")"
    c.before.append(f"{lib}.fetch({g}, {hbm}, {out}, 0, {step}, {bufs}, sync=APPENDED_SYNC)"
                    f"  # layers[{c.s}].{n.name}: repetition 0's state")
    c.after.append(f"{lib}.drain({g}, {out}, {bufs}, sync=APPENDED_SYNC)"
                   f"  # layers[{c.s}].{n.name}: the last update stores")
    return [f"{v(n.outputs[0])} = {lib}.step({g}, ({q}, {k}, {vv}), {z}, {b}, {a}, {taps}, "
            f"{c.vec(n.name + '.A_log')}, {c.vec(n.name + '.dt_bias')}, "
            f"{c.vec(n.name + '.norm')}, {hbm}, {out}, k, {step}, {bufs}, sync=APPENDED_SYNC)"]


@COMMITS.register("gated_deltanet")
def _commit(g, state: str):
    """Conv histories take the new rows; the recurrent state its low-rank update."""
    if state == "recurrent":
        return "low_rank", dict(tokens=g.tokens, key_dim=g.key_dim, value_dim=g.value_dim)
    return "shift_rows", dict(tokens=g.tokens)

