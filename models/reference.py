"""The oracle: a plain-JAX decode step for any IR model (no Pallas).

It walks the layer graph op by op through one function per op kind, written
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
from megakernel.ir.ops import Activation, Scoring
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
    """A weight the MXU takes as float8 codes (``Format.mxu == "fp8"``): code
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
    n, f = x.shape
    g = x.reshape(n, f // op.dim, op.dim)
    g = g * jax.lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + op.eps)
    scale = p["weight"].astype(jnp.float32) + (1.0 if op.offset else 0.0)
    return (g * scale).reshape(n, f)


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


def attention(op, q, k, v, ctx: _Ctx, name: str, p=None):
    """Write the T new k/v rows into the cache, then causal GQA over the cache
    (scores soft-capped before the mask, and a sink logit per head in the
    softmax denominator, when the op says so)."""
    b, t, d = ctx.batch, ctx.tokens, op.head_dim
    kname, vname = f"{ctx.prefix}{name}.k", f"{ctx.prefix}{name}.v"
    k_cache, v_cache = ctx.caches[kname], ctx.caches[vname]
    start = ctx.positions[:, 0]

    def write(cache, new):
        new = new.reshape(b, t, op.num_kv_heads, d).astype(cache.dtype)
        return jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (s, 0, 0)))(
            cache, new, start)

    k_cache, v_cache = write(k_cache, k), write(v_cache, v)
    ctx.caches[kname], ctx.caches[vname] = k_cache, v_cache

    s = k_cache.shape[1]
    qh = q.reshape(b, t, op.num_kv_heads, op.group_size, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qh, k_cache.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * op.softmax_scale
    if op.logit_softcap is not None:
        scores = activations.softcap(scores, op.logit_softcap)
    key_pos = jnp.arange(s)[None, None, :]                 # [1, 1, S]
    query_pos = ctx.positions[:, :, None]                  # [B, T, 1]
    visible = key_pos <= query_pos
    if op.sliding_window is not None:
        visible &= key_pos > query_pos - op.sliding_window
    scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
    if op.sinks:
        # One more column per head: the sink's logit, which has no value row.
        sink = p["sinks"].astype(jnp.float32).reshape(op.num_kv_heads, op.group_size)
        sink = jnp.broadcast_to(sink[None, :, :, None, None], (*scores.shape[:-1], 1))
        probs = jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
    else:
        probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
    return out.reshape(b * t, op.num_q_heads * d)


def gated_ffn(act, x, gate, up, down):
    return matmul(activation(act, matmul(x, gate)) * matmul(x, up), down)


def expert_ffn(op, x, gate, up, down, bg=None, bu=None, bd=None):
    """One routed expert: a gated FFN with optional biases and, with
    ``swiglu_limit``, gpt-oss's clamped SwiGLU."""
    g, u = matmul(x, gate), matmul(x, up)
    if bg is not None:
        g, u = g + bg.astype(jnp.float32), u + bu.astype(jnp.float32)
    if op.swiglu_limit is None:
        h = activation(op.activation, g) * u
    else:
        h = activations.clamped_swiglu(g, u, op.swiglu_limit, op.swiglu_alpha)
    y = matmul(h, down)
    return y + bd.astype(jnp.float32) if bd is not None else y


def mlp(op, p, x):
    if op.gated:
        return gated_ffn(op.activation, x, p["gate"], p["up"], p["down"])
    return matmul(activation(op.activation, matmul(x, p["up"])), p["down"])


def route(op, p, x, margins: list | None = None) -> tuple[Array, Array]:
    """Router: (expert ids [n, k], combine weights [n, k]) for every row.
    ``margins`` collects each row's routing margin (``selection_margin``)."""
    logits = matmul(x, p["router"])
    if op.router_logit_bias:
        logits = logits + p["router_logit_bias"].astype(jnp.float32)
    scores = jax.nn.softmax(logits, -1) if op.scoring == Scoring.SOFTMAX else jax.nn.sigmoid(logits)
    select = scores + p["router_bias"].astype(jnp.float32) if op.correction_bias else scores
    if op.n_group > 1:
        # DeepSeek-V3: a group scores the sum of its two best selection scores;
        # experts outside the topk_group best groups cannot be picked.
        n = x.shape[0]
        groups = select.reshape(n, op.n_group, op.num_experts // op.n_group)
        group_score = jnp.sum(jax.lax.top_k(groups, 2)[0], axis=-1)         # [n, G]
        _, best = jax.lax.top_k(group_score, op.topk_group)
        keep = jnp.zeros((n, op.n_group), bool).at[jnp.arange(n)[:, None], best].set(True)
        select = jnp.where(keep[:, :, None], groups, -jnp.inf).reshape(n, op.num_experts)
        if margins is not None:
            margins.append(selection_margin(group_score, op.topk_group))
    if margins is not None:
        margins.append(selection_margin(select, op.top_k))
    _, ids = jax.lax.top_k(select, op.top_k)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if op.renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids, weights * op.routed_scaling


def selection_margin(select: Array, k: int) -> Array:
    """[n]: how far each row's k-th best score is above its (k+1)-th, i.e. how
    much rounding it takes to pick another set (inf when nothing is left out)."""
    if k >= select.shape[-1]:
        return jnp.full(select.shape[:-1], jnp.inf, jnp.float32)
    best = jax.lax.top_k(select, k + 1)[0]
    return jnp.where(jnp.isfinite(best[:, k]), best[:, k - 1] - best[:, k], jnp.inf)


def moe(op, p, x, margins: list | None = None):
    """Every expert on every row, combined with the router's weights (zero for
    unselected experts): slow, and obviously equal to the routed sum."""
    ids, weights = route(op, p, x, margins)
    combine = jnp.zeros((x.shape[0], op.num_experts), jnp.float32)
    combine = combine.at[jnp.arange(x.shape[0])[:, None], ids].add(weights)
    weights = [p["experts_gate"], p["experts_up"], p["experts_down"]]
    if op.expert_bias:
        weights += [p["experts_gate_bias"], p["experts_up_bias"], p["experts_down_bias"]]
    per_expert = jax.vmap(lambda *w: expert_ffn(op, x, *w))(*weights)      # [E, n, H]
    out = jnp.einsum("ne,enh->nh", combine, per_expert, precision=jax.lax.Precision.HIGHEST)
    if op.num_shared_experts:
        shared = gated_ffn(op.activation, x, p["shared_gate"], p["shared_up"], p["shared_down"])
        if op.shared_expert_gate:       # Qwen3-Next: sigmoid(x . w) per token
            shared = shared * jax.nn.sigmoid(matmul(x, p["shared_expert_gate"][:, None]))
        out = out + shared
    return out


# One rule per op kind: (node, params, inputs, ctx) -> output.
REFERENCE: Registry[Callable[[OpNode, dict, list, _Ctx], Array]] = Registry(
    "reference", "models/reference.py")
REFERENCE.register("rmsnorm")(lambda n, p, xs, ctx: rmsnorm(n.op, p, xs[0]))
REFERENCE.register("linear")(lambda n, p, xs, ctx: linear(n.op, p, xs[0]))
REFERENCE.register("rope")(lambda n, p, xs, ctx: rope(n.op, xs[0], ctx.positions))
REFERENCE.register("attention")(lambda n, p, xs, ctx: attention(n.op, *xs, ctx, n.name, p))
REFERENCE.register("mlp")(lambda n, p, xs, ctx: mlp(n.op, p, xs[0]))
REFERENCE.register("moe")(lambda n, p, xs, ctx: moe(n.op, p, xs[0], ctx.margins))

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


def final_hidden(model: Model, weights, tokens, start_pos, caches, margins: list | None = None):
    """Run embedding and every layer; returns (normed hidden [n, H], caches).
    ``margins`` collects every MoE op's routing margins (``decode_step_margins``)."""
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
            rule = REFERENCE(node.op.kind, f"layers[{i}].{node.name}")
            env[node.outputs[0]] = rule(node, params, [env[n] for n in node.inputs], ctx)
        x = env[layer.output]
    x = rmsnorm(model.final_norm, {"weight": weights["final_norm.weight"]}, x)
    return x, caches


def lm_head(model: Model, weights) -> Array:
    """The LM head as [H, V]."""
    return weights["embed.weight"].T if model.tie_embeddings else weights["lm_head.weight"]


def decode_step(model: Model, weights, tokens, start_pos, caches, margins: list | None = None):
    """tokens [B, T] int32 at positions start_pos[b] + t -> (logits [B, T, V] f32, caches).
    ``margins`` collects every MoE op's routing margins (``decode_step_margins``)."""
    b, t = tokens.shape
    x, caches = final_hidden(model, weights, tokens, start_pos, caches, margins)
    logits = _apply_ops(model.logit_ops, "logit_ops", matmul(x, lm_head(model, weights)))
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
        if v.fmt.mxu == "fp8":       # code values (e4m3, e2m1, int4) are exact in f32
            return ScaledCodes(jnp.asarray(decode_np(v)), jnp.asarray(v.scales, jnp.float32),
                               v.dtype)
        return dequantize_packed(v)
    return {k: one(v) for k, v in weights.items()}
