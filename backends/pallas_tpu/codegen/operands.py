"""The kernel's operands, and full weights/caches turned into them.

``operands(model, plan)`` lists every input of the pallas_call in order, with
its per-core shape, dtype, memory space and whether it is split over cores
(then the global array is the per-core arrays concatenated on axis 0, the
shard_map spec P("x")). ``pack_weights`` builds those global arrays from full
weights through ``compiler.shard.shard_weights``; ``pack_caches`` /
``unpack_caches`` convert between the reference's per-layer [B, S, Hkv, D]
caches and the kernel's per-stack [L, B, S, Hkv_local * D] ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megakernel import quantize
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.ir.graph import Model


@dataclass(frozen=True)
class Operand:
    name: str              # identifier in the generated kernel
    source: str            # weight name (layer-local for stacks), "tokens", cache name...
    shape: tuple[int, ...]  # per core
    dtype: str
    space: str             # smem | vmem | hbm
    sharded: bool
    stack: int | None = None
    role: str = "weight"   # weight | vector | ring | experts | cache | step
    element: str | None = None   # dtype carried as 32-bit words (the weight ring)
    new_rows: str | None = None  # appended state: the output identifier of its new rows
    updates: str | None = None   # whole-access state: the output identifier of its updates


def ident(text: str) -> str:
    return text.replace(".", "_").replace("-", "_")


def operands(model: Model, plan) -> list[Operand]:
    """The call's operands, as the plan lists them (``MemoryPlan.operands``)."""
    mem = plan.memory
    out = []
    for o in mem.operands:
        b = mem.buffer(o.buffer)
        rows = mem.buffer(o.new_rows).ident if o.new_rows else None
        updates = mem.buffer(o.updates).ident if o.updates else None
        out.append(Operand(b.ident, o.source, b.shape, b.dtype, b.space.value, o.sharded,
                           o.stack, o.role, o.element, rows, updates))
    return out


def to_words(array: np.ndarray) -> np.ndarray:
    """[..., K, N] -> int32 [..., K / p, N]: p = 32 / bits consecutive rows per
    word, the first in the low bits (numpy's view order, which is
    ``pltpu.bitcast``'s along the second-minor axis)."""
    a = np.ascontiguousarray(array)
    per = 4 // a.dtype.itemsize
    if per == 1:
        return a.view(np.int32)
    *lead, k, n = a.shape
    packed = a.reshape(*lead, k // per, per, n).swapaxes(-1, -2)
    return np.ascontiguousarray(packed).view(np.int32).reshape(*lead, k // per, n)


def from_words(words: np.ndarray, dtype) -> np.ndarray:
    """Inverse of ``to_words``."""
    w = np.ascontiguousarray(words, np.int32)
    *lead, kw, n = w.shape
    typed = w.view(dtype).reshape(*lead, kw, n, -1)
    per = typed.shape[-1]
    return np.ascontiguousarray(typed.swapaxes(-1, -2)).reshape(*lead, kw * per, n)


def _words(a) -> np.ndarray:
    """A ring weight as words: quantized codes in their units
    (megakernel/quantize.py), any other dtype by ``to_words``."""
    return quantize.to_words(a) if isinstance(a, quantize.Packed) else to_words(a)


def _global(per_core: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a) for a in per_core], axis=0)


def pack_weights(model: Model, plan, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Global (core-concatenated) arrays for every non-cache, non-step operand."""
    from megakernel.compiler.shard import shard_weights

    per_core = shard_weights(model, plan.shard, weights)
    n, out = plan.shard.cores, {}
    for op in operands(model, plan):
        if op.role in ("step", "cache"):
            continue
        if op.role == "constant":
            name, suffix = op.source.rsplit(".", 1)
            node = model.stacks[op.stack].layer.node(name).op
            out[op.name] = CONSTANTS(node.kind, name)(node)[suffix]
            continue
        words = _words if op.element else (lambda a: a)
        if op.stack is None:
            arrays = [words(per_core[c][op.source]).reshape(op.shape) for c in range(n)]
        else:
            ss = plan.shard.stacks[op.stack]
            arrays = [np.stack([words(per_core[c][ss.global_name(k, op.source)])
                                for k in range(ss.reps(op.source))]).reshape(op.shape)
                      for c in range(n)]
        out[op.name] = arrays[0] if not op.sharded else _global(arrays)
    return out


def _states(model: Model, plan):
    """(stack shard, state shard, full shape) of every op state of the plan."""
    for st, ss in zip(model.stacks, plan.shard.stacks):
        for s in ss.states:
            spec = st.layer.node(s.node).op.state(plan.request.batch, model.max_seq_len,
                                                  model.dtype)[s.name]
            yield ss, s, spec.shape


def _operand(plan, ss, s) -> str:
    return plan.memory.buffer(f"hbm.s{ss.stack}.{s.node}.{s.name}").ident


def pack_caches(model: Model, plan, caches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference state (``Model.cache_specs`` names, full shapes) -> operands:
    each core's slice (``StateShard.source``), zero-padded, in the kernel's
    layout, stacked over the stack's repetitions and concatenated over cores."""
    out = {}
    for ss, s, full in _states(model, plan):
        cores = []
        for c in range(plan.shard.cores):
            reps = []
            for k in range(ss.reps(s.node)):
                piece = np.asarray(caches[ss.global_name(k, f"{s.node}.{s.name}")])[
                    s.source(full, c)]
                pads = [(0, want - have) for want, have in zip(s.shape(full), piece.shape)]
                piece = np.pad(piece, pads) if any(hi for _, hi in pads) else piece
                reps.append(piece.reshape(s.layout(full)))
            cores.append(np.stack(reps))
        out[_operand(plan, ss, s)] = _global(cores)
    return out


def unpack_caches(model: Model, plan, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of ``pack_caches``; of a slice several cores hold (replicated
    kv heads), the lowest core's copy wins."""
    out = {}
    n = plan.shard.cores
    for ss, s, full in _states(model, plan):
        arr = np.asarray(packed[_operand(plan, ss, s)])
        per = arr.reshape(n, ss.reps(s.node), *arr.shape[1:])
        for k in range(ss.reps(s.node)):
            whole = np.zeros(full, arr.dtype)
            seen = np.zeros(full, bool)
            for c in range(n):
                region = s.source(full, c)
                piece = per[c, k].reshape(s.shape(full))[
                    tuple(slice(0, r.stop - r.start) for r in region)]
                fresh = ~seen[region]
                whole[region] = np.where(fresh, piece, whole[region])
                seen[region] = True
            out[ss.global_name(k, f"{s.node}.{s.name}")] = whole
    return out


def step_inputs(plan, tokens: np.ndarray, start_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tokens [B, T] -> flat [rows] int32; start_pos [B] int32."""
    return (np.asarray(tokens, np.int32).reshape(-1),
            np.asarray(start_pos, np.int32).reshape(-1))


def logits_from(plan, logits: np.ndarray, batch: int, tokens: int) -> np.ndarray:
    """Kernel logits [N * rows_padded, V_local] -> [B, T, V]."""
    n, rp, rows = plan.shard.cores, plan.memory.rows_padded, plan.memory.rows
    per = np.asarray(logits).reshape(n, rp, -1)
    parts = [per[c, :rows, :plan.shard.vocab_valid(c)] for c in range(n)]
    return np.concatenate(parts, axis=-1).reshape(batch, tokens, -1)

