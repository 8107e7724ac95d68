"""Properties of the plain-JAX reference decode step."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from megakernel.ir.config import build
from megakernel.models import reference as R
from megakernel.models.weights import init_weights
from megakernel.testing import model_configs


@settings(max_examples=8)
@given(model_configs(max_layers=3, hidden_sizes=(128, 256), dtype="float32"),
       st.integers(1, 3), st.integers(2, 5), st.integers(0, 3))
def test_one_token_at_a_time_equals_prefill(config, batch, tokens, seed):
    model = build(config)
    weights = R.as_jax(init_weights(model, seed))
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(0, model.vocab_size, (batch, tokens)), jnp.int32)
    zero = jnp.zeros(batch, jnp.int32)
    full, full_caches = R.decode_step_jit(model, weights, ids, zero, R.init_caches(model, batch))

    caches, steps = R.init_caches(model, batch), []
    for t in range(tokens):
        logits, caches = R.decode_step_jit(model, weights, ids[:, t:t + 1], zero + t, caches)
        steps.append(logits)
    stepped = jnp.concatenate(steps, axis=1)

    # Padding ids (vocab_used) are -inf in both: the scale is the finite logits'.
    scale = float(jnp.max(jnp.where(jnp.isfinite(full), jnp.abs(full), 0.0)))
    np.testing.assert_allclose(stepped, full, atol=1e-4 * scale, rtol=0)
    for name in full_caches:
        np.testing.assert_allclose(caches[name], full_caches[name], atol=1e-5)


def test_per_sequence_start_positions_are_independent():
    """Row b of a batched decode equals decoding sequence b alone."""
    from megakernel.testing import replace
    from megakernel.ir.config import ModelConfig

    config = ModelConfig("m", 256, 128, 2, 4, 2, 64, 256, dtype="float32", max_seq_len=32)
    model = build(replace(config, sliding_window=5))
    w = R.as_jax(init_weights(model, 1))
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, 256, (2, 12)), jnp.int32)
    new = jnp.asarray(rng.integers(0, 256, (2, 2)), jnp.int32)
    start = jnp.asarray([7, 12], jnp.int32)
    _, caches = R.decode_step_jit(model, w, prompt, jnp.zeros(2, jnp.int32), R.init_caches(model, 2))
    batched, _ = R.decode_step_jit(model, w, new, start, caches)
    for b in range(2):
        _, c1 = R.decode_step_jit(model, w, prompt[b:b + 1, :int(start[b])],
                                  jnp.zeros(1, jnp.int32), R.init_caches(model, 1))
        alone, _ = R.decode_step_jit(model, w, new[b:b + 1], start[b:b + 1], c1)
        np.testing.assert_allclose(batched[b], alone[0], atol=1e-4)


def test_random_weights_keep_activations_order_one():
    from megakernel.ir.config import ModelConfig

    model = build(ModelConfig("deep", 256, 256, 24, 4, 2, 64, 512, dtype="float32", max_seq_len=16))
    w = R.as_jax(init_weights(model, 0))
    x, _ = R.final_hidden(model, w, jnp.zeros((1, 4), jnp.int32), jnp.zeros(1, jnp.int32),
                          R.init_caches(model, 1))
    logits, _ = R.decode_step_jit(model, w, jnp.zeros((1, 4), jnp.int32), jnp.zeros(1, jnp.int32),
                                  R.init_caches(model, 1))
    assert 0.3 < float(jnp.std(logits)) < 3.0
    assert bool(jnp.all(jnp.isfinite(logits)))
