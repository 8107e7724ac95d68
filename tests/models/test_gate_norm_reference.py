"""The reference's equations for Muse Spark's options against numpy written
from the published formulas (Hugging Face's modeling_muse_spark.py read as
equations, not code): the residual gate (floor included), the parameter-free
and input-scaled norms, and a whole prefill of the tiny Muse-like card, every
option at once, down to the logits of its padding ids."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from megakernel.ir.config import build
from megakernel.ir.graph import OpNode
from megakernel.ir.kind_elementwise import ChannelScale
from megakernel.ir.kind_residual_gate import ResidualGate
from megakernel.ir.ops import RMSNorm
from megakernel.models import reference as R
from megakernel.models.weights import init_weights
from tests.muse_like import MUSE_LIKE

# f32 reference against float64 numpy, relative to 1 + the largest |value|.
# Measured (this file's seeds): the single ops 4.2e-8 (gate), 6.6e-8 and
# 8.0e-8 (norms); the two-layer prefill's logits 6.9e-7.
OP_TOL = 1e-6
PREFILL_TOL = 3e-6


def _run(op, params, *xs):
    node = OpNode("n", op, tuple(f"x{i}" for i in range(len(xs))), ("y",))
    rule = R.REFERENCE(op.kind, "n")
    return np.asarray(rule(node, params, [jnp.asarray(x, jnp.float32) for x in xs], None))


def _close(got, want, tol):
    err = np.max(np.abs(got - want)) / (1.0 + np.max(np.abs(want)))
    assert err <= tol, err


def np_gate(s, b, gate, temperature, floor):
    u = gate / temperature
    beta = 1.0 / (1.0 + np.exp(-u))
    alpha = np.sqrt(np.maximum((1.0 / (1.0 + np.exp(u))) * (1.0 + beta), floor))
    return alpha * s + beta * b


def np_rms(x, eps, scale=None):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if scale is None else y * scale


def test_the_residual_gate_including_where_its_floor_binds():
    rng = np.random.default_rng(0)
    s, b = rng.standard_normal((2, 3, 8))
    # u = gate / 0.3: 8 and 12 make sigmoid(-u)(1 + beta) < 1e-3 (the floor binds)
    gate = 0.3 * np.array([-12.0, -3.0, -0.5, 0.0, 0.5, 3.0, 8.0, 12.0])
    got = _run(ResidualGate(8, 0.3), {"gate": jnp.asarray(gate, jnp.float32)}, s, b)
    want = np_gate(s, b, gate, 0.3, 1e-3)
    _close(got, want, OP_TOL)
    beta = 1.0 / (1.0 + np.exp(-gate[-2:] / 0.3))
    assert np.allclose(got[:, -2:], np.sqrt(1e-3) * s[:, -2:] + beta * b[:, -2:], atol=1e-6)


def test_parameter_free_and_input_scaled_norms():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 128)), 0.1 * rng.standard_normal(128)
    heads = _run(RMSNorm(64, 1e-5, weight=False), {}, x)
    _close(heads, np_rms(x.reshape(3, 2, 64), 1e-5).reshape(3, 128), OP_TOL)
    scaled = _run(ChannelScale(128, True), {"weight": jnp.asarray(w, jnp.float32)}, x)
    normed = _run(RMSNorm(128, 1e-8, weight=False), {}, scaled)
    _close(normed, np_rms(x * (1.0 + w), 1e-8), OP_TOL)


def _rope(x, pos, theta):
    """Rotate-half RoPE of [T, heads, D] at positions pos [T]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None, None] * inv[None, None, :]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x2 * np.cos(ang) + x1 * np.sin(ang)], axis=-1)


def _attention(c, w, p, hn, window, rotary):
    t, d, hq, hkv = hn.shape[0], c.head_dim, c.num_q_heads, c.num_kv_heads
    q = np_rms((hn @ w[p + "q_proj.weight"]).reshape(t, hq, d), c.norm_eps)
    k = np_rms((hn @ w[p + "k_proj.weight"]).reshape(t, hkv, d), c.norm_eps)
    v = (hn @ w[p + "v_proj.weight"]).reshape(t, hkv, d)
    pos = np.arange(t, dtype=np.float64)
    if rotary:
        q, k = _rope(q, pos, c.rope_theta), _rope(k, pos, c.rope_theta)
    kv = np.arange(hq) // (hq // hkv)                       # each query head's KV head
    scores = np.einsum("thd,shd->hts", q, k[:, kv]) * c.softmax_scale
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[None, :] > pos[:, None] - window
    scores = np.where(visible[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    o = np_rms(np.einsum("hts,shd->thd", probs, v[:, kv]), c.norm_eps).reshape(t, hq * d)
    o = o / (1.0 + np.exp(-(hn @ w[p + "gate_proj.weight"])))      # the output gate
    return o @ w[p + "o_proj.weight"]


def muse_prefill(c, w, ids):
    """Logits [T, V] of one sequence, every Muse Spark option of the card."""
    silu = lambda z: z / (1.0 + np.exp(-z))  # noqa: E731
    x = np_rms(w["embed.weight"][ids], c.norm_eps)
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        hn = np_rms(x, c.norm_eps, 1.0 + w[p + "input_norm.weight"])
        window = c.sliding_window if kind == "sliding_attention" else None
        o = np_rms(_attention(c, w, p, hn, window, kind not in c.nope_layer_types),
                   c.post_norm_eps)
        x = np_gate(x, o, w[p + "attn_residual.gate"], c.residual_gate_temperature, 1e-3)
        hn = np_rms(x, c.norm_eps, 1.0 + w[p + "post_norm.weight"])
        f = (silu(hn @ w[p + "mlp.gate"]) * (hn @ w[p + "mlp.up"])) @ w[p + "mlp.down"]
        f = np_rms(f * (1.0 + w[p + "post_ffn_norm.weight"]), c.post_norm_eps)
        x = np_gate(x, f, w[p + "ffn_residual.gate"], c.residual_gate_temperature, 1e-3)
    plain = c.final_norm_offset is False or (c.final_norm_offset is None and not c.norm_offset)
    x = np_rms(x, c.norm_eps, w["final_norm.weight"] + (0.0 if plain else 1.0))
    z = x @ w["lm_head.weight"] * c.final_logit_scale
    z = c.final_logit_softcap * np.tanh(z / c.final_logit_softcap)
    z[:, c.vocab_used:] = -np.inf
    return z


# None: the final norm is (1 + w) as the block norms; False: Muse Spark's plain w.
@pytest.mark.parametrize("final_norm_offset", [None, False])
def test_a_prefill_of_the_muse_like_card_follows_the_equations(final_norm_offset):
    card = dataclasses.replace(MUSE_LIKE, final_norm_offset=final_norm_offset)
    model = build(card)
    host = init_weights(model, seed=2)
    ids = np.random.default_rng(3).integers(0, card.vocab_size, (1, 12)).astype(np.int32)
    logits, _ = R.decode_step_jit(model, R.as_jax(host), jnp.asarray(ids),
                                  jnp.zeros(1, jnp.int32), R.init_caches(model, 1))
    got = np.asarray(logits)[0]
    want = muse_prefill(card, {k: v.astype(np.float64) for k, v in host.items()}, ids[0])
    used = card.vocab_used
    assert np.all(np.isneginf(got[:, used:]))
    _close(got[:, :used], want[:, :used], PREFILL_TOL)
    assert got.argmax(-1).max() < used      # greedy never picks a padding id
