"""Reference function and weight init of Gated DeltaNet (ir/kind_gdn.py).

The recurrent form, one token after another, written from the equations in
the op's docstring (and tests/fixtures/hf/README.md, checked against
transformers): a T-token step is literally T one-token updates, so the state
after each row is at hand (``delta_rule`` returns it; verify rows need it).
Activations are f32; the new raw q/k/v rows are rounded to the conv history's
dtype before the conv reads them, as the K/V caches are written before
attention reads them, so a T-token step equals T one-token steps exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.ir.kind_gdn import L2_EPS
from megakernel.models.reference import REFERENCE, WIRE_TOLERANCE, activation
from megakernel.models.weights import INIT

HI = jax.lax.Precision.HIGHEST
SECTIONS = ("q", "k", "v")

# Gated DeltaNet's L2-normed 16-wide heads and gated norms amplify the bf16
# wire's rounding. Measured (2026-12-04, tools/measure_wire.py: bf16 draws of
# hybrid_configs, 1-2 periods, batch 1-4, 1-4 tokens, 2 steps, kernel vs
# reference): 48 draws on 2 and 4 cores, logits <= 1.5e-2 of the scale but for
# two, 2.9e-2 (4 cores) and 4.9e-2 (2 cores, state 4.1e-2; the same plan on an
# f32 wire: 1.4e-3, routing margins all >= 4.7e-3). So 6e-2.
WIRE_TOLERANCE.register("gated_deltanet")(6e-2)


def causal_conv(w, hist, new):
    """Depthwise causal conv + SiLU of the new rows, and the next history.

    w [Kc, C] (tap Kc-1 is the current token); hist [B, Kc-1, C] raw rows;
    new [B, T, C] raw rows in hist's dtype -> (out [B, T, C] f32,
    hist after the step [B, Kc-1, C]: the last Kc-1 raw rows of hist | new)."""
    kc, t = w.shape[0], new.shape[1]
    seq = jnp.concatenate([hist, new], axis=1).astype(jnp.float32)       # [B, Kc-1+T, C]
    out = sum(w[j].astype(jnp.float32) * seq[:, j:j + t] for j in range(kc))
    return activation("silu", out), jnp.concatenate([hist, new], axis=1)[:, t:]


def l2norm(x):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def gates(p, b, a):
    """(beta, g) [..., HV] from the raw b and a projections."""
    beta = jax.nn.sigmoid(b)
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(
        a + p["dt_bias"].astype(jnp.float32))
    return beta, g


def delta_rule(state, q, k, v, beta, g, group: int):
    """The gated delta rule over T rows, one after another.

    state [B, HV, dk, dv] f32; q, k [B, T, HK, dk] (normalised, q scaled);
    v [B, T, HV, dv]; beta, g [B, T, HV]. Value head h reads key head
    h // group. Returns (o [B, T, HV, dv], states [T, B, HV, dk, dv]: the state
    after each row; the last is the one the step commits)."""
    outs, states = [], []
    for t in range(q.shape[1]):
        qt = jnp.repeat(q[:, t], group, axis=1)          # [B, HV, dk]
        kt = jnp.repeat(k[:, t], group, axis=1)
        state = state * jnp.exp(g[:, t])[..., None, None]
        u = jnp.einsum("bhk,bhkv->bhv", kt, state, precision=HI)
        delta = beta[:, t][..., None] * (v[:, t] - u)
        state = state + kt[..., :, None] * delta[..., None, :]
        outs.append(jnp.einsum("bhk,bhkv->bhv", qt, state, precision=HI))
        states.append(state)
    return jnp.stack(outs, axis=1), jnp.stack(states)


def gated_rmsnorm(o, weight, z, eps):
    """rmsnorm(o) over each head's dv features, times the plain weight, times silu(z)."""
    o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + eps)
    return o * weight.astype(jnp.float32) * activation("silu", z)


def gated_deltanet(op, p, xs, ctx, name):
    """One step of T tokens per sequence; updates the op's four states in ctx.caches."""
    bsz, t = ctx.batch, ctx.tokens
    hk, hv, dk, dv = op.num_key_heads, op.num_value_heads, op.key_dim, op.value_dim
    q, k, v, z, b, a = xs
    pre = f"{ctx.prefix}{name}."
    conv = {}
    for part, x in zip(SECTIONS, (q, k, v)):
        hist = ctx.caches[f"{pre}hist_{part}"]
        conv[part], ctx.caches[f"{pre}hist_{part}"] = causal_conv(
            p[f"conv_{part}"], hist, x.reshape(bsz, t, -1).astype(hist.dtype))
    qh = l2norm(conv["q"].reshape(bsz, t, hk, dk)) * dk ** -0.5
    kh = l2norm(conv["k"].reshape(bsz, t, hk, dk))
    vh = conv["v"].reshape(bsz, t, hv, dv)
    beta, g = gates(p, b.reshape(bsz, t, hv), a.reshape(bsz, t, hv))
    o, states = delta_rule(ctx.caches[f"{pre}recurrent"], qh, kh, vh, beta, g, op.group)
    ctx.caches[f"{pre}recurrent"] = states[-1]
    y = gated_rmsnorm(o, p["norm"], z.reshape(bsz, t, hv, dv), op.norm_eps)
    return y.reshape(bsz * t, hv * dv)


REFERENCE.register("gated_deltanet")(lambda n, p, xs, ctx: gated_deltanet(n.op, p, xs, ctx,
                                                                          n.name))

# Conv taps ~ N(0, 1/Kc) keep the conv output O(1); A_log ~ -1 + 0.5 N and
# dt_bias ~ 0.5 N give per-token decays exp(g) mostly in 0.4..0.95 (the HF
# fixtures' choice, tests/fixtures/hf/README.md), so the state neither
# vanishes nor saturates within a few steps; the gated norm's weight is a scale.
INIT.register("gated_deltanet")({
    "conv_q": ("matrix", 0), "conv_k": ("matrix", 0), "conv_v": ("matrix", 0),
    "A_log": ("log_decay", 0), "dt_bias": ("dt_bias", 0), "norm": ("scale", 0)})
