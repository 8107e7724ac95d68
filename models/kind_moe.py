"""Reference function and weight init of mixture of experts (ir/kind_moe.py):
the router (softmax or sigmoid scores, correction bias, DeepSeek's groups),
then every expert on every row combined with the router's weights, plus the
shared experts; ``route`` records each row's routing margin for the checks'
near-tie rule (reference.decode_step_margins).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel import activations
from megakernel.ir.ops import Scoring
from megakernel.models.kind_expert_combine import slot_norm
from megakernel.models.reference import REFERENCE, Array, activation, gated_ffn, matmul
from megakernel.models.weights import INIT


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


def route(op, p, x, margins: list | None = None) -> tuple[Array, Array]:
    """Router of the router's input x: (expert ids [n, k], combine weights
    [n, k]) for every row. ``margins`` collects each row's routing margin
    (``selection_margin``). An f32 router (``router_f32``) reads x unrounded."""
    logits = matmul(x, p["router"])
    if op.router_logit_scale != 1.0:         # Muse Spark: logits * 2^-2.5, in f32
        logits = logits * op.router_logit_scale
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
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + op.renormalize_eps)
    return ids, weights * op.routed_scaling


def selection_margin(select: Array, k: int) -> Array:
    """[n]: how far each row's k-th best score is above its (k+1)-th, i.e. how
    much rounding it takes to pick another set (inf when nothing is left out)."""
    if k >= select.shape[-1]:
        return jnp.full(select.shape[:-1], jnp.inf, jnp.float32)
    best = jax.lax.top_k(select, k + 1)[0]
    return jnp.where(jnp.isfinite(best[:, k]), best[:, k - 1] - best[:, k], jnp.inf)


def expert_output_norm(op, w, y):
    """Each expert's output y [..., hidden] normalised in the op
    (``expert_output_norm``; the combine's ``slot_norm`` with the op's fields)."""
    return slot_norm(w, y, op.expert_output_norm_eps, op.expert_output_norm_input_scaled,
                     op.expert_output_norm_offset)


def moe(op, p, x, margins: list | None = None, router_x=None):
    """Every expert on every row, combined with the router's weights (zero for
    unselected experts): slow, and obviously equal to the routed sum. The
    router reads ``router_x`` (the op's second input), else x."""
    ids, routed_w = route(op, p, x if router_x is None else router_x, margins)
    combine = jnp.zeros((x.shape[0], op.num_experts), jnp.float32)
    combine = combine.at[jnp.arange(x.shape[0])[:, None], ids].add(routed_w)
    weights = [p["experts_gate"], p["experts_up"], p["experts_down"]]
    if op.expert_bias:
        weights += [p["experts_gate_bias"], p["experts_up_bias"], p["experts_down_bias"]]
    per_expert = jax.vmap(lambda *w: expert_ffn(op, x, *w))(*weights)      # [E, n, H]
    if op.per_slot:     # each row's picks by ascending id, unweighted, and their weights
        order = jnp.argsort(ids, axis=-1)
        ids, picked = (jnp.take_along_axis(a, order, axis=-1) for a in (ids, routed_w))
        slots = jnp.swapaxes(per_expert, 0, 1)[jnp.arange(x.shape[0])[:, None], ids]
        return slots.reshape(x.shape[0], -1), picked
    if op.expert_output_norm:
        per_expert = expert_output_norm(op, p["expert_output_norm"], per_expert)
    out = jnp.einsum("ne,enh->nh", combine, per_expert, precision=jax.lax.Precision.HIGHEST)
    return with_shared(op, p, x, out)


def with_shared(op, p, x, routed):
    """The routed experts' output [n, H] plus the shared experts' (if any)."""
    if not op.num_shared_experts:
        return routed
    shared = gated_ffn(op.activation, x, p["shared_gate"], p["shared_up"], p["shared_down"])
    if op.shared_expert_gate:       # Qwen3-Next: sigmoid(x . w) per token
        shared = shared * jax.nn.sigmoid(matmul(x, p["shared_expert_gate"][:, None]))
    return routed + shared


REFERENCE.register("moe")(lambda n, p, xs, ctx: moe(
    n.op, p, xs[0], ctx.margins, xs[1] if n.op.router_dim else None))
INIT.register("moe")({
    "router": ("matrix", 0), "router_bias": ("route_bias", 0),
    "experts_gate": ("matrix", 1), "experts_up": ("matrix", 1),
    "experts_down": ("residual", 1), "shared_gate": ("matrix", 0),
    "shared_up": ("matrix", 0), "shared_down": ("residual", 0),
    "shared_expert_gate": ("matrix", 0),
    "router_logit_bias": ("route_bias", 0), "experts_gate_bias": ("bias", 0),
    "experts_up_bias": ("bias", 0), "experts_down_bias": ("bias", 0),
    "expert_output_norm": ("scale", 0)})
