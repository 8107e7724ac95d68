"""Attention and rotary embedding: the ``Rope`` and ``Attention`` op kinds.

After import: both classes are registered in ``OP_KINDS`` (kinds ``rope``
and ``attention``); ir/ops.py re-exports them, so ``megakernel.ir.ops.Attention``
still names them.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from megakernel.ir import limits
from megakernel.ir.op_base import OP_KINDS, Op, _expect_shapes
from megakernel.ir.op_fields import HeadDim, Heads, Positions, _fail
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
