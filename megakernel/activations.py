"""The one activation table: the reference and every kernel helper call ``apply``.

Each entry is written with primitives Mosaic lowers (exact GELU uses ``erf``;
``jax.nn.gelu(approximate=False)`` goes through ``erfc``, which Mosaic
rejects), so what the reference computes is what the kernel computes, and
every activation the IR names compiles for TPU (tests/backends/test_aot.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from megakernel.errors import EmitError


def _silu(x):
    return x * jax.nn.sigmoid(x)


def _gelu(x):
    return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


ACTIVATIONS = {
    "silu": _silu,
    "gelu": _gelu,              # exact (erf)
    "gelu_tanh": _gelu_tanh,    # tanh approximation
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


def apply(kind, x):
    """``kind`` (an ``ir.ops.Activation`` or its value) applied to ``x``."""
    name = getattr(kind, "value", kind)
    try:
        fn = ACTIVATIONS[name]
    except KeyError:
        raise EmitError(f"activation {name!r} has no entry; known: {sorted(ACTIVATIONS)}",
                        path="activations") from None
    return fn(x)


def clamped_swiglu(gate, up, limit: float, alpha: float):
    """gpt-oss's gated unit: gate clamped above, up clamped both ways and
    offset by 1, gate * sigmoid(alpha * gate) (transformers' GptOssExperts)."""
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    return (up + 1.0) * (gate * jax.nn.sigmoid(gate * alpha))


def softcap(x, cap: float):
    """cap * tanh(x / cap): Gemma 2's soft-capping, for the reference and the kernel."""
    return cap * jnp.tanh(x * (1.0 / cap))


def residual_gate(s, b, gate, temperature: float, floor: float):
    """alpha * s + beta * b with u = gate / temperature, beta = sigmoid(u),
    alpha = sqrt(max(sigmoid(-u) * (1 + beta), floor)): Muse Spark's residual
    gate (ir/kind_residual_gate.py), for the reference and the kernel; gate is
    f32 [.., dim], broadcast over the rows of s and b."""
    u = gate / temperature
    beta = jax.nn.sigmoid(u)
    alpha = jnp.sqrt(jnp.maximum(jax.nn.sigmoid(-u) * (1.0 + beta), floor))
    return alpha * s + beta * b
