"""The oracle: a plain-JAX decode step for any IR model (no Pallas).

It walks the layer graph op by op through one function per op kind (each
kind's registered in ``REFERENCE`` by its models/kind_*.py, from the
primitives here: matmul, activation, rmsnorm, rope, the gated FFN), written
as close to the published equations as possible. Tokens are flattened to rows
``n = b * T + t``; activations are f32; matmuls read weights in their storage
dtype with f32 accumulation. The same function prefills (T = prompt length,
start 0) and decodes (T new tokens at per-sequence start positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from megakernel import activations
from megakernel.quantize import Packed, decode_np, dequantize_packed
from megakernel.ir.graph import Model, OpNode
from megakernel.ir.ops import Activation
from megakernel.registry import Registry

Array = jax.Array


@dataclass
class _Ctx:
    """What an op sees besides its inputs: positions, and the layer's caches."""

    batch: int
    tokens: int
    positions: Array              # [B, T] int32
    caches: dict[str, Array]      # read and written by attention ops
    prefix: str                   # "layers.{i}."
    margins: list | None = None   # decode_step_margins' probe: each MoE op's [n] margins


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class ScaledCodes:
    """A weight the MXU takes as codes scaled after the dot (``Format.mxu``
    "fp8", or "scaled": int8, one group of all K inputs): code
    values [..., K, N] (f32, exact) and f32 scales [..., K/g, N] of groups of g
    inputs; ``dtype`` is the model dtype x is cast to. ``matmul`` computes
    sum_g (x_g @ codes_g) * scales_g, what the kernel's dot per group does."""

    codes: Array
    scales: Array
    dtype: str

    def tree_flatten(self):
        return (self.codes, self.scales), self.dtype

    @classmethod
    def tree_unflatten(cls, dtype, leaves):
        return cls(*leaves, dtype)


def matmul(x: Array, w) -> Array:
    """x @ w in w's dtype with f32 accumulation (what the MXU does)."""
    if isinstance(w, ScaledCodes):
        # One dot per group in the model dtype (the code values are exact in
        # bf16), f32 products and sums, in the kernel's group order. (x rounded
        # to bf16 and widened back to f32 would be simplified away under jit:
        # XLA allows excess precision.)
        k, groups = w.codes.shape[-2], w.scales.shape[-2]
        g, xs, codes = k // groups, x.astype(w.dtype), w.codes.astype(w.dtype)
        out = None
        for i in range(groups):
            part = jnp.dot(xs[:, i * g:(i + 1) * g], codes[i * g:(i + 1) * g],
                           preferred_element_type=jnp.float32,
                           precision=jax.lax.Precision.HIGHEST) * w.scales[i].astype(jnp.float32)
            out = part if out is None else out + part
        return out
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32,
                   precision=jax.lax.Precision.HIGHEST)


def activation(kind: Activation, x: Array) -> Array:
    return activations.apply(kind, x)


def rmsnorm(op, p, x):
    """x / rms(x) per group of op.dim features, times (1 +) w unless parameter-free."""
    n, f = x.shape
    g = x.reshape(n, f // op.dim, op.dim)
    g = g * jax.lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + op.eps)
    if op.weight:
        g = g * (p["weight"].astype(jnp.float32) + (1.0 if op.offset else 0.0))
    return g.reshape(n, f)


def linear(op, p, x):
    y = matmul(x, p["weight"])
    return y + p["bias"].astype(jnp.float32) if op.bias else y


def rope(op, x, positions):
    """Rotate-half RoPE on the first rotary_dim features of every head."""
    n = x.shape[0]
    h = x.reshape(n, op.num_heads, op.head_dim)
    half = op.rotary_dim // 2
    inv_freq = jnp.asarray(op.inv_freq(), jnp.float32)
    angle = positions.reshape(n, 1).astype(jnp.float32) * inv_freq[None, :]   # [n, half]
    factor = op.attention_factor()         # YaRN scales cos and sin alike
    cos, sin = jnp.cos(angle)[:, None, :] * factor, jnp.sin(angle)[:, None, :] * factor
    x1, x2, rest = h[..., :half], h[..., half:op.rotary_dim], h[..., op.rotary_dim:]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    return rotated.reshape(n, -1)


def gated_ffn(act, x, gate, up, down):
    return matmul(activation(act, matmul(x, gate)) * matmul(x, up), down)


# One rule per op kind: (node, params, inputs, ctx) -> output.
REFERENCE: Registry[Callable[[OpNode, dict, list, _Ctx], Array]] = Registry(
    "reference", "models/kind_*.py (linear, add: models/reference.py)")
REFERENCE.register("linear")(lambda n, p, xs, ctx: linear(n.op, p, xs[0]))

# How far a bf16 all-reduce wire may move a model's logits and state from the
# reference (relative to 1 + the largest reference value), for kinds whose
# numerics amplify the wire's rounding beyond the attention models' measured
# bound (backends/pallas_tpu/check/against_reference.py, WIRE_TOL): op kind ->
# that bound, registered with the kind's reference function from what was
# measured. A model's check takes the largest bound of its kinds.
WIRE_TOLERANCE: Registry[float] = Registry("bf16-wire tolerance", "models/kind_*.py",
                                           per_op_kind=False)
REFERENCE.register("add")(lambda n, p, xs, ctx: xs[0] + xs[1])


def init_caches(model: Model, batch: int) -> dict[str, Array]:
    """Zeroed KV caches, named as ``Model.cache_specs``."""
    return {name: jnp.zeros(spec.shape, spec.dtype.jnp)
            for name, spec in model.cache_specs(batch).items()}


def final_hidden(model: Model, weights, tokens, start_pos, caches, margins: list | None = None,
                 rules: dict | None = None):
    """Run embedding and every layer; returns (normed hidden [n, H], caches).
    ``margins`` collects every MoE op's routing margins (``decode_step_margins``);
    ``rules`` (op kind -> rule) replaces ``REFERENCE``'s rule of those kinds (the
    XLA baseline's routed MoE, bench/xla_step.py)."""
    b, t = tokens.shape
    positions = start_pos[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)[None, :]
    caches = dict(caches)
    x = jnp.take(weights["embed.weight"], tokens.reshape(-1), axis=0).astype(jnp.float32)
    x = _apply_ops(model.embed_ops, "embed_ops", x)
    for i, layer in enumerate(model.layers):
        ctx = _Ctx(b, t, positions, caches, f"layers.{i}.", margins)
        env = {layer.input: x}
        for node in layer.nodes:
            params = {k.split(".")[-1]: weights[f"layers.{i}.{k}"]
                      for k in layer.params(model.dtype) if k.startswith(node.name + ".")}
            rule = (rules or {}).get(node.op.kind) or REFERENCE(node.op.kind,
                                                                 f"layers[{i}].{node.name}")
            out = rule(node, params, [env[n] for n in node.inputs], ctx)
            # an op of several outputs returns one array each (a per-slot MoE)
            env.update(zip(node.outputs, out) if len(node.outputs) > 1 else
                       ((node.outputs[0], out),))
        x = env[layer.output]
    x = rmsnorm(model.final_norm, {"weight": weights["final_norm.weight"]}, x)
    return x, caches


def lm_head(model: Model, weights) -> Array:
    """The LM head as [H, V]."""
    return weights["embed.weight"].T if model.tie_embeddings else weights["lm_head.weight"]


def decode_step(model: Model, weights, tokens, start_pos, caches, margins: list | None = None,
                rules: dict | None = None):
    """tokens [B, T] int32 at positions start_pos[b] + t -> (logits [B, T, V] f32, caches).
    ``margins`` collects every MoE op's routing margins (``decode_step_margins``);
    ``rules`` as in ``final_hidden``."""
    b, t = tokens.shape
    x, caches = final_hidden(model, weights, tokens, start_pos, caches, margins, rules)
    logits = _apply_ops(model.logit_ops, "logit_ops", matmul(x, lm_head(model, weights)))
    if model.vocab_used is not None:      # padding ids: never chosen, probability 0
        used = jnp.arange(model.vocab_size) < model.vocab_used
        logits = jnp.where(used[None, :], logits, -jnp.inf)
    return logits.reshape(b, t, model.vocab_size), caches


def _apply_ops(ops, where: str, x):
    """The model-level elementwise ops (``Model.embed_ops`` / ``logit_ops``) on x."""
    for i, op in enumerate(ops):
        node = OpNode(f"{where}{i}", op, ("x",), ("out",))
        x = REFERENCE(op.kind, f"{where}.{i}")(node, {}, [x], None)
    return x


decode_step_jit = jax.jit(decode_step, static_argnums=0)


def decode_step_margins(model: Model, weights, tokens, start_pos, caches):
    """``decode_step`` -> (logits, caches, margins [B]): the same one pass,
    plus the smallest routing margin of each sequence in this step, over every
    MoE op and token (inf for a model without routing). A margin is the gap
    between the last chosen and the first unchosen selection score (and between
    the last chosen and first unchosen expert group, for grouped routing): the
    rounding a kernel may differ by to choose other experts."""
    margins: list = []
    logits, caches = decode_step(model, weights, tokens, start_pos, caches, margins)
    b = tokens.shape[0]
    if not margins:
        return logits, caches, jnp.full((b,), jnp.inf, jnp.float32)
    return logits, caches, jnp.min(jnp.stack([m.reshape(b, -1).min(-1) for m in margins]),
                                   axis=0)


decode_step_margins_jit = jax.jit(decode_step_margins, static_argnums=0)


def as_jax(weights: dict[str, np.ndarray]) -> dict:
    """Host weights as jax arrays; a quantized weight (``quantize.Packed``) is
    dequantised by the kernel's own arithmetic (``quantize.dequantize``), or,
    if the MXU takes its codes as they are, kept as ``ScaledCodes``."""
    def one(v):
        if not isinstance(v, Packed):
            return jnp.asarray(v)
        if v.fmt.mxu in ("fp8", "scaled"):   # code values (e4m3, e2m1, int4, int8): exact
            return ScaledCodes(jnp.asarray(decode_np(v)), jnp.asarray(v.scales, jnp.float32),
                               v.dtype)
        return dequantize_packed(v)
    return {k: one(v) for k, v in weights.items()}
