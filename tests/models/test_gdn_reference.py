"""The Gated DeltaNet reference: a T-token step is T one-token steps, the delta
rule's per-row states are the states of those steps, and cards build the
hybrid graph (GDN and gated full-attention layers, one stack per period)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from megakernel.errors import IRError
from megakernel.ir.config import LinearAttentionConfig, ModelConfig, build
from megakernel.ir.kind_gdn import GatedDeltaNet
from megakernel.models import kind_gdn
from megakernel.models import reference as R
from megakernel.models.weights import init_weights

HYBRID = ModelConfig(
    name="tiny-hybrid", vocab_size=256, hidden_size=128, num_layers=8, num_q_heads=2,
    num_kv_heads=1, head_dim=64, intermediate_size=256, norm_offset=True, qk_norm=True,
    rotary_dim=16, attn_output_gate=True, dtype="float32", max_seq_len=64,
    layer_types=("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3
    + ("full_attention",), linear_attention=LinearAttentionConfig(2, 4, 32, 32, 4))

# Measured: a 5-token step and five 1-token steps differ by at most 1.4e-6 in
# the logits (scale 3.9) and 1.1e-6 in the states: only the order of float32
# sums in matmuls of 10 versus 2 rows differs.
TOL = 1e-5


def test_hybrid_card_builds_one_stack_of_a_period():
    model = build(HYBRID)
    assert [(s.start, s.count, s.period) for s in model.stacks] == [(0, 2, 4)]
    body = model.stacks[0].body
    assert [layer.kind for layer in body] == ["linear_dense"] * 3 + ["dense"]
    gdn = body[0].node("gdn").op
    assert isinstance(gdn, GatedDeltaNet) and gdn.group == 2
    names = [n.name for n in body[3].nodes]
    assert names.index("gate_proj") < names.index("attention") < names.index("attn_gate") \
        < names.index("o_proj")
    specs = model.cache_specs(3)
    assert specs["layers.0.gdn.recurrent"].shape == (3, 4, 32, 32)
    assert specs["layers.0.gdn.recurrent"].dtype.value == "float32"
    assert specs["layers.0.gdn.hist_v"].shape == (3, 3, 128)
    assert {s.access for k, s in specs.items() if ".gdn." in k} == {"whole"}


def test_a_t_token_step_equals_t_one_token_steps():
    model = build(HYBRID)
    w = R.as_jax(init_weights(model, seed=1))
    b, t = 2, 5
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (b, t)), jnp.int32)
    start = jnp.array([0, 3], jnp.int32)
    caches = R.init_caches(model, b)
    whole, after = R.decode_step(model, w, tokens, start, caches)
    steps, one = [], caches
    for i in range(t):
        logits, one = R.decode_step(model, w, tokens[:, i:i + 1], start + i, one)
        steps.append(logits)
    np.testing.assert_allclose(whole, jnp.concatenate(steps, axis=1), atol=TOL, rtol=0)
    for name in after:
        np.testing.assert_allclose(np.asarray(after[name], np.float32),
                                   np.asarray(one[name], np.float32), atol=TOL, rtol=0,
                                   err_msg=name)
    assert float(jnp.max(jnp.abs(after["layers.4.gdn.recurrent"]))) > 0.01


def test_delta_rule_states_per_row_are_the_one_token_states():
    rng = np.random.default_rng(2)
    b, t, hk, hv, dk, dv = 2, 4, 2, 4, 8, 8
    r = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    state = r(b, hv, dk, dv)
    q = kind_gdn.l2norm(r(b, t, hk, dk)) * dk ** -0.5
    k = kind_gdn.l2norm(r(b, t, hk, dk))
    v, beta, g = r(b, t, hv, dv), jnp.abs(r(b, t, hv)) % 1, -jnp.abs(r(b, t, hv))
    outs, rows = kind_gdn.delta_rule(state, q, k, v, beta, g, group=2)
    s = state
    for i in range(t):
        o, one = kind_gdn.delta_rule(s, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1],
                                     beta[:, i:i + 1], g[:, i:i + 1], group=2)
        np.testing.assert_allclose(rows[i], one[0], atol=1e-6, rtol=0)
        np.testing.assert_allclose(outs[:, i], o[:, 0], atol=1e-6, rtol=0)
        s = one[0]


def test_value_heads_share_consecutive_key_heads():
    """Value head h reads key head h // group (repeat_interleave, not tile)."""
    b, hk, dk, dv = 1, 2, 4, 4
    state = jnp.zeros((b, 4, dk, dv))
    k = jnp.zeros((b, 1, hk, dk)).at[0, 0, 0, 0].set(1.0)   # only key head 0 is non-zero
    v = jnp.ones((b, 1, 4, dv))
    _, rows = kind_gdn.delta_rule(state, k, k, v, jnp.ones((b, 1, 4)), jnp.zeros((b, 1, 4)), 2)
    touched = [bool(jnp.any(rows[0, 0, h] != 0)) for h in range(4)]
    assert touched == [True, True, False, False]


def test_cards_refuse_mismatched_hybrid_fields():
    with pytest.raises(IRError, match="linear_attention is not set"):
        dataclasses.replace(HYBRID, linear_attention=None)
    with pytest.raises(IRError, match="no layer_types entry is linear_attention"):
        dataclasses.replace(HYBRID, layer_types=None)
    with pytest.raises(IRError, match=r"layers\.0\.gdn.*num_value_heads=3 is not a multiple"):
        build(dataclasses.replace(HYBRID, linear_attention=LinearAttentionConfig(2, 3, 32, 32)))
