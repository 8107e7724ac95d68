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


def ident(text: str) -> str:
    return text.replace(".", "_").replace("-", "_")


def operands(model: Model, plan) -> list[Operand]:
    """The call's operands, as the plan lists them (``MemoryPlan.operands``)."""
    mem = plan.memory
    out = []
    for o in mem.operands:
        b = mem.buffer(o.buffer)
        out.append(Operand(b.ident, o.source, b.shape, b.dtype, b.space.value, o.sharded,
                           o.stack, o.role))
    return out


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
        if op.stack is None:
            arrays = [per_core[c][op.source].reshape(op.shape) for c in range(n)]
        else:
            ss = plan.shard.stacks[op.stack]
            arrays = [np.stack([per_core[c][f"layers.{i}.{op.source}"]
                                for i in range(ss.start, ss.start + ss.count)]).reshape(op.shape)
                      for c in range(n)]
        out[op.name] = arrays[0] if not op.sharded else _global(arrays)
    return out


def _kv_columns(plan, stack: int, node: str, core: int, head_dim: int) -> list[int]:
    """Full-cache kv head indices held by ``core``: the attention rule splits kv
    heads over the cores, or gives each of ``rep`` neighbouring cores one."""
    _, _, kv_l, rep = next(h for h in plan.shard.stacks[stack].heads if h[0] == node)
    first = core * kv_l if rep == 1 else core // rep
    return list(range(first, first + kv_l))


def pack_caches(model: Model, plan, caches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference caches (``layers.{i}.{node}.k|v`` [B, S, Hkv, D]) -> operands."""
    out = {}
    for kv in plan.memory.kv:
        ss = plan.shard.stacks[kv.stack]
        for part in ("k", "v"):
            cores = []
            for c in range(plan.shard.cores):
                layers = []
                for i in range(ss.start, ss.start + ss.count):
                    full = np.asarray(caches[f"layers.{i}.{kv.node}.{part}"])
                    d = full.shape[-1]
                    heads = _kv_columns(plan, kv.stack, kv.node, c, d)
                    loc = full[:, :, heads, :].reshape(full.shape[0], full.shape[1], -1)
                    pad = kv.width - loc.shape[-1]
                    layers.append(np.pad(loc, ((0, 0), (0, 0), (0, pad))) if pad else loc)
                cores.append(np.stack(layers))
            out[f"s{kv.stack}_{kv.node}_{part}_cache"] = _global(cores)
    return out


def unpack_caches(model: Model, plan, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of ``pack_caches`` (core 0's copy of replicated kv heads wins)."""
    out = {}
    n = plan.shard.cores
    for kv in plan.memory.kv:
        ss = plan.shard.stacks[kv.stack]
        node = model.layers[ss.start].node(kv.node).op
        d, hkv = node.head_dim, node.num_kv_heads
        for part in ("k", "v"):
            arr = np.asarray(packed[f"s{kv.stack}_{kv.node}_{part}_cache"])
            per = arr.reshape(n, ss.count, *arr.shape[1:])
            for li, i in enumerate(range(ss.start, ss.start + ss.count)):
                b, s = per.shape[2], per.shape[3]
                full = np.zeros((b, s, hkv, d), arr.dtype)
                done = set()
                for c in range(n):
                    heads = _kv_columns(plan, kv.stack, kv.node, c, d)
                    loc = per[c, li].reshape(b, s, -1, d)
                    for hi, hh in enumerate(heads):
                        if hh not in done and hh < hkv:
                            full[:, :, hh, :] = loc[:, :, hi, :]
                            done.add(hh)
                out[f"layers.{i}.{kv.node}.{part}"] = full
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

