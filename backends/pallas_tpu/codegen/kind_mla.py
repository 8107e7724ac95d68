"""Emitter of multi-head latent attention: W_UK and W_UV from the ring into
the library's buffers, then the kernel library's ``attend``
(backends/pallas_tpu/kernels/mla.py) with the plan's buffers, the latent cache
operand and the rope table, then the next repetition's ``prefetch``; the
first repetition's before the stack's loop, ``drain`` after it."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.kernels import mla  # noqa: F401 - registers MLAGeometry for plan.json
from megakernel.backends.pallas_tpu.codegen import declare
from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v


LIBRARIES.register("mla")("mla_lib")


@EMITTERS.register("mla")
def _mla(c: StackCtx, n) -> list[str]:
    op, mem = n.op, c.plan.memory
    q, kv = v(n.inputs[0]), v(n.inputs[1])
    gate = v(n.inputs[2]) if op.output_gate else "None"
    table = f"{declare.ref(c.plan, f's{c.s}.{n.name}.inv_freq')}[...]" if op.rope else "None"
    lines = []
    expanded = mem.geometry_of(c.s, n.name).geometry.form == "expanded"
    for part in ("w_uk", "w_uv"):         # stream order: W_UK, then W_UV, into their buffers
        first, count = c.tiles_of(f"{n.name}.{part}")
        flip = ", transpose=True" if expanded and part == "w_uk" else ""   # mla.buffers
        lines.append(f"rt.ring_to_ref(stream, {literal(c.s)}, k, "
                     f"S{c.s}_TILES.tiles[{first}:{first + count}], first={literal(first)}, "
                     f"dst={declare.bundle_name(n.name)}.{part}{flip})")
    lib = c.library("mla")
    # The first latent window and tile of a repetition are started a layer ahead.
    state, prefetch = c.ahead(lib, n.name, ["latent"], "latent tile")
    lines += [f"{v(n.outputs[0])} = {lib}.attend({c.geometry(n.name)}, {q}, {kv}, {gate}, "
              f"{c.vec(n.name + '.kv_norm')}, {table}, pos, {state}{c.stopped()})"]
    return lines + ([prefetch] if prefetch else [])

