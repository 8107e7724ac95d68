"""Model the copies XLA adds around one kernel call, from the plan's buffers.

After ``xla_copies``: the whole arrays, per core, that XLA copies around one
call of the kernel (each copy reads and writes them), as ``megakernel aot``
lists them (``AotResult.copies``); the cost model charges them once per call.
The rules are what the compiled HLO shows (libtpu 0.0.51, TPU7x AOT; tiny-dense
on 2 cores, tiny-moe on 4, qwen3-8b on 4, docs/verification.md):

- on 2 or more cores the kernel does remote DMAs, and XLA copies every output
  that leaves the jit out of the custom call's buffer (``next_token``) and
  every aliased operand in. No state is aliased: appended and whole-access
  state are read only, and the call's new rows / updates feed the in-place
  commit inside the jit (backends/pallas_tpu/kernels/appended_state.py, state_commit.py), so
  neither they nor the state are copied (a state operand without either
  would be copied in and out);
- one-element SMEM step operands (a batch of 1's token id and position, the
  end id) are copied (XLA lays a one-element array out otherwise).

The operands are laid out as the kernel takes them (``make_step(...,
auto_layouts=True)``, as ``megakernel aot`` compiles it; a TPU runner puts its
arrays in the compiled ``input_formats``): with XLA's default layouts it would
also relay out every 16-bit per-layer vector ``[L > 1, 1, n]`` and 32-bit
arrays of several rows narrower than 128 lanes on every call.
"""

from __future__ import annotations

import math

from megakernel.compiler.buffers import Space
from megakernel.compiler.layout import itemsize


def xla_copies(memory, cores: int) -> tuple[tuple[str, int], ...]:
    """(buffer name, bytes per core) of every copy around one call."""
    out, buffers = [], {b.name: b for b in memory.buffers}    # one pass: planning calls it often
    for o in memory.operands:
        b = buffers[o.buffer]
        nbytes = math.prod(b.shape) * itemsize(b.dtype)
        if b.space == Space.SMEM and math.prod(b.shape) == 1:
            out.append((b.name, nbytes))
        elif o.role == "cache" and not (o.new_rows or o.updates) and cores > 1:
            out.append((b.name, 2 * nbytes))             # copied in, and out as the output
    if cores > 1:
        b = buffers["next_token"]
        out.append((b.name, math.prod(b.shape) * itemsize(b.dtype)))
    return tuple(out)


def copy_bytes(memory, cores: int) -> int:
    """Bytes per core XLA copies around one call (``xla_copies`` summed)."""
    return sum(n for _, n in xla_copies(memory, cores))
