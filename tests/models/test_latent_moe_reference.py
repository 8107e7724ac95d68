"""The reference's latent MoE FFN (models/kind_moe.py and the nodes around the
op) against an independent NumPy transcription, in float64, of each form's
published equations (issue 34 item 1: Hugging Face muse_spark's
MuseSparkMoE; Kimi K3's latent MoE as Inferact's notes of its checkpoint state
it). Written from the equations, not from the reference:

Muse Spark: s = sigmoid((x @ W_r) * c); pick top-k of s + b; w = s_k / (sum +
1e-15) * r; x_l = rms(x @ W_pre) * (1 + w_pre); y_k = rms(round((E_k(x_l)) *
(1 + w_post)), 1e-8); out = (sum_k w_k y_k) @ W_post.
Kimi K3: s = sigmoid(x @ W_r); pick top-k of s + b; w = s_k / sum * r;
m = sum_k w_k E_k(x @ W_down); out = (rms(m) * w_norm) @ W_up + Shared(x).
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from megakernel.ir.config import build
from megakernel.ir.ops import MoE
from megakernel.models import kind_moe
from megakernel.models import reference as R
from megakernel.models.weights import init_weights
from tests.latent_moe_cards import KIMI, MUSE

# float32 reference against float64 NumPy, relative to the output's largest
# value: measured 5.5e-7 (Muse) and 6.0e-7 (Kimi) over these 7 rows.
TOL = 2e-6


def _ffn_reference(model, weights, hn):
    """The reference's FFN nodes of the last layer (after post_norm, up to
    the residual add) on the normed input ``hn`` [n, H]."""
    layer, i = model.layers[-1], len(model.layers) - 1
    names = [n.name for n in layer.nodes]
    ctx = R._Ctx(1, hn.shape[0], jnp.zeros((1, hn.shape[0]), jnp.int32), {}, f"layers.{i}.")
    env = {"h_ffn": jnp.asarray(hn)}
    for node in layer.nodes[names.index("post_norm") + 1:-1]:
        params = {k.split(".")[-1]: weights[f"layers.{i}.{k}"]
                  for k in layer.params(model.dtype) if k.startswith(node.name + ".")}
        out = R.REFERENCE(node.op.kind, node.name)(
            node, params, [env[t] for t in node.inputs], ctx)
        env.update(zip(node.outputs, out if len(node.outputs) > 1 else (out,)))
    return np.asarray(env["ffn_out"], np.float64)


def _rms(v, eps):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)


def _silu(v):
    return v / (1 + np.exp(-v))


def _route(x, w, moe, scale=1.0, eps=0.0):
    """(ids [k], weights [k]) of one row: sigmoid scores, biased selection
    (ties to the lowest index), unbiased weights renormalised."""
    s = 1 / (1 + np.exp(-(x @ w["moe.router"]) * scale))
    ids = np.argsort(-(s + w["moe.router_bias"]), kind="stable")[:moe.top_k]
    return ids, s[ids] / (s[ids].sum() + eps) * moe.routed_scaling


def _expert(x, w, e):
    g, u, d = (w[f"moe.experts_{p}"][e] for p in ("gate", "up", "down"))
    return (_silu(x @ g) * (x @ u)) @ d


def _numpy_muse(hn, w, card):
    moe, out = card.moe, []
    for x in hn:
        ids, wts = _route(x, w, moe, moe.router_logit_scale, moe.renormalize_eps)
        xl = x @ w["pre_expert_proj.weight"]
        xl = _rms(xl, card.norm_eps) * (1 + w["pre_expert_norm.weight"])
        m = 0
        for e, wt in zip(ids, wts):
            y = _expert(xl, w, e) * (1 + w["expert_combine.weight"])    # round: f32 no-op
            m = m + wt * _rms(y, moe.expert_output_norm_eps)
        out.append(m @ w["post_expert_proj.weight"])
    return np.stack(out)


def _numpy_kimi(hn, w, card):
    moe, out = card.moe, []
    for x in hn:
        ids, wts = _route(x, w, moe)
        xl = x @ w["pre_expert_proj.weight"]
        m = sum(wt * _expert(xl, w, e) for e, wt in zip(ids, wts))
        m = _rms(m, card.norm_eps) * w["expert_output_norm.weight"]
        g, u, d = (w[f"shared_experts.{p}"] for p in ("gate", "up", "down"))
        out.append(m @ w["post_expert_proj.weight"] + (_silu(x @ g) * (x @ u)) @ d)
    return np.stack(out)


@pytest.mark.parametrize("card, numpy_form", [(MUSE, _numpy_muse), (KIMI, _numpy_kimi)],
                         ids=["muse", "kimi"])
def test_the_reference_is_each_forms_equations(card, numpy_form):
    model = build(card)
    host = init_weights(model, seed=3)
    hn = np.random.default_rng(4).standard_normal((7, card.hidden_size)).astype(np.float32)
    got = _ffn_reference(model, R.as_jax(host), hn)
    last = f"layers.{card.num_layers - 1}."
    w = {k[len(last):]: np.asarray(v, np.float64) for k, v in host.items() if k.startswith(last)}
    want = numpy_form(hn.astype(np.float64), w, card)
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(got, want, atol=TOL * scale, rtol=0)


def test_the_input_scaled_norm_rounds_the_scaled_output_to_the_model_dtype():
    """In bf16, Muse Spark's post_expert_norm rounds y * (1 + w) to bf16
    before the RMS: the reference's result is NumPy's with that rounding
    (to f32 precision), and differs from the unrounded one."""
    op = MoE(128, 4, 2, 64, expert_output_norm=True, expert_output_norm_eps=1e-8,
             expert_output_norm_input_scaled=True, expert_output_norm_offset=True)
    rng = np.random.default_rng(5)
    y = rng.standard_normal((3, 128)).astype(np.float32) * 3
    w = (0.1 * rng.standard_normal(128)).astype(ml_dtypes.bfloat16)
    got = np.asarray(kind_moe.expert_output_norm(op, jnp.asarray(w), jnp.asarray(y)))
    scaled = y * (1 + w.astype(np.float32))
    rounded = scaled.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_allclose(got, _rms(rounded, 1e-8), atol=1e-6, rtol=0)  # measured 2.7e-7
    # unrounded it would be off by 9.0e-3 here
    assert np.max(np.abs(got - _rms(scaled.astype(np.float64), 1e-8))) > 1e-3
