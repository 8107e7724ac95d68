"""Attention and rotary embedding: the ``Rope`` and ``Attention`` op kinds,
and the card's attention mixers.

After import: both classes are registered in ``OP_KINDS`` (kinds ``rope``
and ``attention``; ir/ops.py re-exports them, so ``megakernel.ir.ops.Attention``
still names them), and the card's ``full_attention`` and ``sliding_attention``
mixers (their block and size formula) in ``MIXERS`` (ir/card.py).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from megakernel.ir import limits, sizes
from megakernel.ir.blocks import LayerBuilder, norm, residual
from megakernel.ir.card import MIXERS, Mixer, ModelConfig
from megakernel.ir.kind_elementwise import Activate, Mul
from megakernel.ir.kind_norm_parts import MeanSquare, RMSScale
from megakernel.ir.op_base import OP_KINDS, Linear, Op, _expect_shapes
from megakernel.ir.op_fields import Activation, HeadDim, Heads, Positions, _fail
from megakernel.ir.rope_scaling import RopeScaling, rope_attention_factor, rope_inv_freq
from megakernel.ir.schema import Bool, Float, Int, node
from megakernel.ir.types import APPEND, ParamSpec, StateSpec


@node
class Rope(Op):
    """Rotary position embedding (rotate-half layout) of the first ``rotary_dim``
    features of each of ``num_heads`` heads of ``head_dim``."""

    kind: ClassVar[str] = "rope"
    num_heads: Heads
    head_dim: HeadDim
    theta: Float(*limits.ROPE_THETA, open_low=True) = 10000.0
    rotary_dim: Int(0, limits.MAX_HEAD_DIM) = 0          # 0 means the full head
    scaling: RopeScaling | None = None

    def __post_init__(self):
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        rd = self.rotary_dim
        if not (rd <= self.head_dim and rd % 2 == 0):
            raise _fail("rotary_dim", f"rotary_dim={rd!r} must be even and in "
                        f"(0, head_dim={self.head_dim}]")

    def inv_freq(self) -> np.ndarray:
        """Per-pair inverse frequencies [rotary_dim // 2], float64, scaling applied."""
        return rope_inv_freq(self.theta, self.rotary_dim, self.scaling)

    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (YaRN's attention scaling; else 1)."""
        return rope_attention_factor(self.scaling)

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.num_heads * self.head_dim,),))
        return inputs


@node
class Attention(Op):
    """Causal GQA attention of T new tokens per sequence over a KV cache.

    Inputs q [Hq*D], k [Hkv*D], v [Hkv*D] per token; the new k, v are written to
    the cache at positions p..p+T-1 first, then every query attends to cache
    positions j <= its own (and j > pos - sliding_window when set).
    ``logit_softcap`` c: scaled scores s become c * tanh(s / c) before the mask
    (Gemma 2). ``sinks``: a learned logit per query head joins the softmax's
    denominator only, ``p_j = e^s_j / (sum_k e^s_k + e^sink)`` (gpt-oss)."""

    kind: ClassVar[str] = "attention"
    LIBRARY: ClassVar[str | None] = "attention"
    STATE_ACCESS: ClassVar[frozenset[str]] = frozenset({APPEND})
    num_q_heads: Heads
    num_kv_heads: Heads
    head_dim: HeadDim
    softmax_scale: Float(*limits.SOFTMAX_SCALE) = 0.0   # 0 means 1/sqrt(head_dim)
    sliding_window: Positions | None = None
    logit_softcap: Float(0.0, limits.MAX_SCALE, open_low=True) | None = None
    sinks: Bool = False

    def __post_init__(self):
        if self.num_q_heads % self.num_kv_heads:
            raise _fail("num_q_heads", f"num_q_heads={self.num_q_heads} is not a "
                        f"multiple of num_kv_heads={self.num_kv_heads}")
        if self.softmax_scale == 0:
            object.__setattr__(self, "softmax_scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def params(self, dtype):
        return {"sinks": ParamSpec((self.num_q_heads,), dtype)} if self.sinks else {}

    def state(self, batch, max_seq_len, dtype):
        rows = StateSpec((batch, max_seq_len, self.num_kv_heads, self.head_dim), dtype, APPEND)
        return {"k": rows, "v": rows}

    def rows_read(self, valid, tokens):
        if self.sliding_window is None:
            return valid
        return min(valid, self.sliding_window + tokens - 1)

    def infer(self, inputs):
        q = (self.num_q_heads * self.head_dim,)
        kv = (self.num_kv_heads * self.head_dim,)
        _expect_shapes(self, inputs, (q, kv, kv))
        return (q,)


for _cls in (Rope, Attention):
    OP_KINDS.register(_cls.kind)(_cls)


def _qk_norm(c: ModelConfig, b: LayerBuilder, t: str, which: str) -> str:
    """Per-head norm (parameter-free without ``qk_norm_weight``), or
    (``qk_norm_all_heads``) one over the whole projection, in two parts so
    that its mean of squares can be summed over cores."""
    if not c.qk_norm_all_heads:
        return b.add(f"{which}_norm", norm(c, c.head_dim, weight=c.qk_norm_weight), (t,),
                     f"{which}_normed")
    width = b.tensors[t].shape[0]
    ms = b.add(f"{which}_ms", lambda: MeanSquare(width), (t,), f"{which}_ms")
    return b.add(f"{which}_norm", lambda: RMSScale(width, c.norm_eps, c.norm_offset), (t, ms),
                 f"{which}_normed")


def _attention_block(c: ModelConfig, b: LayerBuilder, x: str, mixer: str, window,
                     local: bool) -> str:
    """The card's attention mixer: input norm, q (and output gate), k, v, their
    norms and rotations (none in ``nope_layer_types`` layers), attention, its
    output's per-head norm and gate, o_proj, post norm and the residual."""
    h, d = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_q_heads * d, c.num_kv_heads * d
    theta, scaling = c.rope_theta, c.rope_scaling
    if local and c.sliding_rope_theta is not None:
        theta, scaling = c.sliding_rope_theta, None
    rope = lambda heads: lambda: Rope(heads, d, theta, c.rotary_dim, scaling)  # noqa: E731

    hn = b.add("input_norm", norm(c, h), (x,), "h_attn") if c.pre_norms else x
    q = b.add("q_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "q")
    if c.attn_output_gate:    # Hugging Face interleaves it with q_proj's rows per head
        gate = b.add("gate_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "gate")
    k = b.add("k_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "k")
    v = b.add("v_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "v")
    if c.qk_norm:
        q, k = _qk_norm(c, b, q, "q"), _qk_norm(c, b, k, "k")
    if mixer not in c.nope_layer_types:
        q = b.add("q_rope", rope(c.num_q_heads), (q,), "q_rot")
        k = b.add("k_rope", rope(c.num_kv_heads), (k,), "k_rot")
    o = b.add("attention", lambda: Attention(c.num_q_heads, c.num_kv_heads, d,
                                             c.softmax_scale, window, c.attn_logit_softcap,
                                             c.attention_sinks),
              (q, k, v), "attn")
    if c.attn_output_norm:      # Muse Spark's order: per-head norm, then the gate
        o = b.add("o_norm", norm(c, d, weight=False), (o,), "attn_normed_heads")
    if c.attn_output_gate:
        gate = b.add("gate_act", lambda: Activate(Activation.SIGMOID), (gate,), "gate_sig")
        o = b.add("attn_gate", Mul, (o, gate), "attn_gated")
    o = b.add("o_proj", lambda: Linear(q_dim, h, c.o_bias), (o,), "attn_out")
    return residual(c, b, x, o, "attn", "x_mid")


def _attention_sizes(c: ModelConfig) -> tuple[int, int]:
    """(weights, K/V-cache bytes of one sequence) of one attention mixer: its
    block norms, q, k, v, o, biases, sinks, q/k norms and output gate."""
    item, h, d = sizes.item_size(c), c.hidden_size, c.head_dim
    q, kv = c.num_q_heads * d, c.num_kv_heads * d
    attn = sizes.block_norms(c) + h * q + 2 * h * kv + q * h
    attn += (q + 2 * kv) * c.qkv_bias + h * c.o_bias + c.num_q_heads * c.attention_sinks
    attn += ((q + kv) if c.qk_norm_all_heads else 2 * d) * c.qk_norm * c.qk_norm_weight
    attn += (h * q + q * c.qkv_bias) * c.attn_output_gate
    return attn * item, 2 * c.max_seq_len * kv * item


# Without layer_types every layer is full attention, windowed by the card's
# sliding_window when it has one; with them, only sliding_attention layers are.
MIXERS.register("full_attention")(Mixer(
    "", lambda c, b, x: _attention_block(c, b, x, "full_attention", c.sliding_window
                                         if c.layer_types is None else None, False),
    _attention_sizes, rotary=True))
MIXERS.register("sliding_attention")(Mixer(
    "sliding", lambda c, b, x: _attention_block(c, b, x, "sliding_attention",
                                                c.sliding_window, True),
    _attention_sizes, rotary=True))
